"""Answers of the API as dicts with attribute access (sb.info.state == sb.info["state"])."""


class Record(dict):
    """A JSON object from the API. Fields read as attributes; absent ones are None."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self.get(name)

    def __repr__(self):
        return f"{type(self).__name__}({dict.__repr__(self)})"


class SandboxInfo(Record):
    """A sandbox: id, project_id, template, state, state_reason, env, metadata, limits,
    created_at, expires_at, paused_remaining_ms, ..."""


class Operation(Record):
    """An asynchronous lifecycle change: id, kind, target, state, progress, error, result."""

    @property
    def done(self):
        return self.get("state") in ("succeeded", "failed", "cancelled")


class Session(Record):
    """A data-plane grant: token, expires_at, data_url, domain (of forwarded ports)."""


class Port(Record):
    """A port something listens on in a sandbox: port, address, family (tcp|tcp6), url
    (host form), path_url (path form)."""


class SignedURL(Record):
    """A URL that opens one port until expires_at: url (host form), path_url, token."""


class Snapshot(Record):
    """A filesystem snapshot: id, sandbox_id, parent_id, state, kind, processes, stats."""


class Template(Record):
    """A built template: name, digest, source, size_bytes, files, env, cwd, user."""


class FileInfo(Record):
    """name, path, type (file|dir|symlink|other), size, mode, mtime_unix, symlink_target."""

    @property
    def is_dir(self):
        return self.get("type") == "dir"


class CommandInfo(Record):
    """id, pid, argv, tag, pty, running, exit, last_event_id, output_truncated."""


class CommandResult:
    """How a command ended, with the output it captured (when capture was on).

    exit_code is -1 when a signal killed it; signal names it (e.g. "SIGKILL")."""

    def __init__(self, command_id, exit, stdout=b"", stderr=b""):
        self.command_id = command_id
        self.raw = exit
        self.exit_code = exit.get("exit_code", -1)
        self.signal = exit.get("signal") or ""
        self.timed_out = bool(exit.get("timed_out"))
        self.oom_killed = bool(exit.get("oom_killed"))
        self.error = exit.get("error") or ""
        self.stdout = stdout
        self.stderr = stderr

    @property
    def ok(self):
        return self.exit_code == 0 and not self.error

    @property
    def text(self):
        """stdout decoded as UTF-8."""
        return self.stdout.decode("utf-8", "replace")

    def __repr__(self):
        extra = "".join(f", {k}={getattr(self, k)!r}" for k in ("signal", "timed_out", "oom_killed", "error")
                        if getattr(self, k))
        return f"CommandResult(command_id={self.command_id!r}, exit_code={self.exit_code}{extra})"


class OutputEvent:
    """One event of a command's output stream: seq (int), type (stdout|stderr|exit), data
    (bytes for stdout/stderr, the exit dict for exit)."""

    __slots__ = ("seq", "type", "data")

    def __init__(self, seq, type, data):
        self.seq, self.type, self.data = seq, type, data

    def __repr__(self):
        return f"OutputEvent(seq={self.seq}, type={self.type!r}, data={self.data!r:.60})"


class CodeResult(Record):
    """A rich result of run_code: is_main_result and one field per format it came in (text,
    html, markdown, svg, png, jpeg, pdf (base64), latex, json, javascript, data, chart, extra)."""

    def formats(self):
        return [k for k in self if k not in ("type", "is_main_result", "extra")] + list(self.get("extra") or {})


class CodeError(Record):
    """The error a run_code raised: name (ZeroDivisionError, ..., TimeoutError), value, traceback."""


class Execution:
    """What run_code produced: results (CodeResult list), stdout and stderr (lists of str, in
    order), error (CodeError or None), execution_count; text is the main result's text."""

    __slots__ = ("results", "stdout", "stderr", "error", "execution_count")

    def __init__(self):
        self.results, self.stdout, self.stderr, self.error, self.execution_count = [], [], [], None, None

    @property
    def text(self):
        for r in self.results:
            if r.get("is_main_result"):
                return r.get("text")
        return None

    def __repr__(self):
        return (f"Execution(text={self.text!r}, results={len(self.results)}, stdout={self.stdout!r:.60}, "
                f"error={self.error!r:.80})")
