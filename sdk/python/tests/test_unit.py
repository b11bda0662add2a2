"""Offline tests: SSE parsing and error mapping (no server needed)."""

import unittest

import space_sandbox as space
from space_sandbox import errors, sse


class SSETest(unittest.TestCase):
    def test_parse(self):
        raw = [b": keep-alive\n", b"id: 1\n", b"event: stdout\n", b"data: aGk=\n", b"\n",
               b"data: a\n", b"data: b\r\n", b"\r\n", b"id: 3\n", b"event: exit\n", b"data: {}\n", b"\n"]
        evs = list(sse.parse(raw))
        self.assertEqual([(e.id, e.type, e.data) for e in evs],
                         [("1", "stdout", "aGk="), ("1", "message", "a\nb"), ("3", "exit", "{}")])

    def test_partial_event_is_dropped(self):
        raw = [b"id: 1\n", b"event: stdout\n", b"data: aGk=\n", b"\n", b"id: 2\n", b"event: stdout\n", b"data: aG"]
        self.assertEqual([e.id for e in sse.parse(raw)], ["1"])
        raw = [b"id: 1\n", b"event: stdout\n", b"data: aGk=\n"]  # no blank line: not dispatched
        self.assertEqual(list(sse.parse(raw)), [])


class DecodeTest(unittest.TestCase):
    def test_dropped_marker(self):
        from space_sandbox.client import OutputStream
        ev = OutputStream._decode(sse.Event("90", "dropped", '{"dropped_events":90,"dropped_bytes":360000,"first_seq":91}'))
        self.assertEqual((ev.seq, ev.type, ev.data["first_seq"]), (90, "dropped", 91))
        self.assertIsNone(OutputStream._decode(sse.Event("5", "future", "x")))


class ErrorsTest(unittest.TestCase):
    def test_mapping(self):
        cases = [(404, "not_found", space.NotFound), (401, "token_expired", space.TokenExpired),
                 (409, "sandbox_paused", space.SandboxPaused), (409, "no_stdin", space.Conflict),
                 (400, "unknown_field", space.InvalidArgument), (410, "events_gone", space.Gone),
                 (429, "resource_exhausted", space.ResourceExhausted), (503, "", space.Unavailable),
                 (418, "teapot", space.APIError)]
        for status, code, cls in cases:
            e = errors.error_for(status, code, "m")
            self.assertIs(type(e), cls, (status, code))
            self.assertIsInstance(e, space.SpaceError)
        self.assertTrue(issubclass(space.TokenExpired, space.Unauthorized))
        self.assertTrue(issubclass(space.SandboxPaused, space.Conflict))

    def test_client_needs_key(self):
        import os
        old = os.environ.pop("SPACE_API_KEY", None)
        try:
            with self.assertRaises(ValueError):
                space.Client("http://127.0.0.1:1")
        finally:
            if old is not None:
                os.environ["SPACE_API_KEY"] = old


class PortURLTest(unittest.TestCase):
    def _sb(self, data_url, domain):
        from space_sandbox.client import Sandbox
        c = space.Client("http://127.0.0.1:1", "k")
        sess = space.Session({"token": "t", "data_url": data_url, **({"domain": domain} if domain else {})})
        return Sandbox(c, space.SandboxInfo({"id": "sbx-1"}), sess)

    def test_port_url(self):
        for data_url, domain, want in [
                ("http://127.0.0.1:3001", "localhost:3001", "http://8000-sbx-1.localhost:3001/"),
                ("https://data.example.com/", "sbx.example.com", "https://8000-sbx-1.sbx.example.com/"),
                ("http://127.0.0.1:3001", None, "http://8000-sbx-1.localhost:3001/"),
                ("https://data.example.com:443", None, "https://8000-sbx-1.data.example.com/")]:
            self.assertEqual(self._sb(data_url, domain).port_url(8000), want)
        sb = self._sb("http://d:1/", "x")
        self.assertEqual(sb.port_url(80, path=True), "http://d:1/v1/sandboxes/sbx-1/ports/80/")
        for bad in (0, 65536, "80", True, None):
            with self.assertRaises(ValueError):
                sb.port_url(bad)


if __name__ == "__main__":
    unittest.main()


class RunCodeTest(unittest.TestCase):
    """run_code against a fake of the data plane's POST /v1/sandboxes/{id}/code."""

    def test_run_code(self):
        import http.server
        import json
        import threading

        seen = {}
        events = [
            ("number_of_executions", {"type": "number_of_executions", "execution_count": 2}),
            ("stdout", {"type": "stdout", "text": "hi\n", "timestamp": "t"}),
            ("result", {"type": "result", "is_main_result": False, "png": "iVBO"}),
            ("result", {"type": "result", "is_main_result": True, "text": "2", "html": "<b>2</b>"}),
            ("error", {"type": "error", "name": "ZeroDivisionError", "value": "division by zero", "traceback": "tb"}),
            ("end_of_execution", {"type": "end_of_execution"}),
        ]

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                seen["path"] = self.path
                seen["auth"] = self.headers.get("Authorization")
                seen["body"] = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                self.wfile.write(b": keepalive\n\n")
                for name, ev in events[:-1 if seen["body"]["code"] == "cut" else None]:
                    self.wfile.write(f"event: {name}\ndata: {json.dumps(ev)}\n\n".encode())

        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        self.addCleanup(srv.server_close)
        self.addCleanup(srv.shutdown)
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        sb = space.Sandbox(space.Client(url, "k"), {"id": "sbx-1"}, {"token": "tok", "data_url": url})
        out = []
        ex = sb.run_code("1+1", language="r", env_vars={"A": "b"}, timeout=2.5, on_stdout=out.append)
        self.assertEqual(seen["path"], "/v1/sandboxes/sbx-1/code")
        self.assertEqual(seen["auth"], "Bearer tok")
        self.assertEqual(seen["body"], {"code": "1+1", "language": "r", "env_vars": {"A": "b"}, "timeout_ms": 2500})
        self.assertEqual((ex.text, ex.execution_count, ex.stdout, out), ("2", 2, ["hi\n"], ["hi\n"]))
        self.assertEqual(ex.results[0].png, "iVBO")
        self.assertEqual(ex.results[1].formats(), ["text", "html"])
        self.assertEqual((ex.error.name, ex.error.value), ("ZeroDivisionError", "division by zero"))
        with self.assertRaises(space.StreamError):
            sb.run_code("cut")
