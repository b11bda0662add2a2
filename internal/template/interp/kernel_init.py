# Run by every Python kernel of SPACE's code interpreter at start
# (IPKernelApp.exec_files): registers the "e2b/data" display format the
# @e2b/code-interpreter SDK reads as Result.data (a DataFrame's columns),
# and takes two costs off every run (an empty flush, a signature lookup).
import math
import sys

import IPython
from IPython.core.formatters import BaseFormatter
from traitlets import ObjectName, Unicode


def _plain(v, pandas):
    if isinstance(v, pandas.Timestamp):
        return v.isoformat()
    if isinstance(v, float) and math.isnan(v):
        return None  # JSON has no NaN
    if hasattr(v, "item"):  # numpy scalars
        try:
            return _plain(v.item(), pandas)
        except (TypeError, ValueError):
            pass
    return v


class SpaceDataFormatter(BaseFormatter):
    format_type = Unicode("e2b/data")
    print_method = ObjectName("_repr_e2b_data_")
    _return_type = (dict, str)

    def __call__(self, obj):
        # Only a DataFrame (which needs pandas already imported): other
        # results must not pay for importing pandas.
        pandas = sys.modules.get("pandas")
        if pandas is None or not isinstance(obj, pandas.DataFrame):
            return super().__call__(obj)
        cols = obj.to_dict(orient="list")
        return {str(k): [_plain(v, pandas) for v in vals] for k, vals in cols.items()}


_ip = IPython.get_ipython()
if _ip is not None:
    _ip.display_formatter.formatters["e2b/data"] = SpaceDataFormatter(parent=_ip.display_formatter)
del _ip


def _skip_empty_flush():
    """ipykernel (6.17, Debian bookworm) flushes stdout and stderr before
    and after every displayed value and before every execute_reply, and
    each flush waits for two round trips through its IOPub thread even
    when nothing was written: six thread wake-ups for `x+1`, most of a
    warm run's time on a busy host. A flush with nothing buffered, no
    flush pending and none running (the timed flush runs in the IOPub
    thread) has nothing to send, so it returns at once; anything written
    still goes out through the original flush, before what follows it."""
    try:
        from ipykernel.iostream import OutStream
    except ImportError:
        return
    if getattr(OutStream.flush, "_space_skip_empty", False):
        return
    needed = ("_flush", "_flush_pending", "_subprocess_flush_pending", "_buffer", "_buffer_lock", "_is_master_process", "echo")
    if not all(hasattr(s, a) for s in (sys.stdout, sys.stderr) if isinstance(s, OutStream) for a in needed):
        return  # another ipykernel: leave its flush alone
    orig_flush, orig_really = OutStream.flush, OutStream._flush

    def _flush(self):
        # Counted before _flush clears _flush_pending, uncounted after it
        # queued its data: pending or running is then never missed.
        self._space_flushing = getattr(self, "_space_flushing", 0) + 1
        try:
            orig_really(self)
        finally:
            self._space_flushing -= 1

    def flush(self):
        if (
            self.echo is None
            and not self._flush_pending
            and not getattr(self, "_space_flushing", 0)
            and not self._subprocess_flush_pending
            and self._is_master_process()
        ):
            with self._buffer_lock:
                empty = self._buffer.tell() == 0
            if empty:
                return
        orig_flush(self)

    flush._space_skip_empty = True
    OutStream._flush, OutStream.flush = _flush, flush


_skip_empty_flush()
del _skip_empty_flush


def _cache_accepts_cell_id():
    """ipykernel 6.17 inspects do_execute's signature (inspect.signature)
    on every execute_request; the answer never changes for a kernel."""
    try:
        import ipykernel.kernelbase as kb
    except ImportError:
        return
    orig = getattr(kb, "_accepts_cell_id", None)
    if orig is None or getattr(orig, "_space_cached", False):
        return
    cache = {}

    def _accepts_cell_id(meth):
        f = getattr(meth, "__func__", meth)
        r = cache.get(f)
        if r is None:
            r = cache[f] = orig(meth)
        return r

    _accepts_cell_id._space_cached = True
    kb._accepts_cell_id = _accepts_cell_id


_cache_accepts_cell_id()
del _cache_accepts_cell_id


def _send_iopub_directly():
    """ipykernel (6.17) hands every IOPub message to its IOPub thread: the
    main thread queues a closure, wakes the thread through a ZeroMQ pipe,
    and the thread sends. `x+1` publishes four messages (busy,
    execute_input, execute_result, idle): four thread wake-ups and GIL
    hand-offs per run, milliseconds each on a busy host. Messages the main
    thread publishes while nothing is queued for the thread now go out on
    the socket at once, under a lock the thread's own sends take too
    (ZeroMQ sockets may change threads, never be used by two at once);
    while anything is queued (output being flushed, another thread's
    message) they are queued behind it, so the order is unchanged."""
    ip = IPython.get_ipython()
    t = getattr(getattr(ip, "kernel", None), "iopub_thread", None)
    needed = ("schedule", "send_multipart", "_really_send", "_is_master_process", "thread", "socket", "closed")
    if t is None or not all(hasattr(t, a) for a in needed) or getattr(t, "_space_direct", False):
        return
    import threading

    lock = threading.Lock()
    queued = [0]  # closures scheduled and not yet finished
    main = threading.main_thread()
    orig_schedule, orig_send, orig_really = t.schedule, t.send_multipart, t._really_send

    def schedule(f):
        def run():
            try:
                f()
            finally:
                with lock:
                    queued[0] -= 1

        with lock:
            queued[0] += 1
        orig_schedule(run)

    def really_send(*args, **kwargs):
        with lock:
            orig_really(*args, **kwargs)

    def send_multipart(*args, **kwargs):
        if threading.current_thread() is main and t.thread.is_alive() and t._is_master_process():
            with lock:
                if queued[0] == 0 and not t.closed:
                    t.socket.send_multipart(*args, **kwargs)
                    return
        orig_send(*args, **kwargs)

    t.schedule, t._really_send, t.send_multipart = schedule, really_send, send_multipart
    t._space_direct = True


_send_iopub_directly()
del _send_iopub_directly
