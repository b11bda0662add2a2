"""A small HTTP/1.1 transport on http.client: JSON, streamed bodies, typed errors, retries."""

import http.client
import json
import os
import socket
import ssl
import stat
import time
import urllib.parse

from . import errors

USER_AGENT = "space-sandbox-python"

# Errors that mean "no usable answer": worth a retry for idempotent requests.
NETWORK_ERRORS = (OSError, http.client.HTTPException)


class Response:
    """An open HTTP answer. Read it, iterate it line by line, or close it."""

    def __init__(self, conn, resp, method, url):
        self._conn = conn
        self._resp = resp
        self.status = resp.status
        self.headers = resp.headers
        self.method = method
        self.url = url

    def read(self, n=-1):
        return self._resp.read() if n is None or n < 0 else self._resp.read(n)

    def readline(self, limit=-1):
        return self._resp.readline(limit)

    def json(self):
        with self:
            raw = self._resp.read()
        return json.loads(raw) if raw else None

    def iter_chunks(self, size=1 << 20):
        with self:
            while True:
                b = self._resp.read(size)
                if not b:
                    return
                yield b

    def abort(self):
        """Cut the connection at once (as a network failure would)."""
        sock = getattr(self._conn, "sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        try:
            self._resp.close()
        finally:
            self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Transport:
    """Requests to one base URL with fixed headers (credentials)."""

    def __init__(self, base_url, headers, timeout=60.0, retries=3, ssl_context=None):
        u = urllib.parse.urlsplit(base_url.rstrip("/"))
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"bad URL {base_url!r}: want http(s)://host[:port]")
        self.base_url = base_url.rstrip("/")
        self._scheme = u.scheme
        self._host = u.hostname
        self._port = u.port
        self._prefix = u.path.rstrip("/")
        self.headers = dict(headers)
        self.timeout = timeout
        self.retries = retries
        self._ssl = ssl_context

    def _connect(self, timeout):
        if self._scheme == "https":
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout,
                                               context=self._ssl or ssl.create_default_context())
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def url(self, path, query=None):
        q = ""
        if query:
            q = "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None}, doseq=True)
        return self._prefix + path + q

    def request(self, method, path, query=None, body=None, json_body=None, headers=None,
                timeout=None, retry=None, content_type=None):
        """Send one request; return the open Response on 2xx, raise a typed error otherwise.

        body: bytes, a readable binary file object (streamed) or an iterable of
        bytes (sent chunked). json_body: a value to encode as JSON. retry:
        whether a failed connection may be retried (default: GET/HEAD, or any
        request with an Idempotency-Key)."""
        h = {"User-Agent": USER_AGENT, **self.headers, **(headers or {})}
        if json_body is not None:
            body = json.dumps(json_body).encode()
            h["Content-Type"] = "application/json"
        elif body is not None and content_type:
            h["Content-Type"] = content_type
        chunked = False
        if body is not None and not isinstance(body, (bytes, bytearray, memoryview)):
            size = _file_size(body)
            if size is not None:
                h["Content-Length"] = str(size)
            else:
                chunked = True
                h["Transfer-Encoding"] = "chunked"
        if retry is None:
            retry = method in ("GET", "HEAD") or "Idempotency-Key" in h
        # A streamed body cannot be replayed unless it can seek back.
        rewind = None
        if body is not None and hasattr(body, "read"):
            try:
                rewind = body.tell()
            except (OSError, AttributeError):
                retry = False
        elif chunked:
            retry = False
        target = self.url(path, query)
        full = self.base_url + target[len(self._prefix):]
        attempt = 0
        while True:
            attempt += 1
            conn = self._connect(self.timeout if timeout is None else timeout)
            try:
                conn.putrequest(method, target, skip_accept_encoding=True)
                for k, v in h.items():
                    conn.putheader(k, v)
                if body is None and method in ("POST", "PUT", "PATCH"):
                    conn.putheader("Content-Length", "0")
                elif isinstance(body, (bytes, bytearray, memoryview)):
                    conn.putheader("Content-Length", str(len(body)))
                conn.endheaders()
                if body is not None:
                    _send_body(conn, body, chunked)
                resp = conn.getresponse()
            except NETWORK_ERRORS as e:
                conn.close()
                if retry and attempt <= self.retries:
                    if rewind is not None:
                        body.seek(rewind)
                    time.sleep(min(0.1 * 2 ** attempt, 2.0))
                    continue
                raise errors.ConnectionFailed(f"{type(e).__name__}: {e}", method=method, url=_redact(full)) from e
            if resp.status >= 400:
                raw = b""
                try:
                    raw = resp.read(64 << 10)
                except NETWORK_ERRORS:
                    pass
                finally:
                    conn.close()
                code, msg = "", raw.decode("utf-8", "replace").strip()
                try:
                    env = json.loads(raw)["error"]
                    code, msg = env.get("code", ""), env.get("message", "")
                except (ValueError, KeyError, TypeError, AttributeError):
                    pass
                err = errors.error_for(resp.status, code, msg or resp.reason, method, _redact(full))
                if isinstance(err, errors.Unavailable) and retry and attempt <= self.retries:
                    if rewind is not None:
                        body.seek(rewind)
                    time.sleep(min(0.2 * 2 ** attempt, 3.0))
                    continue
                raise err
            return Response(conn, resp, method, _redact(full))

    def json(self, method, path, **kw):
        return self.request(method, path, **kw).json()


def _file_size(body):
    if hasattr(body, "read"):
        try:
            fd = body.fileno()
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode):
                return st.st_size - body.tell()
        except (OSError, AttributeError, ValueError):
            pass
        getbuf = getattr(body, "getbuffer", None)  # io.BytesIO
        if getbuf is not None:
            return len(getbuf()) - body.tell()
    return None


def _send_body(conn, body, chunked):
    if isinstance(body, (bytes, bytearray, memoryview)):
        conn.send(body)
        return
    if hasattr(body, "read"):
        chunks = iter(lambda: body.read(1 << 20), b"")
    else:
        chunks = iter(body)
    for c in chunks:
        if not c:
            continue
        if chunked:
            conn.send(b"%x\r\n" % len(c) + bytes(c) + b"\r\n")
        else:
            conn.send(c)
    if chunked:
        conn.send(b"0\r\n\r\n")


def _redact(url):
    return url.split("?", 1)[0]
