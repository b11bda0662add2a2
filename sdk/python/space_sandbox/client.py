"""The SPACE client: control API (API key) and per-sandbox data plane (session token)."""

import base64
import http.client
import ipaddress
import json
import os
import socket
import ssl
import stat
import tarfile
import tempfile
import threading
import time
import urllib.parse
import uuid

from . import errors, sse
from ._http import NETWORK_ERRORS, USER_AGENT, Response, Transport
from .models import (CodeError, CodeResult, CommandInfo, CommandResult, Execution, FileInfo, Operation,
                     OutputEvent, Port, SandboxInfo, Session, SignedURL, Snapshot, Template)

DEFAULT_URL = "http://127.0.0.1:7070"


class Client:
    """A connection to a SPACE server's control API.

    url and api_key default to $SPACE_URL (else http://127.0.0.1:7070) and
    $SPACE_API_KEY. data_url, when given, replaces the data-plane URL that
    the server hands out with each session (for a data plane behind a proxy
    or port forward). timeout is the per-request socket timeout in seconds."""

    def __init__(self, url=None, api_key=None, *, timeout=60.0, retries=3, data_url=None, ssl_context=None):
        url = url or os.environ.get("SPACE_URL") or DEFAULT_URL
        api_key = api_key if api_key is not None else os.environ.get("SPACE_API_KEY", "")
        if not api_key:
            raise ValueError("no API key: pass api_key= or set SPACE_API_KEY (create one with `space keys create`)")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.data_url = data_url
        self._ssl = ssl_context
        self._http = Transport(self.url, {"X-API-Key": api_key}, timeout, retries, ssl_context)

    # --- operations ---------------------------------------------------------------------------

    def get_operation(self, op_id):
        return Operation(self._http.json("GET", f"/v1/operations/{op_id}"))

    def wait_operation(self, op, timeout=600.0, poll=30):
        """Long-poll an operation (an id or an Operation) until it is done; return it.

        Raises OperationFailed if it ended failed or cancelled, Timeout after timeout seconds."""
        op_id = op if isinstance(op, str) else op["id"]
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise errors.Timeout(f"operation {op_id} not done after {timeout:g}s")
            wait = max(1, min(poll, int(left)))
            cur = Operation(self._http.json("GET", f"/v1/operations/{op_id}", query={"wait": f"{wait}s"},
                                            timeout=wait + self.timeout))
            if cur.state == "succeeded":
                return cur
            if cur.state in ("failed", "cancelled"):
                err = cur.get("error") or {}
                raise errors.OperationFailed(
                    f"operation {op_id} ({cur.get('kind')}) {cur.state}: {err.get('code', '?')}: {err.get('message', '')}",
                    cur)

    # --- sandboxes ----------------------------------------------------------------------------

    def create_sandbox(self, template=None, *, env=None, metadata=None, limits=None, timeout_seconds=None,
                       network=None, public_ports=None, wait=True, wait_timeout=600.0, idempotency_key=None):
        """Create a sandbox and (by default) wait until it runs; return its Sandbox handle.

        limits: {"cpu_millis", "memory_bytes", "pids", "disk_bytes"}. timeout_seconds: delete
        it this long after creation (0: never; None: the server default). public_ports=True:
        its forwarded ports open without a token (anyone with the URL reaches them).
        An Idempotency-Key is always sent (generated when not given), so a
        retried create never makes two sandboxes."""
        body = {}
        for k, v in (("template", template), ("env", env), ("metadata", metadata), ("limits", limits),
                     ("timeout_seconds", timeout_seconds), ("network", network),
                     ("public_ports", public_ports)):
            if v is not None:
                body[k] = v
        key = idempotency_key or "py-" + uuid.uuid4().hex
        ans = self._http.json("POST", "/v1/sandboxes", json_body=body, headers={"Idempotency-Key": key})
        sb = Sandbox(self, SandboxInfo(ans["sandbox"]), Session(ans["session"]))
        sb.operation = Operation(ans["operation"])
        if wait:
            done = self.wait_operation(sb.operation, timeout=wait_timeout)  # OperationFailed if it failed
            if isinstance(done.get("result"), dict) and done["result"].get("id") == sb.id:
                sb.info = SandboxInfo(done["result"])
            else:
                sb.refresh()
        return sb

    def get_sandbox(self, sandbox_id):
        """The Sandbox handle of an existing sandbox (its session is issued when first needed)."""
        return Sandbox(self, SandboxInfo(self._http.json("GET", f"/v1/sandboxes/{sandbox_id}")))

    connect = get_sandbox

    def list_sandboxes(self, state=None, metadata=None, limit=None):
        """Every sandbox of the project (all pages), as SandboxInfo records.

        state: a state or a list of states; metadata: {key: value} filters."""
        q = {}
        if state:
            q["state"] = state if isinstance(state, str) else ",".join(state)
        for k, v in (metadata or {}).items():
            q[f"metadata.{k}"] = v
        if limit:
            q["limit"] = limit
        out, token = [], None
        while True:
            if token:
                q["page_token"] = token
            page = self._http.json("GET", "/v1/sandboxes", query=q)
            out.extend(SandboxInfo(s) for s in page.get("sandboxes") or [])
            token = page.get("next_page_token")
            if not token:
                return out

    def delete_sandbox(self, sandbox_id, wait=True, wait_timeout=600.0):
        """Delete a sandbox; return the (finished, when wait) operation."""
        op = Operation(self._http.json("DELETE", f"/v1/sandboxes/{sandbox_id}")["operation"])
        return self.wait_operation(op, timeout=wait_timeout) if wait else op

    def new_session(self, sandbox_id):
        """Issue a fresh data-plane session token for a sandbox."""
        return Session(self._http.json("POST", f"/v1/sandboxes/{sandbox_id}/session"))

    # --- templates and snapshots --------------------------------------------------------------

    def list_templates(self):
        return [Template(t) for t in self._http.json("GET", "/v1/templates").get("templates") or []]

    def get_template(self, name):
        return Template(self._http.json("GET", f"/v1/templates/{name}"))

    def build_template(self, name, buildfile, context_dir=None, *, wait=True, wait_timeout=3600.0,
                       idempotency_key=None):
        """Build a template from a build file (FROM/RUN/COPY/ENV/WORKDIR/USER/START/READY).

        buildfile: the file's text (str or bytes). context_dir: the directory
        COPY reads (sent as a tar: directories, regular files and symlinks
        with their permission bits; other types skipped); None sends none.
        name may carry a tag ("py:3.12"). The request body is spooled to a
        temporary file, not held in memory. With wait (the default) return
        the finished operation, whose result is {"template", "steps", "warm"}
        (OperationFailed when a step or the pre-warm fails); else the
        pending operation."""
        if isinstance(buildfile, str):
            buildfile = buildfile.encode()
        boundary = "space-" + uuid.uuid4().hex
        key = idempotency_key or "py-" + uuid.uuid4().hex
        with tempfile.TemporaryFile() as body:
            body.write((f"--{boundary}\r\nContent-Disposition: form-data; name=\"buildfile\"; "
                        f"filename=\"Buildfile\"\r\nContent-Type: application/octet-stream\r\n\r\n").encode())
            body.write(buildfile)
            if context_dir is not None:
                body.write((f"\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"context\"; "
                            f"filename=\"context.tar\"\r\nContent-Type: application/x-tar\r\n\r\n").encode())
                _write_context_tar(context_dir, body)
            body.write(f"\r\n--{boundary}--\r\n".encode())
            body.seek(0)
            ans = self._http.json("POST", "/v1/templates/build", query={"name": name}, body=body,
                                  content_type=f"multipart/form-data; boundary={boundary}",
                                  headers={"Idempotency-Key": key}, timeout=max(self.timeout, 600.0))
        op = Operation(ans["operation"])
        return self.wait_operation(op, timeout=wait_timeout) if wait else op

    def template_build_log(self, op_id, step=None):
        """A build's full step logs: with step, that step's output (bytes,
        at most 4 MiB); without, the steps that have one ([{"step", "bytes"}])."""
        if step is None:
            return self._http.json("GET", f"/v1/templates/builds/{op_id}/logs").get("steps") or []
        with self._http.request("GET", f"/v1/templates/builds/{op_id}/logs", query={"step": step}) as r:
            return r.read()

    def delete_template(self, name):
        """Delete a template name (Conflict while a sandbox uses it)."""
        self._http.request("DELETE", f"/v1/templates/{name}").close()

    def alias_template(self, name, alias):
        """Point alias (a name or name:tag) at the template name."""
        return Template(self._http.json("POST", f"/v1/templates/{name}/alias", json_body={"alias": alias}))

    def gc_templates(self):
        """Remove template layers no name or live sandbox uses; return their digests."""
        return self._http.json("POST", "/v1/templates/gc").get("removed") or []

    def list_snapshots(self, sandbox_id=None):
        q, out, token = {"sandbox_id": sandbox_id}, [], None
        while True:
            if token:
                q["page_token"] = token
            page = self._http.json("GET", "/v1/snapshots", query=q)
            out.extend(Snapshot(s) for s in page.get("snapshots") or [])
            token = page.get("next_page_token")
            if not token:
                return out

    def get_snapshot(self, snapshot_id):
        return Snapshot(self._http.json("GET", f"/v1/snapshots/{snapshot_id}"))

    def delete_snapshot(self, snapshot_id, wait=True):
        ans = self._http.json("DELETE", f"/v1/snapshots/{snapshot_id}")
        op = (ans or {}).get("operation")
        if op and wait:
            return self.wait_operation(op)
        return Operation(op) if op else None

    def fork_snapshot(self, snapshot_id, count=1, *, env=None, metadata=None, limits=None,
                      timeout_seconds=None, network=None, wait=True, idempotency_key=None):
        """Start count sandboxes from a snapshot's filesystem; return their Sandbox handles."""
        body = {"count": count}
        for k, v in (("env", env), ("metadata", metadata), ("limits", limits),
                     ("timeout_seconds", timeout_seconds), ("network", network)):
            if v is not None:
                body[k] = v
        key = idempotency_key or "py-" + uuid.uuid4().hex
        ans = self._http.json("POST", f"/v1/snapshots/{snapshot_id}/fork", json_body=body,
                              headers={"Idempotency-Key": key})
        out = []
        for item in ans.get("sandboxes") or []:
            sb = Sandbox(self, SandboxInfo(item["sandbox"]), Session(item["session"]))
            sb.operation = Operation(item["operation"])
            out.append(sb)
        if wait:
            for sb in out:
                self.wait_operation(sb.operation)
                sb.refresh()
        return out

    def __repr__(self):
        return f"Client({self.url!r})"


class Sandbox:
    """One sandbox: lifecycle through the control API, commands and files through its
    data plane. Use as a context manager to delete it on exit."""

    def __init__(self, client, info, session=None):
        self.client = client
        self.info = info
        self.id = info["id"]
        self.operation = None
        self._session = session
        self._dp = None
        self._lock = threading.Lock()
        self.files = Files(self)

    def __repr__(self):
        return f"Sandbox({self.id!r}, state={self.info.get('state')!r})"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.delete()
        except errors.NotFound:
            pass

    # --- lifecycle ----------------------------------------------------------------------------

    @property
    def state(self):
        return self.info.get("state")

    def refresh(self):
        """Re-read the sandbox from the server; return its SandboxInfo."""
        self.info = SandboxInfo(self.client._http.json("GET", f"/v1/sandboxes/{self.id}"))
        return self.info

    def delete(self, wait=True):
        return self.client.delete_sandbox(self.id, wait=wait)

    def set_timeout(self, seconds):
        """Delete the sandbox this many seconds from now (0: never)."""
        self.info = SandboxInfo(self.client._http.json("POST", f"/v1/sandboxes/{self.id}/timeout",
                                                       json_body={"timeout_seconds": int(seconds)}))
        return self.info

    def _lifecycle(self, verb, wait):
        ans = self.client._http.json("POST", f"/v1/sandboxes/{self.id}/{verb}",
                                     headers={"Idempotency-Key": "py-" + uuid.uuid4().hex})
        op = Operation(ans["operation"])
        if wait:
            op = self.client.wait_operation(op)
            self.refresh()
        return op

    def pause(self, wait=True):
        """Freeze every process (state paused); the data plane refuses calls until resume."""
        return self._lifecycle("pause", wait)

    def resume(self, wait=True):
        """Resume a paused or hibernated sandbox."""
        return self._lifecycle("resume", wait)

    def hibernate(self, wait=True):
        """Snapshot the sandbox and release its instance (state hibernated); resume() starts it
        again from that snapshot with the same id. Processes continue where the driver captures
        them (gVisor; namespace with CRIU) and start afresh otherwise."""
        return self._lifecycle("hibernate", wait)

    def snapshot(self, wait=True):
        """Capture the sandbox's filesystem (not its processes); return the Snapshot."""
        ans = self.client._http.json("POST", f"/v1/sandboxes/{self.id}/snapshots",
                                     headers={"Idempotency-Key": "py-" + uuid.uuid4().hex})
        snap = Snapshot(ans["snapshot"])
        if wait:
            self.client.wait_operation(ans["operation"])
            snap = self.client.get_snapshot(snap["id"])
        return snap

    # --- data plane ---------------------------------------------------------------------------

    @property
    def session(self):
        with self._lock:
            if self._session is None:
                self._session = self.client.new_session(self.id)
                self._dp = None
            return self._session

    def _data(self):
        sess = self.session
        with self._lock:
            if self._dp is None:
                url = self.client.data_url or sess["data_url"]
                self._dp = Transport(url, {"Authorization": "Bearer " + sess["token"]}, self.client.timeout,
                                     self.client.retries, self.client._ssl)
            return self._dp

    def _renew_session(self):
        with self._lock:
            self._session = None
            self._dp = None

    def _dp_request(self, method, path, **kw):
        """A data-plane request; an expired session token is renewed once."""
        try:
            return self._data().request(method, f"/v1/sandboxes/{self.id}{path}", **kw)
        except errors.TokenExpired:
            body = kw.get("body")
            if body is not None and hasattr(body, "seek"):
                body.seek(0)
            self._renew_session()
            return self._data().request(method, f"/v1/sandboxes/{self.id}{path}", **kw)

    def _dp_json(self, method, path, **kw):
        return self._dp_request(method, path, **kw).json()

    def start(self, cmd, *, env=None, cwd=None, user=None, stdin=False, timeout=None, pty=None, tag=None):
        """Start a command and return its Command handle at once.

        cmd: a string (run by /bin/sh -c) or a list (argv). timeout: seconds
        until SIGKILL. stdin=True keeps a stdin pipe open (Command.write_stdin,
        close_stdin). pty: (cols, rows) to run under a terminal."""
        spec = {"shell": cmd} if isinstance(cmd, str) else {"argv": list(cmd)}
        if env:
            spec["env"] = env
        if cwd:
            spec["cwd"] = cwd
        if user is not None:
            spec["user"] = str(user)
        if stdin:
            spec["stdin"] = True
        if timeout:
            spec["timeout_ms"] = int(timeout * 1000)
        if pty:
            spec["pty"] = {"cols": int(pty[0]), "rows": int(pty[1])}
        if tag:
            spec["tag"] = tag
        return Command(self, CommandInfo(self._dp_json("POST", "/commands", json_body=spec)))

    def run(self, cmd, on_stdout=None, on_stderr=None, *, stdin=None, capture=True, check=False, **kw):
        """Run a command to its end, streaming its output; return a CommandResult.

        on_stdout/on_stderr are called with each chunk (bytes) as it arrives.
        stdin: bytes fed to the command, then closed. capture=False keeps no
        copy of the output (for large outputs handled by the callbacks).
        check=True raises CommandError on a non-zero exit. Other keywords as
        for start()."""
        c = self.start(cmd, stdin=stdin is not None, **kw)
        if stdin is not None:
            for i in range(0, len(stdin), 1 << 20):
                c.write_stdin(stdin[i:i + (1 << 20)])
            c.close_stdin()
        res = c.wait(on_stdout, on_stderr, capture=capture)
        if check and not res.ok:
            raise CommandError(res)
        return res

    def run_code(self, code, *, language=None, context_id=None, env_vars=None, timeout=None,
                 on_stdout=None, on_stderr=None, on_result=None, on_error=None):
        """Run code in the sandbox's code interpreter (template code-interpreter-v1) and return
        an Execution once it has finished.

        Contexts keep their state from one run to the next. language picks that language's
        default context (python when None; javascript, r, bash); context_id a context made with
        the E2B SDK's create_code_context. env_vars apply to this run only. timeout: seconds
        until the run is interrupted (default 300); it then ends with an error named
        TimeoutError. The callbacks get stdout/stderr text, each CodeResult and the CodeError
        as they arrive. An error the code raised is Execution.error, not an exception."""
        body = {"code": code}
        if language:
            body["language"] = language
        if context_id:
            body["context_id"] = context_id
        if env_vars:
            body["env_vars"] = dict(env_vars)
        if timeout:
            body["timeout_ms"] = max(1, int(timeout * 1000))
        ex = Execution()
        # The server sends a comment every 15 s while the code is quiet, so a
        # read timeout of a minute only fires on a dead connection.
        resp = self._dp_request("POST", "/code", json_body=body, headers={"Accept": "text/event-stream"},
                                timeout=60.0, retry=False)
        try:
            for e in sse.parse(iter(resp.readline, b"")):
                data = json.loads(e.data) if e.data else {}
                if e.type == "number_of_executions":
                    ex.execution_count = data.get("execution_count")
                elif e.type in ("stdout", "stderr"):
                    (ex.stdout if e.type == "stdout" else ex.stderr).append(data.get("text", ""))
                    cb = on_stdout if e.type == "stdout" else on_stderr
                    if cb:
                        cb(data.get("text", ""))
                elif e.type == "result":
                    r = CodeResult(data)
                    r.pop("type", None)
                    ex.results.append(r)
                    if on_result:
                        on_result(r)
                elif e.type == "error":
                    data.pop("type", None)
                    ex.error = CodeError(data)
                    if on_error:
                        on_error(ex.error)
                elif e.type == "end_of_execution":
                    return ex
        finally:
            resp.close()
        raise errors.StreamError("run_code: the stream ended before end_of_execution")

    def command(self, command_id):
        """The handle of an earlier command (e.g. to resume its output)."""
        return Command(self, CommandInfo(self._dp_json("GET", f"/commands/{command_id}")))

    def commands(self):
        return [CommandInfo(c) for c in self._dp_json("GET", "/commands").get("commands") or []]

    # --- forwarded ports ----------------------------------------------------------------------

    def list_ports(self):
        """The TCP ports something listens on inside the sandbox, as Port records
        (port, address, family, url, path_url)."""
        return [Port(p) for p in self._dp_json("GET", "/ports").get("ports") or []]

    def wait_for_port(self, port, timeout=60.0):
        """Wait until something listens on port inside the sandbox; return its Port record.

        The server holds each request up to a minute; raises Timeout after timeout seconds."""
        port = _check_port(port)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise errors.Timeout(f"sandbox {self.id}: nothing listened on port {port} within {timeout:g}s")
            wait = min(left, 60.0)
            try:
                ans = self._dp_json("GET", "/ports", query={"wait": port, "timeout_ms": int(wait * 1000)},
                                    timeout=wait + self.client.timeout)
            except errors.DeadlineExceeded as e:
                if e.code == "port_timeout":
                    continue
                raise
            for p in ans.get("ports") or []:
                if p.get("port") == port:
                    return Port(p)

    def port_url(self, port, path=False):
        """The URL of a forwarded port, built from the session (no request).

        Host form "<scheme>://PORT-<id>.<domain>/" (needs wildcard DNS for the domain;
        *.localhost resolves to loopback in browsers), or with path=True the path form
        "<data_url>/v1/sandboxes/<id>/ports/PORT/". A private sandbox's port also needs
        the session token (header X-Access-Token; port_request sends it) or a signed URL."""
        port = _check_port(port)
        sess = self.session
        data_url = (self.client.data_url or sess["data_url"]).rstrip("/")
        if path:
            return f"{data_url}/v1/sandboxes/{self.id}/ports/{port}/"
        u = urllib.parse.urlsplit(data_url)
        domain = sess.get("domain") or _default_domain(u)
        return f"{u.scheme}://{port}-{self.id}.{domain}/"

    def signed_port_url(self, port, ttl=None):
        """A URL that opens port (only) without any other credential for ttl seconds
        (None: the server's default, an hour; at most 7 days): for a browser preview.
        Returns a SignedURL record: url (host form), path_url, token, expires_at."""
        port = _check_port(port)
        body = {} if ttl is None else {"ttl_seconds": max(1, int(-(-ttl // 1)))}
        return SignedURL(self.client._http.json("POST", f"/v1/sandboxes/{self.id}/ports/{port}/url",
                                                json_body=body))

    def port_request(self, port, path="/", method="GET", body=None, headers=None, timeout=None):
        """Send one HTTP request to a forwarded port through the data plane, with the
        session token and no wildcard DNS (the request goes to the data plane's address
        with the port's host name). Returns the open Response (status, headers, read(),
        iter_chunks(), json(), close(); a context manager) for any status: the sandbox
        server's answers are not errors."""
        port = _check_port(port)
        if not path.startswith("/"):
            raise ValueError("path must start with /")
        sess = self.session
        data_url = (self.client.data_url or sess["data_url"]).rstrip("/")
        u = urllib.parse.urlsplit(data_url)
        host = urllib.parse.urlsplit(self.port_url(port)).netloc
        t = self.client.timeout if timeout is None else timeout
        if u.scheme == "https":
            # The certificate is the sandbox domain's: check it against the port's name.
            conn = _PortHTTPSConnection(u.hostname, u.port, urllib.parse.urlsplit("//" + host).hostname,
                                        timeout=t, context=self.client._ssl or ssl.create_default_context())
        else:
            conn = http.client.HTTPConnection(u.hostname, u.port, timeout=t)
        if isinstance(body, str):
            body = body.encode()
        h = {"Host": host, "User-Agent": USER_AGENT, "X-Access-Token": sess["token"], **(headers or {})}
        try:
            conn.request(method, path, body=body, headers=h)
            return Response(conn, conn.getresponse(), method, f"{self.port_url(port)}{path[1:]}".split("?", 1)[0])
        except NETWORK_ERRORS as e:
            conn.close()
            raise errors.ConnectionFailed(f"{type(e).__name__}: {e}", method=method, url=f"port {port}{path}") from e


def _check_port(port):
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"invalid port {port!r}: want 1-65535")
    return port


def _default_domain(u):
    """The server's default sandbox domain for a session that names none."""
    host, port = u.hostname or "localhost", u.port
    try:
        ipaddress.ip_address(host)
        host = "localhost"
    except ValueError:
        pass
    if port is None or (u.scheme, port) in (("http", 80), ("https", 443)):
        return host
    return f"{host}:{port}"


class _PortHTTPSConnection(http.client.HTTPSConnection):
    """TLS to the data plane's address, verified against another name (the port's host)."""

    def __init__(self, host, port, server_name, **kw):
        super().__init__(host, port, **kw)
        self._server_name = server_name

    def connect(self):
        sock = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self._server_name)


class CommandError(errors.SpaceError):
    """run(check=True) of a command that did not exit 0; result is its CommandResult."""

    def __init__(self, result):
        super().__init__(f"command {result.command_id} failed: {result!r}")
        self.result = result


class Command:
    """A command started in a sandbox."""

    def __init__(self, sandbox, info):
        self.sandbox = sandbox
        self.info = info
        self.id = info["id"]
        self.pid = info.get("pid")

    def __repr__(self):
        return f"Command({self.id!r}, sandbox={self.sandbox.id!r})"

    def refresh(self):
        self.info = CommandInfo(self.sandbox._dp_json("GET", f"/commands/{self.id}"))
        return self.info

    def write_stdin(self, data):
        if isinstance(data, str):
            data = data.encode()
        self.sandbox._dp_request("POST", f"/commands/{self.id}/stdin", body=bytes(data),
                                 content_type="application/octet-stream").close()

    def close_stdin(self):
        self.sandbox._dp_request("POST", f"/commands/{self.id}/stdin/close").close()

    def signal(self, sig="SIGTERM"):
        """Send a signal: a name ("SIGTERM", "TERM") or a number."""
        self.sandbox._dp_request("POST", f"/commands/{self.id}/signal", json_body={"signal": sig}).close()

    def kill(self):
        self.signal("SIGKILL")

    def resize(self, cols, rows):
        self.sandbox._dp_request("POST", f"/commands/{self.id}/resize",
                                 json_body={"cols": int(cols), "rows": int(rows)}).close()

    def stream(self, after=0, max_failures=10, idle_timeout=60.0):
        """The command's output as an OutputStream (an iterator of OutputEvents ending with
        the exit event). Dropped connections are resumed with Last-Event-ID, so
        nothing is lost or repeated; after resumes after that sequence number."""
        return OutputStream(self, after, max_failures, idle_timeout)

    def wait(self, on_stdout=None, on_stderr=None, capture=True, after=0):
        """Follow the output to the exit event; return a CommandResult."""
        out, err = [], []
        for ev in self.stream(after=after):
            if ev.type == "stdout":
                if on_stdout:
                    on_stdout(ev.data)
                if capture:
                    out.append(ev.data)
            elif ev.type == "stderr":
                if on_stderr:
                    on_stderr(ev.data)
                if capture:
                    err.append(ev.data)
            elif ev.type == "exit":
                return CommandResult(self.id, ev.data, b"".join(out), b"".join(err))
        raise errors.StreamError(f"command {self.id}: output ended without an exit event")


class OutputStream:
    """Iterator over a command's output events, reconnecting on its own.

    last_event_id is the sequence number of the last event delivered;
    reconnects counts resumed connections; drop() cuts the current connection
    (as a network failure would) -- the next read resumes after last_event_id."""

    def __init__(self, command, after, max_failures, idle_timeout):
        self.command = command
        self.last_event_id = int(after or 0)
        self.reconnects = 0
        self.max_failures = max_failures
        self.idle_timeout = idle_timeout
        self._resp = None
        self._gen = self._events()
        self.done = False

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._gen)

    def drop(self):
        r = self._resp
        if r is not None:
            r.abort()

    def close(self):
        self._gen.close()

    def _open(self):
        sb = self.command.sandbox
        hdr = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
        if self.last_event_id:
            hdr["Last-Event-ID"] = str(self.last_event_id)
        return sb._dp_request("GET", f"/commands/{self.command.id}/events", headers=hdr,
                              timeout=self.idle_timeout, retry=False)

    def _events(self):
        failures, first = 0, True
        while not self.done:
            if not first:
                self.reconnects += 1
            first = False
            progressed = False
            try:
                self._resp = self._open()
                try:
                    for e in sse.parse(iter(self._resp.readline, b"")):
                        ev = self._decode(e)
                        if ev is None:
                            continue
                        progressed = True
                        if ev.seq:
                            self.last_event_id = ev.seq
                        if ev.type == "exit":
                            self.done = True
                        yield ev
                        if self.done:
                            return
                finally:
                    r, self._resp = self._resp, None
                    r.close()
            except (errors.ConnectionFailed, errors.Unavailable, errors.InternalError) + NETWORK_ERRORS as e:
                last = e
            else:
                last = errors.StreamError("stream ended before the exit event")
            failures = 0 if progressed else failures + 1
            if failures > self.max_failures:
                raise errors.StreamError(f"command {self.command.id}: output stream lost after "
                                         f"{failures} attempts: {last}") from (last if isinstance(last, BaseException) else None)
            time.sleep(min(0.05 * 2 ** failures, 2.0))

    @staticmethod
    def _decode(e):
        seq = int(e.id) if e.id.isdigit() else 0
        if e.type in ("stdout", "stderr"):
            return OutputEvent(seq, e.type, base64.b64decode(e.data))
        if e.type in ("exit", "dropped"):
            # dropped: output the server's bound no longer kept
            # ({"dropped_events", "dropped_bytes", "first_seq"}).
            return OutputEvent(seq, e.type, json.loads(e.data) if e.data else {})
        return None


class Files:
    """A sandbox's files (paths are absolute inside the sandbox). Bodies are streamed.

    Calls act as the sandbox's default user (the template's, else root) unless
    user is given: a name from the sandbox's /etc/passwd or a numeric uid. They
    then have that user's permissions (PermissionDenied where it may not read or
    write) and what they create belongs to it. sandbox.files.as_user("root")
    returns such a view."""

    def __init__(self, sandbox, user=None):
        self._sb = sandbox
        self.user = user

    def as_user(self, user):
        """These files as seen by user (a name or uid) inside the sandbox."""
        return Files(self._sb, user)

    def _q(self, **q):
        if self.user is not None:
            q["user"] = str(self.user)
        return q

    def upload(self, path, data, mode=None):
        """Create or replace a file. data: bytes/str, a binary file object or an iterable
        of bytes chunks (streamed, never held in memory whole). mode: e.g. 0o755."""
        if isinstance(data, str):
            data = data.encode()
        q = self._q(path=path)
        if mode is not None:
            q["mode"] = format(mode, "o") if isinstance(mode, int) else mode
        self._sb._dp_request("PUT", "/files", query=q, body=data, content_type="application/octet-stream",
                             timeout=max(self._sb.client.timeout, 300)).close()

    def upload_file(self, local_path, path, mode=None):
        with open(local_path, "rb") as f:
            self.upload(path, f, mode)

    write = upload

    def download(self, path, dest=None, chunk_size=1 << 20):
        """Read a file. Without dest: return its bytes. With dest (a writable binary file
        object): stream into it and return the byte count."""
        resp = self._sb._dp_request("GET", "/files", query=self._q(path=path), timeout=max(self._sb.client.timeout, 300))
        if dest is None:
            with resp:
                return resp.read()
        n = 0
        for chunk in resp.iter_chunks(chunk_size):
            dest.write(chunk)
            n += len(chunk)
        return n

    def download_file(self, path, local_path):
        with open(local_path, "wb") as f:
            return self.download(path, f)

    def open_stream(self, path):
        """The open download Response (read()/iter_chunks()/close()) for custom streaming."""
        return self._sb._dp_request("GET", "/files", query=self._q(path=path), timeout=max(self._sb.client.timeout, 300))

    def read(self, path):
        return self.download(path)

    def read_text(self, path, encoding="utf-8"):
        return self.download(path).decode(encoding)

    def write_text(self, path, text, encoding="utf-8", mode=None):
        self.upload(path, text.encode(encoding), mode)

    def list(self, path):
        return [FileInfo(e) for e in self._sb._dp_json("GET", "/files/list", query=self._q(path=path)).get("entries") or []]

    def stat(self, path):
        return FileInfo(self._sb._dp_json("GET", "/files/stat", query=self._q(path=path)))

    def exists(self, path):
        try:
            self.stat(path)
            return True
        except errors.NotFound:
            return False

    def mkdir(self, path):
        self._sb._dp_request("POST", "/files/mkdir", query=self._q(), json_body={"path": path}).close()

    def move(self, src, dst):
        self._sb._dp_request("POST", "/files/move", query=self._q(), json_body={"from": src, "to": dst}).close()

    rename = move

    def remove(self, path, recursive=False):
        q = self._q(path=path)
        if recursive:
            q["recursive"] = "true"
        self._sb._dp_request("DELETE", "/files", query=q).close()


def _write_context_tar(context_dir, out):
    """Write context_dir as a build-context tar to out: directories, regular
    files and symlinks (not followed) with their permission bits, owned by
    root; other file types are skipped."""
    root = os.path.abspath(context_dir)
    if not os.path.isdir(root):
        raise ValueError(f"build context {context_dir!r} is not a directory")

    def add(tw, path, arc):
        st = os.lstat(path)
        ti = tarfile.TarInfo(arc)
        ti.mode, ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = stat.S_IMODE(st.st_mode), int(st.st_mtime), 0, 0, "", ""
        if stat.S_ISDIR(st.st_mode):
            ti.type = tarfile.DIRTYPE
            tw.addfile(ti)
        elif stat.S_ISLNK(st.st_mode):
            ti.type, ti.linkname = tarfile.SYMTYPE, os.readlink(path)
            tw.addfile(ti)
        elif stat.S_ISREG(st.st_mode):
            ti.size = st.st_size
            with open(path, "rb") as f:
                tw.addfile(ti, f)

    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tw:
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            dirnames.sort()
            rel = os.path.relpath(dirpath, root)
            if rel != ".":
                add(tw, dirpath, rel.replace(os.sep, "/"))
            for n in sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]):
                p = os.path.join(dirpath, n)
                arc = n if rel == "." else rel.replace(os.sep, "/") + "/" + n
                add(tw, p, arc)
