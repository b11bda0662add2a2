#!/usr/bin/env python3
"""SPACE's code interpreter server (template code-interpreter-v1).

Listens on port 49999 inside the sandbox and speaks the protocol of the
@e2b/code-interpreter SDKs: POST /execute streams newline-delimited JSON
events (number_of_executions, stdout, stderr, result, error, keepalive,
end_of_execution); /contexts creates, lists, restarts and removes stateful
contexts; /health says whether the default Python context is up.

Python contexts are IPython kernels driven through jupyter_client (no
Jupyter server in between); JavaScript (and TypeScript) contexts are Node.js processes
running jsctx.js. Only the standard library and Debian's python3 packages
are used. Who may reach this port is decided by SPACE's port forwarding
(the traffic token of private sandboxes), as E2B's proxy does for its own
server.
"""

import codecs
import hmac
import json
import logging
import os
import queue
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.dirname(os.path.abspath(__file__))
PORT = int(os.environ.get("SPACE_INTERP_PORT", "49999"))
DEFAULT_CWD = "/home/user"
MAX_BODY = 16 << 20  # bytes of one request
MAX_CONTEXTS = 64
MAX_ENV_VARS = 256
KEEPALIVE_S = 5.0
POLL_S = 0.2
START_TIMEOUT_S = 60.0
# After an interrupt, how long the context may take to become idle again
# before it is restarted.
INTERRUPT_GRACE_S = 10.0
MARK_WAIT_S = 1.0
# How long the first events of a run (and the answer's status line and
# headers) wait for more before they are sent (Answer).
FIRST_WRITE_S = 0.05
MSG_DELIM = b"<IDS|MSG>"  # Jupyter's wire protocol: identities end here
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,255}$")

log = logging.getLogger("space-interpreter")


class HTTPError(Exception):
    def __init__(self, status, code, message):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def now_iso():
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + "Z"


def iso_date(s):
    """A kernel message's date as ISO 8601 with a +00:00 offset (the form
    the server always sent), or now when the kernel sent none."""
    if not s:
        return now_iso()
    try:
        return datetime.fromisoformat(s.replace("Z", "+00:00")).isoformat()
    except (TypeError, ValueError):
        return str(s)


# Result fields of the SDK by MIME type; anything else goes to "extra".
MIME_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    "e2b/data": "data",
    "e2b/chart": "chart",
}


def result_event(data, main):
    ev = {"type": "result", "is_main_result": main}
    extra = {}
    for mime, value in data.items():
        field = MIME_FIELDS.get(mime)
        if field is None:
            extra[mime] = value
            continue
        if field == "text" and isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]  # a str's repr, as E2B's server strips it
        ev[field] = value
    if extra:
        ev["extra"] = extra
    return ev


class JupyterContext:
    """A kernel started by jupyter_client's KernelManager and driven
    through plain synchronous ZeroMQ sockets to its shell and iopub
    channels (no Jupyter server in between). Not jupyter_client's
    blocking client: each of its receives runs an asyncio loop
    (nest_asyncio) in the calling thread, which cost milliseconds per
    message on a busy host. Sockets are used only under self.lock.
    Subclasses name the kernel and how to set and restore environment
    variables in its language."""

    language = kernel_name = None
    # Whether the kernel sends values as display_data, never as
    # execute_result (IRkernel): then a run's last output, if it is a
    # display, is its main result, as execute_result is for IPython.
    display_values = False

    def __init__(self, ctx_id, cwd):
        self.id, self.cwd = ctx_id, cwd
        self.lock = threading.Lock()  # one execution at a time
        self.km = self.shell = self.iopub = None
        self._start()

    def _kernel_args(self):
        return []

    def _start(self):
        from jupyter_client import KernelManager

        km = KernelManager(kernel_name=self.kernel_name)
        km.start_kernel(cwd=self.cwd, extra_arguments=self._kernel_args())
        shell = iopub = None
        try:
            shell, iopub = km.connect_shell(), km.connect_iopub()
            self._wait_ready(km, shell, iopub)
        except Exception:
            for sock in (shell, iopub):
                if sock is not None:
                    sock.close(linger=0)
            km.shutdown_kernel(now=True)
            raise
        self.km, self.shell, self.iopub = km, shell, iopub

    @staticmethod
    def _recv(session, sock):
        """The next message on sock, its signature checked. Header dates
        stay strings: jupyter_client's deserialize parses each one with
        dateutil, a large part of this server's time per message."""
        parts = sock.recv_multipart()
        i = parts.index(MSG_DELIM)
        sig, header, parent, metadata, content = parts[i + 1:i + 6]
        if session.auth is not None and not hmac.compare_digest(sig, session.sign([header, parent, metadata, content])):
            raise ValueError("kernel message with a bad signature")
        header = json.loads(header)
        return {"header": header, "msg_type": header["msg_type"], "parent_header": json.loads(parent), "content": json.loads(content)}

    def _wait_ready(self, km, shell, iopub):
        """Asks for kernel_info until it is answered on shell and iopub
        delivers to our subscription (a SUB socket misses what is published
        before its subscription reaches the kernel), as jupyter_client's
        wait_for_ready does."""
        session = km.session
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            session.send(shell, session.msg("kernel_info_request"))
            if shell.poll(1000):
                reply = self._recv(session, shell)
                if reply["msg_type"] == "kernel_info_reply" and iopub.poll(200):
                    while iopub.poll(50):  # the request's busy/idle
                        self._recv(session, iopub)
                    while shell.poll(0):  # replies to earlier requests
                        shell.recv_multipart()
                    return
            if not km.is_alive():
                raise RuntimeError("the %s kernel died before replying to kernel_info" % self.kernel_name)
        raise RuntimeError("the %s kernel did not answer kernel_info in %.0f s" % (self.kernel_name, START_TIMEOUT_S))

    def _send_execute(self, code, silent, store_history):
        # stop_on_error makes the kernel abort requests queued behind a
        # cell that raised; this server queues none (one execution at a
        # time, the next sent after the idle status), but with it a
        # request sent right after an error's idle could still land
        # before the kernel stopped aborting, and was answered "aborted"
        # without running (TestCodeRoute's run after a timeout).
        msg = self.km.session.msg("execute_request", {
            "code": code, "silent": silent, "store_history": store_history,
            "user_expressions": {}, "allow_stdin": False, "stop_on_error": False,
        })
        self.km.session.send(self.shell, msg)
        return msg["header"]["msg_id"]

    def _next_iopub(self, timeout):
        """The next iopub message, or None after timeout seconds."""
        if not self.iopub.poll(int(timeout * 1000)):
            return None
        return self._recv(self.km.session, self.iopub)

    def _set_env_code(self, env):
        raise NotImplementedError

    def _restore_env_code(self):
        raise NotImplementedError

    def close(self):
        try:
            for sock in (self.shell, self.iopub):
                sock.close(linger=0)
        finally:
            self.km.shutdown_kernel(now=True)

    def restart(self):
        with self.lock:
            self.close()
            self._start()

    def _quiet(self, code):
        """Runs code silently and waits for it (env var set/restore)."""
        msg_id = self._send_execute(code, True, False)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = self._next_iopub(POLL_S)
            if msg is None:
                if not self.km.is_alive():
                    return
                continue
            if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return

    def _drain_shell(self):
        while self.shell.poll(0):
            self.shell.recv_multipart()

    def execute(self, code, env, emit, gone):
        with self.lock:
            if env:
                self._quiet(self._set_env_code(env))
            try:
                self._run(code, emit, gone)
            finally:
                if env and self.km.is_alive():
                    self._quiet(self._restore_env_code())
                self._drain_shell()

    def _run(self, code, emit, gone):
        msg_id = self._send_execute(code, False, True)
        last_write = time.monotonic()
        last_alive = last_write
        interrupted_at = None
        errored = False
        held = None  # display_values: the latest result, not yet sent
        while True:
            # Events are buffered while more messages are waiting and sent
            # together before waiting: one write for a burst of output.
            msg = self._next_iopub(0)
            if msg is None:
                emit(None)
                msg = self._next_iopub(emit.wait_s(POLL_S))
            if msg is None:
                t = time.monotonic()
                if interrupted_at is None and gone():
                    log.info("client went away: interrupting context %s", self.id)
                    self.km.interrupt_kernel()
                    interrupted_at = t
                if interrupted_at is not None and t - interrupted_at > INTERRUPT_GRACE_S:
                    log.warning("context %s did not stop after an interrupt: restarting it", self.id)
                    self._restart_locked()
                    return
                if t - last_alive > 1.0:
                    last_alive = t
                    if not self.km.is_alive():
                        emit({"type": "error", "name": "DeadKernelError", "value": "the kernel died; it was restarted and its state is lost", "traceback": ""})
                        self._restart_locked()
                        return
                if interrupted_at is None and t - last_write >= KEEPALIVE_S:
                    emit({"type": "keepalive"})
                    last_write = t
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            ev = None
            if kind == "execute_input":
                ev = {"type": "number_of_executions", "execution_count": content.get("execution_count")}
            elif kind == "stream":
                name = content.get("name")
                if name in ("stdout", "stderr"):
                    ev = {"type": name, "text": content.get("text", ""), "timestamp": iso_date(msg["header"].get("date"))}
            elif kind == "display_data":
                ev = result_event(content.get("data", {}), False)
            elif kind == "execute_result":
                ev = result_event(content.get("data", {}), True)
            elif kind == "error":
                if not errored:
                    errored = True
                    ev = {"type": "error", "name": content.get("ename", ""), "value": content.get("evalue", ""), "traceback": "\n".join(content.get("traceback", []))}
            elif kind == "status" and content.get("execution_state") == "idle":
                if held is not None and interrupted_at is None:
                    # The run's last output is a value (not a plot): its main result.
                    held["is_main_result"] = not any(k in held for k in ("png", "jpeg", "svg"))
                    emit(held, more=True)
                return
            if ev is None or interrupted_at is not None:
                continue
            if held is not None:
                emit(held, more=True)
                held = None
            if self.display_values and kind == "display_data":
                held = ev
                continue
            emit(ev, more=True)
            last_write = time.monotonic()

    def _restart_locked(self):
        try:
            self.close()
        except Exception as e:  # the kernel may be gone already
            log.warning("context %s: close: %s", self.id, e)
        self._start()


class PythonContext(JupyterContext):
    """An IPython kernel (Debian's python3-ipykernel)."""

    language, kernel_name = "python", "python3"

    def _kernel_args(self):
        return [
            "--IPKernelApp.exec_files=" + os.path.join(HERE, "kernel_init.py"),
            "--InteractiveShell.colors=NoColor",
            # Every cell's history went to SQLite from a saving thread (a
            # wake-up and a commit per run); in memory, In, Out, _i and
            # %history of the session work the same, with no file.
            "--HistoryManager.hist_file=:memory:",
            # ipykernel sleeps 0.5 ms before each execute_reply (a
            # mitigation for clients that stop reading at the reply; this
            # server reads until the idle status) and a sleep's wake-up
            # takes milliseconds on a busy host.
            "--Kernel._execute_sleep=0",
        ]

    def _set_env_code(self, env):
        return (
            "__import__('os').__space_saved_env = {k: __import__('os').environ.get(k) for k in %s}\n"
            "__import__('os').environ.update(%s)" % (json.dumps(sorted(env)), json.dumps(env))
        )

    def _restore_env_code(self):
        return (
            "for __k, __v in __import__('os').__space_saved_env.items():\n"
            "    (__import__('os').environ.pop(__k, None) if __v is None else __import__('os').environ.__setitem__(__k, __v))\n"
            "del __k, __v\n"
            "del __import__('os').__space_saved_env"
        )


def r_string(s):
    """An R string literal. JSON's escapes are R's too; other characters
    stay literal (R rejects the surrogate pairs JSON writes for astral
    ones)."""
    return json.dumps(s, ensure_ascii=False)


class RContext(JupyterContext):
    """An IRkernel (Debian's r-cran-irkernel, kernelspec "ir")."""

    language, kernel_name = "r", "ir"
    display_values = True

    def _set_env_code(self, env):
        names = sorted(env)
        return (
            ".space_saved_env <- Sys.getenv(c(%s), unset = NA, names = TRUE)\n"
            "do.call(Sys.setenv, as.list(setNames(c(%s), c(%s))))"
            % (", ".join(map(r_string, names)), ", ".join(r_string(env[k]) for k in names), ", ".join(map(r_string, names)))
        )

    def _restore_env_code(self):
        return (
            "for (.space_k in names(.space_saved_env)) {\n"
            "  if (is.na(.space_saved_env[[.space_k]])) Sys.unsetenv(.space_k)\n"
            "  else do.call(Sys.setenv, setNames(list(.space_saved_env[[.space_k]]), .space_k))\n"
            "}\n"
            "rm(.space_saved_env, .space_k)"
        )


class ProcessContext:
    """A context that is one process of SPACE's own, for languages Debian
    packages no Jupyter kernel for: subclasses start it (_start) and run a
    cell (_run); what the cell's processes write goes to the execution
    running at the time (_send)."""

    language = None

    def __init__(self, ctx_id, cwd):
        self.id, self.cwd = ctx_id, cwd
        self.lock = threading.Lock()  # one execution at a time
        self.out_lock = threading.Lock()
        self.emit = None  # the running execution's emit
        self.proc = None
        self._start()

    def _send(self, name, text):
        if not text:
            return
        with self.out_lock:
            if self.emit is not None:
                self.emit({"type": name, "text": text, "timestamp": now_iso()})

    def _kill(self):
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()

    def close(self):
        self._kill()

    def restart(self):
        with self.lock:
            self._kill()
            self._start()

    def execute(self, code, env, emit, gone):
        with self.lock:
            with self.out_lock:
                self.emit = emit
            try:
                self._run(code, env, emit, gone)
            finally:
                with self.out_lock:
                    self.emit = None


class JavaScriptContext(ProcessContext):
    """A Node.js process running jsctx.js (Debian packages no JS kernel)."""

    language = "javascript"
    typescript = False

    def _start(self):
        rfd, wfd = os.pipe()
        env = dict(os.environ, SPACE_INTERP_FD=str(wfd), NODE_NO_WARNINGS="1", SPACE_INTERP_TS="1" if self.typescript else "0")
        try:
            self.proc = subprocess.Popen(
                ["node", "--stack-trace-limit=50", os.path.join(HERE, "jsctx.js")],
                cwd=self.cwd, env=env, pass_fds=(wfd,), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            )
        finally:
            os.close(wfd)
        self.events = queue.Queue()
        threading.Thread(target=self._read_events, args=(os.fdopen(rfd, "rb"), self.events), daemon=True).start()
        for name, f in (("stdout", self.proc.stdout), ("stderr", self.proc.stderr)):
            threading.Thread(target=self._forward, args=(name, f), daemon=True).start()
        ev = self._next(START_TIMEOUT_S)
        if ev is None or ev.get("type") != "ready":
            self._kill()
            raise RuntimeError("the JavaScript context did not start: %r" % (ev,))

    @staticmethod
    def _read_events(f, q):
        with f:
            for line in f:
                try:
                    q.put(json.loads(line))
                except ValueError:
                    continue
        q.put({"type": "dead"})

    def _forward(self, name, f):
        # Output of processes the cell started (fd 1/2), best effort.
        for chunk in iter(lambda: f.read1(65536), b""):
            self._send(name, chunk.decode("utf-8", "replace"))

    def _next(self, timeout):
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            return None

    def _run(self, code, env, emit, gone):
        try:
            self.proc.stdin.write((json.dumps({"code": code, "env": env or {}}) + "\n").encode())
            self.proc.stdin.flush()
        except OSError:
            emit({"type": "error", "name": "DeadKernelError", "value": "the JavaScript context died; it was restarted and its state is lost", "traceback": ""})
            self._kill()
            self._start()
            return
        last_write = time.monotonic()
        interrupted_at = None
        while True:
            # As for Jupyter kernels: events that are waiting go out together.
            ev = self._next(0)
            if ev is None:
                emit(None)
                ev = self._next(emit.wait_s(POLL_S))
            t = time.monotonic()
            if ev is None:
                if interrupted_at is None and gone():
                    log.info("client went away: interrupting context %s", self.id)
                    os.kill(self.proc.pid, signal.SIGINT)
                    interrupted_at = t
                if interrupted_at is not None and t - interrupted_at > INTERRUPT_GRACE_S:
                    self._kill()
                    self._start()
                    return
                if interrupted_at is None and t - last_write >= KEEPALIVE_S:
                    emit({"type": "keepalive"})
                    last_write = t
                continue
            kind = ev.get("type")
            if kind == "end":
                return
            if kind == "dead":
                if interrupted_at is None:
                    emit({"type": "error", "name": "DeadKernelError", "value": "the JavaScript context died; it was restarted and its state is lost", "traceback": ""})
                self._kill()
                self._start()
                return
            if interrupted_at is None:
                emit(ev, more=True)
                last_write = t


class TypeScriptContext(JavaScriptContext):
    """A JavaScript context whose cells are TypeScript: jsctx.js strips
    the types of each cell with Debian's node-typescript (transpileModule,
    no type checking) and runs the JavaScript."""

    language = "typescript"
    typescript = True


# The loop a bash context runs: each request is two lines (the cell, then
# assignments of its env vars) with backslash and newline escaped for
# printf %b, so no process is forked per request; answered by the cell's exit
# status on fd SPACE_INTERP_FD after an end mark on stdout and stderr. The
# cell runs in a function, so an interrupt's trap can end it with `return`
# and the shell (with its variables and cwd) survives; it reads /dev/null,
# never the request pipe.
BASH_LOOP = r"""
exec {__space_fd}>&"$SPACE_INTERP_FD"
unset SPACE_INTERP_FD
__space_run() { eval "$__space_code"; }
trap 'return 130 2>/dev/null' INT
while IFS= read -r __space_line && IFS= read -r __space_env; do
  printf -v __space_code %b "$__space_line"
  printf -v __space_env %b "$__space_env"
  eval "$__space_env __space_run" </dev/null
  __space_rc=$?
  printf '\0%s\n' "$SPACE_INTERP_MARK"
  printf '\0%s\n' "$SPACE_INTERP_MARK" >&2
  printf '%s\n' "$__space_rc" >&"$__space_fd"
done
"""


def bash_line(s):
    """One line that printf %b turns back into s."""
    return s.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


def sh_quote(s):
    return "'" + s.replace("'", "'\\''") + "'"


class BashContext(ProcessContext):
    """A bash process of SPACE's own (Debian packages no bash kernel): state
    (variables, functions, cwd) persists from one cell to the next; a cell
    that exits non-zero is an error named ExitCode; an interrupt ends the
    running cell with SIGINT to its process group."""

    language = "bash"

    def __init__(self, ctx_id, cwd):
        self.mark = ("\0" + uuid.uuid4().hex + "\n").encode()
        super().__init__(ctx_id, cwd)

    def _start(self):
        rfd, wfd = os.pipe()
        env = dict(os.environ, SPACE_INTERP_FD=str(wfd), SPACE_INTERP_MARK=self.mark[1:-1].decode())
        try:
            self.proc = subprocess.Popen(
                ["bash", "--noprofile", "--norc", "-c", BASH_LOOP], cwd=self.cwd, env=env, pass_fds=(wfd,),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            )
        finally:
            os.close(wfd)
        self.events = queue.Queue()
        threading.Thread(target=self._read_status, args=(os.fdopen(rfd, "rb"), self.events), daemon=True).start()
        for name, f in (("stdout", self.proc.stdout), ("stderr", self.proc.stderr)):
            threading.Thread(target=self._forward, args=(name, f, self.events), daemon=True).start()

    @staticmethod
    def _read_status(f, q):
        with f:
            for line in f:
                q.put(("status", line.strip().decode("ascii", "replace")))
        q.put(("dead", None))

    def _forward(self, name, f, q):
        dec = codecs.getincrementaldecoder("utf-8")("replace")
        pending = b""
        for chunk in iter(lambda: f.read1(65536), b""):
            data = pending + chunk
            while True:
                i = data.find(self.mark)
                if i < 0:
                    break
                self._send(name, dec.decode(data[:i], final=True))
                q.put(("mark", name))
                data = data[i + len(self.mark):]
            # Keep a tail that may be the start of a mark.
            j = data.rfind(b"\0")
            if j >= 0 and self.mark.startswith(data[j:]):
                data, pending = data[:j], data[j:]
            else:
                pending = b""
            self._send(name, dec.decode(data))

    def _died(self, emit, interrupted):
        if not interrupted:
            emit({"type": "error", "name": "DeadKernelError", "value": "the bash context exited; it was restarted and its state is lost", "traceback": ""})
        self._kill()
        self._start()

    def _run(self, code, env, emit, gone):
        assigns = " ".join("%s=%s" % (k, sh_quote(v)) for k, v in sorted(env.items()))
        req = (bash_line(code) + "\n" + bash_line(assigns) + "\n").encode()
        try:
            self.proc.stdin.write(req)
            self.proc.stdin.flush()
        except OSError:
            self._died(emit, False)
            return
        last_write = time.monotonic()
        interrupted_at = None
        status, status_at, marks = None, None, set()
        # The end marks follow the status unless the cell redirected the
        # shell's own stdout or stderr (exec >file): then wait briefly.
        while status is None or (len(marks) < 2 and time.monotonic() - status_at < MARK_WAIT_S):
            try:
                kind, val = self.events.get(timeout=emit.wait_s(POLL_S))
            except queue.Empty:
                emit(None)  # a held first write that is due
                t = time.monotonic()
                if self.proc.poll() is not None and status is None:
                    self._died(emit, interrupted_at is not None)
                    return
                if interrupted_at is None and gone():
                    log.info("client went away: interrupting context %s", self.id)
                    try:
                        os.killpg(self.proc.pid, signal.SIGINT)
                    except ProcessLookupError:
                        pass
                    interrupted_at = t
                if interrupted_at is not None and t - interrupted_at > INTERRUPT_GRACE_S:
                    self._died(emit, True)
                    return
                if interrupted_at is None and t - last_write >= KEEPALIVE_S:
                    emit({"type": "keepalive"})
                    last_write = t
                continue
            if kind == "dead":
                self._died(emit, interrupted_at is not None)
                return
            if kind == "mark":
                marks.add(val)
            elif kind == "status":
                status, status_at = val, time.monotonic()
        if status != "0" and interrupted_at is None:
            emit({"type": "error", "name": "ExitCode", "value": status, "traceback": ""})


LANGUAGES = {
    "python": PythonContext, "python3": PythonContext, "py": PythonContext,
    "javascript": JavaScriptContext, "js": JavaScriptContext, "node": JavaScriptContext,
    "typescript": TypeScriptContext, "ts": TypeScriptContext,
    "r": RContext, "bash": BashContext, "sh": BashContext, "shell": BashContext,
}


def normalize_language(lang):
    if lang is None or lang == "":
        return "python"
    if not isinstance(lang, str):
        raise HTTPError(400, "invalid_argument", "language must be a string")
    name = lang.strip().lower()
    cls = LANGUAGES.get(name)
    if cls is None:
        raise HTTPError(400, "unsupported_language",
                        "language %r is not supported by SPACE's code interpreter (supported: python, javascript, typescript, r, bash)" % lang[:64])
    return cls.language


class Contexts:
    def __init__(self):
        self.mu = threading.Lock()
        self.by_id = {}
        self.default = {}  # language -> context id
        self.default_ready = threading.Event()
        self.default_error = None

    def create(self, language, cwd):
        cls = LANGUAGES[language]
        with self.mu:
            if len(self.by_id) >= MAX_CONTEXTS:
                raise HTTPError(429, "too_many_contexts", "at most %d contexts; remove one first" % MAX_CONTEXTS)
        if not os.path.isdir(cwd):
            raise HTTPError(400, "invalid_argument", "cwd %r is not a directory" % cwd[:256])
        ctx = cls(str(uuid.uuid4()), cwd)
        with self.mu:
            self.by_id[ctx.id] = ctx
        log.info("context %s (%s) created in %s", ctx.id, language, cwd)
        return ctx

    def get(self, ctx_id):
        with self.mu:
            ctx = self.by_id.get(ctx_id)
        if ctx is None:
            raise HTTPError(404, "not_found", "context %s not found" % str(ctx_id)[:64])
        return ctx

    def default_for(self, language):
        if language == "python":
            if not self.default_ready.wait(START_TIMEOUT_S):
                raise HTTPError(503, "unavailable", "the default Python context is still starting")
        with self.mu:
            ctx_id = self.default.get(language)
            ctx = self.by_id.get(ctx_id) if ctx_id else None
        if ctx is not None:
            return ctx
        ctx = self.create(language, DEFAULT_CWD)
        with self.mu:
            if language in self.default and self.default[language] in self.by_id:
                other = self.by_id[self.default[language]]
            else:
                self.default[language], other = ctx.id, None
        if other is not None:  # lost a race: keep the first
            self.remove(ctx.id)
            return other
        return ctx

    def remove(self, ctx_id):
        with self.mu:
            ctx = self.by_id.pop(ctx_id, None)
            for lang, d in list(self.default.items()):
                if d == ctx_id:
                    del self.default[lang]
        if ctx is None:
            raise HTTPError(404, "not_found", "context %s not found" % str(ctx_id)[:64])
        ctx.close()

    def list(self):
        with self.mu:
            return [{"id": c.id, "language": c.language, "cwd": c.cwd} for c in self.by_id.values()]

    def start_defaults(self):
        try:
            ctx = self.create("python", DEFAULT_CWD if os.path.isdir(DEFAULT_CWD) else "/")
            with self.mu:
                self.default["python"] = ctx.id
        except Exception as e:
            self.default_error = str(e)
            log.error("default Python context: %s", e)
        self.default_ready.set()
        try:
            self.default_for("javascript")
        except Exception as e:
            log.error("default JavaScript context: %s", e)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "space-interpreter"
    # Events are small writes: with Nagle's algorithm each one after the
    # first waits for the peer's delayed ACK (~40 ms on loopback).
    disable_nagle_algorithm = True
    contexts = None  # set by main

    def log_message(self, fmt, *args):
        log.debug("%s " + fmt, self.address_string(), *args)

    def _send_json(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, e):
        self._send_json(e.status, {"error": {"code": e.code, "message": e.message}})

    def _body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            raise HTTPError(411, "length_required", "send a Content-Length")
        try:
            n = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise HTTPError(400, "invalid_argument", "bad Content-Length")
        if n < 0 or n > MAX_BODY:
            raise HTTPError(413, "too_large", "request body over %d bytes" % MAX_BODY)
        raw = self.rfile.read(n) if n else b""
        if not raw.strip():
            return {}
        try:
            obj = json.loads(raw)
        except ValueError as e:
            raise HTTPError(400, "invalid_json", "request body is not JSON: %s" % e)
        if not isinstance(obj, dict):
            raise HTTPError(400, "invalid_json", "request body must be a JSON object")
        return obj

    def _route(self, method):
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        parts = path.strip("/").split("/")
        try:
            if method == "GET" and path == "/health":
                c = self.contexts
                if not c.default_ready.is_set() or c.default_error:
                    raise HTTPError(503, "unavailable", c.default_error or "starting")
                return self._send_json(200, "OK")
            if path == "/execute" and method == "POST":
                return self._execute(self._body())
            if path == "/contexts" and method == "GET":
                return self._send_json(200, self.contexts.list())
            if path == "/contexts" and method == "POST":
                req = self._body()
                lang = normalize_language(req.get("language"))
                cwd = req.get("cwd") or DEFAULT_CWD
                if not isinstance(cwd, str) or not cwd.startswith("/") or "\x00" in cwd or len(cwd) > 4096:
                    raise HTTPError(400, "invalid_argument", "cwd must be an absolute path")
                ctx = self.contexts.create(lang, cwd)
                return self._send_json(200, {"id": ctx.id, "language": ctx.language, "cwd": ctx.cwd})
            if len(parts) == 3 and parts[0] == "contexts" and parts[2] == "restart" and method == "POST":
                self._body()
                self.contexts.get(parts[1]).restart()
                return self._send_json(200, None)
            if len(parts) == 2 and parts[0] == "contexts" and method == "DELETE":
                self.contexts.remove(parts[1])
                return self._send_json(200, None)
            raise HTTPError(404 if method in ("GET", "POST", "DELETE") else 405, "not_found", "no route %s %s" % (method, path[:128]))
        except HTTPError as e:
            self._error(e)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as e:
            log.exception("%s %s", method, path)
            self._error(HTTPError(500, "internal", str(e)[:1000]))

    def do_GET(self):
        self._route("GET")

    def do_POST(self):
        self._route("POST")

    def do_DELETE(self):
        self._route("DELETE")

    def _gone(self):
        """Whether the client closed its connection (EOF while we stream)."""
        try:
            r, _, _ = select.select([self.connection], [], [], 0)
            if not r:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _execute(self, req):
        code = req.get("code")
        if not isinstance(code, str):
            raise HTTPError(400, "invalid_argument", "code must be a string")
        ctx_id, lang = req.get("context_id"), req.get("language")
        if ctx_id and lang:
            raise HTTPError(400, "invalid_argument", "only one of context_id or language can be provided")
        env = req.get("env_vars") or {}
        if not isinstance(env, dict) or len(env) > MAX_ENV_VARS:
            raise HTTPError(400, "invalid_argument", "env_vars must be an object of at most %d strings" % MAX_ENV_VARS)
        for k, v in env.items():
            if not ENV_NAME.match(k) or not isinstance(v, str) or "\x00" in v:
                raise HTTPError(400, "invalid_argument", "env var %r: names are [A-Za-z_][A-Za-z0-9_]*, values strings" % k[:64])
        if ctx_id:
            if not isinstance(ctx_id, str):
                raise HTTPError(400, "invalid_argument", "context_id must be a string")
            ctx = self.contexts.get(ctx_id)
        else:
            ctx = self.contexts.default_for(normalize_language(lang))

        answer = Answer(self)
        try:
            ctx.execute(code, env, answer, answer.gone)
        except Exception as e:
            if not answer.started:
                raise  # answered as a JSON error
            log.exception("execute in context %s", ctx.id)
            answer({"type": "error", "name": "InternalError", "value": str(e)[:1000], "traceback": ""})
        # The last event and the end of the chunked body in one write.
        answer({"type": "end_of_execution"}, tail=b"0\r\n\r\n")
        if answer.broken:
            self.close_connection = True


class Answer:
    """The streamed answer to one /execute: a chunked body of NDJSON
    events, sent in as few writes as possible. Each write is a wake-up for
    every process on the way (SPACE's port forwarding, its agent in the
    sandbox, the client), so the status line and headers wait for the
    first events, and the first events wait up to FIRST_WRITE_S for more
    (or the end of the run): a quick run (`x+1`) leaves as one write
    where it took four. Later events are sent as soon as the run's loop
    finds nothing more waiting. Called as emit(ev, more=False, tail=b"")
    by the contexts, from their own threads too."""

    def __init__(self, handler):
        self.h = handler
        self.lock = threading.Lock()
        self.pending = []
        self.broken = False
        self.started = False  # the status line and headers are sent
        self.hold_until = time.monotonic() + FIRST_WRITE_S
        handler.log_request(200)

    def _head(self):
        h = self.h
        return (
            "%s 200 OK\r\nServer: %s\r\nDate: %s\r\nContent-Type: application/x-ndjson\r\n"
            "Transfer-Encoding: chunked\r\nCache-Control: no-store\r\nX-Accel-Buffering: no\r\n\r\n"
            % (h.protocol_version, h.version_string(), h.date_time_string())
        ).encode("latin-1")

    def __call__(self, ev, more=False, tail=b""):
        """Queues ev as one chunk; unless more, sends what is queued (with
        tail) when it is due. With more, the caller sends it soon, with
        emit(None) at the latest."""
        with self.lock:
            if self.broken:
                return
            if ev is not None:
                line = json.dumps(ev, default=str).encode() + b"\n"
                self.pending.append(b"%x\r\n%s\r\n" % (len(line), line))
            if more or not (self.pending or tail):
                return
            if not self.started and not tail and time.monotonic() < self.hold_until:
                return  # the first write waits for more
            data = b"".join(self.pending) + tail
            self.pending.clear()
            if not self.started:
                data, self.started = self._head() + data, True
            try:
                self.h.wfile.write(data)
            except OSError:
                self.broken = True

    def wait_s(self, t):
        """How long a run's loop may wait for its next message before it
        calls emit(None): t, or less while the first write is held."""
        with self.lock:
            if self.started:
                return t
            return max(0.0, min(t, self.hold_until - time.monotonic()))

    def gone(self):
        """Whether the client closed its connection (or a write failed)."""
        return self.broken or self.h._gone()


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


def main():
    logging.basicConfig(level=os.environ.get("SPACE_INTERP_LOG", "INFO"), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # ipykernel's debugger warns about frozen modules on every kernel start.
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    contexts = Contexts()
    Handler.contexts = contexts
    srv = Server(("0.0.0.0", PORT), Handler)
    # Listen first: /health answers 503 until the default context is up and
    # /execute waits for it, so nothing races the kernel's start.
    threading.Thread(target=contexts.start_defaults, daemon=True).start()
    log.info("listening on :%d", PORT)

    def stop(*_):
        threading.Thread(target=srv.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    try:
        srv.serve_forever(poll_interval=0.5)
    finally:
        for c in contexts.list():
            try:
                contexts.remove(c["id"])
            except Exception:
                pass


if __name__ == "__main__":
    main()
