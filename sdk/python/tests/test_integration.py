"""The SDK against a real SPACE server.

Needs SPACE_URL and SPACE_API_KEY (skipped otherwise); SPACE_TEST_TEMPLATE
names the template (default: minimal). test/pysdk in the repository starts a
server and runs this suite:  python3 -m unittest discover -s tests -v"""

import hashlib
import os
import socket
import tempfile
import threading
import unittest
import uuid

import space_sandbox as space

URL = os.environ.get("SPACE_URL", "")
KEY = os.environ.get("SPACE_API_KEY", "")
TEMPLATE = os.environ.get("SPACE_TEST_TEMPLATE", "minimal")


@unittest.skipUnless(URL and KEY, "set SPACE_URL and SPACE_API_KEY to run against a server")
class IntegrationTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.client = space.Client(URL, KEY)
        cls.sb = cls.client.create_sandbox(TEMPLATE, metadata={"suite": "pysdk"})

    @classmethod
    def tearDownClass(cls):
        try:
            cls.sb.delete()
        except space.NotFound:
            pass

    def test_create_get_list_delete(self):
        sb = self.client.create_sandbox(TEMPLATE, metadata={"case": "lifecycle"}, timeout_seconds=600)
        self.assertEqual(sb.state, "running")
        self.assertRegex(sb.id, r"^sbx-[0-9a-f]{16}$")
        self.assertEqual(sb.operation.kind, "sandbox.create")
        got = self.client.get_sandbox(sb.id)
        self.assertEqual(got.info.metadata, {"case": "lifecycle"})
        # A handle from get_sandbox issues its own session for the data plane.
        self.assertEqual(got.run(["echo", "via get"]).stdout, b"via get\n")
        ids = [s.id for s in self.client.list_sandboxes(metadata={"case": "lifecycle"})]
        self.assertIn(sb.id, ids)
        self.assertNotIn(self.sb.id, ids)
        info = sb.set_timeout(1200)
        self.assertTrue(info.expires_at)
        op = sb.delete()
        self.assertEqual(op.state, "succeeded")
        self.assertNotIn(sb.id, [s.id for s in self.client.list_sandboxes(metadata={"case": "lifecycle"})])

    def test_readme_first_example(self):
        """The README's first Python example runs as written (in a scratch directory)."""
        readme = os.path.join(os.path.dirname(__file__), "..", "README.md")
        with open(readme) as f:
            text = f.read()
        code = text.split("```python\n", 1)[1].split("```", 1)[0]
        code = code.replace('create_sandbox("minimal")', f"create_sandbox({TEMPLATE!r})")
        cwd = os.getcwd()
        with tempfile.TemporaryDirectory() as d:
            os.chdir(d)
            try:
                exec(compile(code, "sdk/python/README.md", "exec"), {"__name__": "readme"})
                self.assertTrue(os.path.exists("copy.bin"))
            finally:
                os.chdir(cwd)

    def test_files_as_user(self):
        """File calls act as the sandbox's default user unless as_user names another."""
        default = self.sb.run(["id", "-un"]).stdout.decode().strip()
        root = self.sb.files.as_user("root")
        root.write_text("/tmp/by-root", "r")
        self.sb.files.write_text("/tmp/by-default", "d")
        out = self.sb.run("stat -c %U /tmp/by-root /tmp/by-default").stdout.decode().split()
        self.assertEqual(out, ["root", default])
        root.mkdir("/root/private")
        if default != "root":
            with self.assertRaises(space.Forbidden):
                self.sb.files.write_text("/root/private/x", "no")
        self.assertEqual(self.sb.files.as_user(0).stat("/root/private").type, "dir")

    def test_context_manager_deletes(self):
        with self.client.create_sandbox(TEMPLATE) as sb:
            self.assertTrue(sb.run("true").ok)
        self.assertIn(self.client.get_sandbox(sb.id).state, ("deleted",))

    def test_create_without_wait(self):
        sb = self.client.create_sandbox(TEMPLATE, wait=False)
        self.assertEqual(sb.state, "creating")
        op = self.client.wait_operation(sb.operation.id)
        self.assertEqual(op.state, "succeeded")
        self.assertEqual(sb.refresh().state, "running")
        sb.delete()

    def test_run_streams_stdout_and_stderr(self):
        out, err = [], []
        res = self.sb.run("for i in 1 2 3; do echo out$i; echo err$i >&2; done; exit 7",
                          on_stdout=out.append, on_stderr=err.append)
        self.assertEqual(res.exit_code, 7)
        self.assertFalse(res.ok)
        self.assertEqual(b"".join(out), b"out1\nout2\nout3\n")
        self.assertEqual(b"".join(err), b"err1\nerr2\nerr3\n")
        self.assertEqual(res.stdout, b"out1\nout2\nout3\n")
        self.assertEqual(res.stderr, b"err1\nerr2\nerr3\n")

    def test_run_argv_env_cwd_and_check(self):
        res = self.sb.run(["sh", "-c", 'echo "$GREETING $(pwd)"'], env={"GREETING": "hi"}, cwd="/tmp")
        self.assertEqual(res.text, "hi /tmp\n")
        with self.assertRaises(space.CommandError) as cm:
            self.sb.run("exit 3", check=True)
        self.assertEqual(cm.exception.result.exit_code, 3)

    def test_stdin_and_signal(self):
        res = self.sb.run(["cat"], stdin=b"x" * 3_000_000)
        self.assertEqual(len(res.stdout), 3_000_000)
        c = self.sb.start(["cat"], stdin=True)
        c.write_stdin("hello ")
        c.write_stdin(b"world")
        c.close_stdin()
        self.assertEqual(c.wait().stdout, b"hello world")
        c = self.sb.start("sleep 300")
        c.signal("SIGTERM")
        res = c.wait()
        self.assertEqual((res.exit_code, res.signal), (-1, "SIGTERM"))
        res = self.sb.run("sleep 300", timeout=0.5)
        self.assertTrue(res.timed_out)
        self.assertEqual(res.signal, "SIGKILL")

    def test_stream_events_and_resume_from_position(self):
        c = self.sb.start("echo one; echo two >&2; echo three")
        events = list(c.stream())
        self.assertEqual(events[-1].type, "exit")
        self.assertEqual([e.seq for e in events], list(range(1, len(events) + 1)))
        # A new stream after event 1 yields exactly the rest.
        rest = list(self.sb.command(c.id).stream(after=events[0].seq))
        self.assertEqual([(e.seq, e.type, e.data) for e in rest], [(e.seq, e.type, e.data) for e in events[1:]])

    def test_dropped_stream_resumes_without_loss(self):
        # Output arrives in bursts while the command runs; the connection is cut
        # several times while it is still producing.
        script = ('i=0; while [ $i -lt 30 ]; do j=0; while [ $j -lt 200 ]; do echo "line $i.$j"; j=$((j+1)); done; '
                  'i=$((i+1)); sleep 0.05; done')
        want = "".join(f"line {i}.{j}\n" for i in range(30) for j in range(200)).encode()
        c = self.sb.start(script)
        stream = c.stream()
        got, seqs, dropped = [], [], set()
        for ev in stream:
            seqs.append(ev.seq)
            if ev.type == "stdout":
                got.append(ev.data)
            if len(dropped) < 3 and stream.reconnects not in dropped:
                # Cut each of the first three connections after its first event, as
                # a network failure would; what it had buffered is still delivered,
                # then the stream reconnects with Last-Event-ID.
                dropped.add(stream.reconnects)
                stream.drop()
        self.assertEqual(seqs, list(range(1, len(seqs) + 1)), "events lost or repeated")
        self.assertEqual(b"".join(got), want)
        self.assertGreaterEqual(stream.reconnects, 3)
        self.assertEqual(ev.type, "exit")
        self.assertEqual(ev.data.get("exit_code"), 0)

    def test_stream_cut_mid_event_by_proxy_resumes(self):
        # A proxy in front of the data plane cuts each of the first connections
        # after a few kilobytes -- in the middle of an event.
        data_host, data_port = _host_port(self.sb.session["data_url"])
        proxy = _CuttingProxy(data_host, data_port, cut_after=[])
        try:
            client = space.Client(URL, KEY, data_url=f"http://127.0.0.1:{proxy.port}")
            sb = client.get_sandbox(self.sb.id)
            c = sb.start("i=0; while [ $i -lt 20000 ]; do echo \"row $i\"; i=$((i+1)); done")
            proxy.cut_after = [700, 5000, 12345]  # only the event streams' connections are cut
            stream = c.stream()
            out = b"".join(ev.data for ev in stream if ev.type == "stdout")
            self.assertEqual(out, "".join(f"row {i}\n" for i in range(20000)).encode())
            self.assertEqual(proxy.cuts, 3)
            self.assertGreaterEqual(stream.reconnects, 3)
        finally:
            proxy.close()

    def test_files_50mb_up_and_down_streamed(self):
        size = 50 * 1024 * 1024
        with tempfile.TemporaryDirectory() as d:
            src, dst = os.path.join(d, "up.bin"), os.path.join(d, "down.bin")
            h = hashlib.sha256()
            with open(src, "wb") as f:
                for _ in range(50):
                    block = os.urandom(1 << 20)
                    h.update(block)
                    f.write(block)
            self.sb.files.upload_file(src, "/tmp/big.bin")
            st = self.sb.files.stat("/tmp/big.bin")
            self.assertEqual((st.size, st.type), (size, "file"))
            res = self.sb.run("sha256sum /tmp/big.bin")
            self.assertEqual(res.text.split()[0], h.hexdigest())
            n = self.sb.files.download_file("/tmp/big.bin", dst)
            self.assertEqual(n, size)
            h2 = hashlib.sha256()
            with open(dst, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h2.update(block)
            self.assertEqual(h2.hexdigest(), h.hexdigest())
        self.sb.files.remove("/tmp/big.bin")

    def test_files_chunked_upload_and_operations(self):
        chunks = (bytes([i]) * 65536 for i in range(64))  # a generator: sent chunked
        self.sb.files.upload("/tmp/gen.bin", chunks, mode=0o600)
        st = self.sb.files.stat("/tmp/gen.bin")
        self.assertEqual((st.size, st.mode & 0o777), (64 * 65536, 0o600))
        self.sb.files.mkdir("/tmp/d1/d2")
        self.sb.files.write_text("/tmp/d1/d2/a.txt", "alpha")
        self.assertTrue(self.sb.files.stat("/tmp/d1/d2").is_dir)
        self.assertEqual([e.name for e in self.sb.files.list("/tmp/d1/d2")], ["a.txt"])
        self.sb.files.move("/tmp/d1/d2/a.txt", "/tmp/d1/b.txt")
        self.assertEqual(self.sb.files.read_text("/tmp/d1/b.txt"), "alpha")
        self.assertFalse(self.sb.files.exists("/tmp/d1/d2/a.txt"))
        with self.assertRaises(space.Conflict) as cm:
            self.sb.files.remove("/tmp/d1")  # not empty, not recursive
        self.assertEqual(cm.exception.code, "not_empty")
        self.sb.files.remove("/tmp/d1", recursive=True)
        self.assertFalse(self.sb.files.exists("/tmp/d1"))

    def test_errors_are_typed(self):
        with self.assertRaises(space.NotFound) as cm:
            self.client.get_sandbox("sbx-0000000000000000")
        self.assertEqual((cm.exception.status, cm.exception.code), (404, "not_found"))
        with self.assertRaises(space.Unauthorized):
            space.Client(URL, "space_not_a_key").list_sandboxes()
        with self.assertRaises(space.InvalidArgument) as cm:
            self.client.create_sandbox("Not A Template Name")
        self.assertEqual(cm.exception.code, "invalid_argument")
        with self.assertRaises(space.InvalidArgument):
            self.client.create_sandbox(TEMPLATE, limits={"memory_bytes": 1})
        with self.assertRaises(space.NotFound):
            self.client.create_sandbox("no-such-template")
        with self.assertRaises(space.NotFound):
            self.sb.files.read("/no/such/file")
        with self.assertRaises(space.NotFound):
            self.sb.command("999999")
        c = self.sb.start("true")
        c.wait()
        with self.assertRaises(space.Conflict):
            c.write_stdin(b"too late")
        with self.assertRaises(space.ConnectionFailed):
            space.Client("http://127.0.0.1:9", KEY, retries=0).list_sandboxes()
        # Every typed error is a SpaceError.
        self.assertTrue(issubclass(space.NotFound, space.SpaceError))

    def test_pause_resume_snapshot_fork(self):
        sb = self.client.create_sandbox(TEMPLATE)
        try:
            sb.files.mkdir("/home/user/data")  # not /tmp: a driver may mount a tmpfs there, outside snapshots
            sb.files.write_text("/home/user/data/note.txt", "kept")
            try:
                sb.pause()
            except (space.OperationFailed, space.Unavailable) as e:
                self.skipTest(f"pause not available on this server: {e}")
            self.assertEqual(sb.state, "paused")
            with self.assertRaises(space.Conflict):  # SandboxPaused is a Conflict
                sb.run("true")
            sb.resume()
            self.assertEqual(sb.state, "running")
            self.assertEqual(sb.run("cat /home/user/data/note.txt").stdout, b"kept")
            snap = sb.snapshot()
            self.assertEqual((snap.state, snap.sandbox_id), ("ready", sb.id))
            # "process" where the driver captures processes (gVisor; namespace with CRIU).
            self.assertIn(snap.kind, ("filesystem", "process"))
            self.assertIn(snap.id, [s.id for s in self.client.list_snapshots(sandbox_id=sb.id)])
            (fork,) = self.client.fork_snapshot(snap.id)
            try:
                self.assertEqual(fork.state, "running")
                self.assertEqual(fork.files.read_text("/home/user/data/note.txt"), "kept")
            finally:
                fork.delete()
            # Hibernate releases the instance; resume starts it again under the same id,
            # with its files, and the session still works.
            sb.files.write_text("/home/user/data/later.txt", "after the snapshot")
            sb.hibernate()
            self.assertEqual(sb.state, "hibernated")
            with self.assertRaises(space.SpaceError):
                sb.run("true")
            sb.resume()
            self.assertEqual(sb.state, "running")
            self.assertEqual(sb.files.read_text("/home/user/data/later.txt"), "after the snapshot")
        finally:
            sb.delete()
            for s in sorted(self.client.list_snapshots(sandbox_id=sb.id), key=lambda s: s.created_at, reverse=True):
                self.client.delete_snapshot(s.id)

    def _httpd(self, sb, port, page):
        sb.files.mkdir("/tmp/www")
        sb.files.write_text("/tmp/www/index.html", page)
        sb.start(["httpd", "-f", "-p", str(port), "-h", "/tmp/www"])
        return sb.wait_for_port(port, timeout=20)

    def test_ports_wait_list_url_and_signed(self):
        sb = self.sb
        with self.assertRaises(space.Timeout):
            sb.wait_for_port(8001, timeout=0.5)
        p = self._httpd(sb, 8001, "py page\n")
        self.assertEqual((p.port, p.url, p.path_url), (8001, sb.port_url(8001), sb.port_url(8001, path=True)))
        self.assertIn(8001, [x.port for x in sb.list_ports()])
        with sb.port_request(8001, "/index.html") as r:
            self.assertEqual((r.status, r.read()), (200, b"py page\n"))
        # Without the token the port is closed; a signed URL opens it.
        signed = sb.signed_port_url(8001, ttl=60)
        self.assertTrue(signed.url.startswith(sb.port_url(8001)) and "space_token=" in signed.url)
        self.assertTrue(signed.token.startswith("spt_"))
        import http.client
        import urllib.parse
        data = urllib.parse.urlsplit(sb.session["data_url"])
        host = urllib.parse.urlsplit(sb.port_url(8001)).netloc
        for target, status in (("/", 401), ("/?" + urllib.parse.urlsplit(signed.url).query, 200)):
            conn = http.client.HTTPConnection(data.hostname, data.port, timeout=30)
            try:
                conn.request("GET", target, headers={"Host": host})
                resp = conn.getresponse()
                self.assertEqual(resp.status, status, resp.read())
            finally:
                conn.close()
        with self.assertRaises(space.NotFound):
            space.Sandbox(self.client, space.SandboxInfo({"id": "sbx-0000000000000000"})).signed_port_url(8001)

    def test_public_ports(self):
        with self.client.create_sandbox(TEMPLATE, public_ports=True) as sb:
            self.assertTrue(sb.info.public_ports)
            self._httpd(sb, 8002, "open\n")
            import http.client
            import urllib.parse
            data = urllib.parse.urlsplit(sb.session["data_url"])
            conn = http.client.HTTPConnection(data.hostname, data.port, timeout=30)
            try:
                conn.request("GET", "/", headers={"Host": urllib.parse.urlsplit(sb.port_url(8002)).netloc})
                resp = conn.getresponse()
                self.assertEqual((resp.status, resp.read()), (200, b"open\n"))
            finally:
                conn.close()

    def test_build_template_from_file(self):
        name = f"pysdk-{uuid.uuid4().hex[:12]}"
        with tempfile.TemporaryDirectory() as ctx:
            os.makedirs(os.path.join(ctx, "app", "lib"))
            with open(os.path.join(ctx, "app", "hello.txt"), "w") as f:
                f.write("hello from the context\n")
            with open(os.path.join(ctx, "app", "lib", "run.sh"), "w") as f:
                f.write("#!/bin/sh\necho run\n")
            os.chmod(os.path.join(ctx, "app", "lib", "run.sh"), 0o755)
            os.symlink("hello.txt", os.path.join(ctx, "app", "link"))
            buildfile = (f"FROM {TEMPLATE}\n"
                         "USER root\n"
                         f"ENV BUILD_ID={name}\n"
                         "WORKDIR /srv\n"
                         "COPY app/ ./\n"
                         "RUN i=0; while [ $i -lt 2000 ]; do echo \"log line $i\"; i=$((i+1)); done; cat hello.txt > built.txt\n"
                         "START /bin/sh -c 'echo warmed > /srv/warm.txt; while true; do sleep 1; done'\n"
                         "READY test -f /srv/warm.txt\n")
            op = self.client.build_template(name, buildfile, ctx)
        res = op.result
        self.assertEqual(res["template"]["name"], name)
        self.assertEqual(len(res["steps"]), 8)
        run = res["steps"][5]
        self.assertTrue(run["instruction"].startswith("RUN"))
        self.assertFalse(run["cached"])
        warm = res.get("warm")
        self.assertTrue(warm and warm["snapshot"].startswith("snap-"), res)
        # The full log of the RUN step, beyond the result's tail.
        self.assertIn({"step": 6, "bytes": run["log_bytes"]}, self.client.template_build_log(op.id))
        log = self.client.template_build_log(op.id, 6)
        self.assertTrue(log.startswith(b"log line 0\n") and log.endswith(b"log line 1999\n"), log[-64:])
        tpl = self.client.get_template(name)
        self.assertEqual(tpl.warm_snapshot, warm["snapshot"])
        sb = self.client.create_sandbox(name)
        try:
            self.assertEqual(sb.info.snapshot, warm["snapshot"])  # started from the pre-warm
            self.assertEqual(sb.run("cat /srv/built.txt /srv/link /srv/warm.txt; ./lib/run.sh").stdout,
                             b"hello from the context\nhello from the context\nwarmed\nrun\n")
        finally:
            sb.delete()
        self.assertEqual(self.client.alias_template(name, name + ":stable").digest, tpl.digest)
        self.client.delete_template(name + ":stable")
        self.client.delete_template(name)
        with self.assertRaises(space.NotFound):
            self.client.get_template(name)
        with self.assertRaises(space.InvalidArgument):
            self.client.build_template(name, "FROM minimal\nADD x y\n")
        # gc_templates() is not called here: the suite's server shares the
        # template cache with other suites (GC answers 503 then); the Go
        # suite test/templates covers it on a private directory.


def _host_port(url):
    rest = url.split("://", 1)[1].split("/", 1)[0]
    host, _, port = rest.rpartition(":")
    return host, int(port)


class _CuttingProxy:
    """A TCP proxy that closes the i-th connection after cut_after[i] bytes from the server."""

    def __init__(self, host, port, cut_after):
        self.target = (host, port)
        self.cut_after = list(cut_after)
        self.cuts = 0
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(16)
        self.port = self.lsock.getsockname()[1]
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self):
        self.lsock.close()

    def _accept(self):
        while True:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            with self._lock:
                limit = self.cut_after.pop(0) if self.cut_after else None
            threading.Thread(target=self._serve, args=(c, limit), daemon=True).start()

    def _serve(self, c, limit):
        s = socket.create_connection(self.target)

        def up():
            try:
                while True:
                    b = c.recv(65536)
                    if not b:
                        break
                    s.sendall(b)
            except OSError:
                pass

        threading.Thread(target=up, daemon=True).start()
        sent = 0
        try:
            while True:
                b = s.recv(65536)
                if not b:
                    break
                if limit is not None and sent + len(b) >= limit:
                    c.sendall(b[:limit - sent])
                    with self._lock:
                        self.cuts += 1
                    break
                c.sendall(b)
                sent += len(b)
        except OSError:
            pass
        finally:
            for x in (c, s):
                try:
                    x.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                x.close()


if __name__ == "__main__":
    unittest.main()


@unittest.skipUnless(URL and KEY and os.environ.get("SPACE_TEST_CODE_TEMPLATE"),
                     "set SPACE_TEST_CODE_TEMPLATE (code-interpreter-v1) to run code (test/e2b TestCodeRoute does)")
class CodeInterpreterTest(unittest.TestCase):
    def test_run_code(self):
        client = space.Client(URL, KEY)
        with client.create_sandbox(os.environ["SPACE_TEST_CODE_TEMPLATE"]) as sb:
            out = []
            ex = sb.run_code("import sys\nx = 20\nprint('py out'); print('e', file=sys.stderr)\nx * 2", on_stdout=out.append)
            self.assertEqual((ex.text, ex.stdout, ex.stderr, out), ("40", ["py out\n"], ["e\n"], ["py out\n"]))
            self.assertEqual(sb.run_code("x + 1").text, "21")
            df = sb.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
            self.assertIn("<table", df.results[0].html)
            self.assertEqual(df.results[0].data, {"a": [1, 2]})
            plot = sb.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()")
            self.assertTrue(plot.results[0].png)
            err = sb.run_code("1/0")
            self.assertEqual(err.error.name, "ZeroDivisionError")
            self.assertEqual(sb.run_code("21 * 2", language="r").text, "[1] 42")
            self.assertEqual(sb.run_code("echo $((6 * 7))", language="bash").stdout, ["42\n"])
            t = sb.run_code("import time\ntime.sleep(30)", timeout=1)
            self.assertEqual(t.error.name, "TimeoutError")
            with self.assertRaises(space.InvalidArgument):
                sb.run_code("1", language="cobol")
