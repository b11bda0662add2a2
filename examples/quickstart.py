#!/usr/bin/env python3
"""SPACE quickstart: one sandbox, one command, one file -- Python standard library only.

    space server &                       # on the server machine
    export SPACE_API_KEY=$(space keys create)
    python3 examples/quickstart.py       # SPACE_URL defaults to http://127.0.0.1:7070

What it shows:
  1. Lifecycle calls go to the control API with an API key and answer at once
     with an *operation*; we long-poll it until it is done.
  2. Commands and files go to the *data plane* (a separate URL) with a
     *session token* that works for this one sandbox only.
  3. Command output arrives as server-sent events; every event has a
     sequence number, so a dropped connection resumes with Last-Event-ID.
"""

import base64
import http.client
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

SPACE_URL = os.environ.get("SPACE_URL", "http://127.0.0.1:7070").rstrip("/")
API_KEY = os.environ.get("SPACE_API_KEY", "")


class SpaceError(Exception):
    pass


# --- HTTP helpers --------------------------------------------------------------------------------

def send(method, url, headers, body=None, timeout=60):
    """Send a request and return the open response. Errors become SpaceError with
    the API's {"error": {"code", "message"}} envelope spelled out."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        return urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        detail = e.read(64 << 10).decode("utf-8", "replace")
        try:
            err = json.loads(detail)["error"]
            detail = f'{err["code"]}: {err["message"]}'
        except (ValueError, KeyError, TypeError):
            pass
        raise SpaceError(f"{method} {url.split('?')[0]} -> HTTP {e.code} {detail}") from None
    except (urllib.error.URLError, OSError) as e:
        raise SpaceError(f"{method} {url.split('?')[0]}: {getattr(e, 'reason', e)}") from None


def read_json(resp):
    with resp:
        raw = resp.read(32 << 20)
    return json.loads(raw) if raw else None


def control(method, path, body=None, headers=None, timeout=60):
    """Call the control API with the API key; return the decoded JSON answer."""
    h = {"X-API-Key": API_KEY, **(headers or {})}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        h["Content-Type"] = "application/json"
    return read_json(send(method, SPACE_URL + path, h, data, timeout))


class Sandbox:
    """The data-plane side of one sandbox, reached with its session token."""

    def __init__(self, sandbox_id, session):
        self.base = session["data_url"].rstrip("/") + "/v1/sandboxes/" + sandbox_id
        self.token = session["token"]

    def call(self, method, path, body=None, content_type="application/json", extra=None):
        h = {"Authorization": "Bearer " + self.token, **(extra or {})}
        if body is not None:
            h["Content-Type"] = content_type
        return send(method, self.base + path, h, body)

    def run(self, argv):
        """Start a command, stream its output, return (stdout, stderr, exit)."""
        cmd = read_json(self.call("POST", "/commands", json.dumps({"argv": argv}).encode()))
        out = {"stdout": b"", "stderr": b""}
        last_id = "0"
        for attempt in range(5):  # resume after a dropped connection, a few times
            try:
                resp = self.call("GET", f"/commands/{cmd['id']}/events",
                                 extra={"Accept": "text/event-stream", "Last-Event-ID": last_id})
                with resp:
                    for event_id, event, data in sse_events(resp):
                        last_id = event_id or last_id
                        if event in out:
                            out[event] += base64.b64decode(data)
                        elif event == "exit":
                            return out["stdout"], out["stderr"], json.loads(data)
            except (OSError, http.client.HTTPException) as e:  # the connection broke mid-stream
                print(f"    (stream interrupted: {e!r}; resuming after event {last_id})")
            time.sleep(0.2 * (attempt + 1))
        raise SpaceError(f"command {cmd['id']}: output stream ended without an exit event")

    def upload(self, path, data):
        q = urllib.parse.urlencode({"path": path})
        self.call("PUT", "/files?" + q, data, "application/octet-stream").close()

    def download(self, path):
        q = urllib.parse.urlencode({"path": path})
        with self.call("GET", "/files?" + q) as resp:
            return resp.read()


def sse_events(resp):
    """A minimal server-sent-events parser: yields (id, event, data) per event.
    Lines starting with ':' are comments (keep-alives); several data lines join with newlines."""
    event_id, event, data = "", "message", []
    for raw in resp:  # one line at a time, as the server flushes them
        line = raw.decode("utf-8").rstrip("\r\n")
        if line == "":  # a blank line ends the event
            if data:
                yield event_id, event, "\n".join(data)
            event, data = "message", []
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "data":
                data.append(value)
            elif field == "event":
                event = value
            elif field == "id":
                event_id = value


# --- operations ----------------------------------------------------------------------------------

def wait_operation(op_id):
    """Long-poll an operation until it is done; the server holds each call up to 30 s."""
    while True:
        op = control("GET", f"/v1/operations/{op_id}?wait=30s", timeout=45)
        if op["state"] == "succeeded":
            return op
        if op["state"] in ("failed", "cancelled"):
            err = op.get("error") or {}
            raise SpaceError(f"operation {op_id} ({op['kind']}) {op['state']}: "
                             f"{err.get('code', '?')}: {err.get('message', '')}")


# --- the walkthrough -----------------------------------------------------------------------------

def step(name, fn):
    start = time.monotonic()
    result = fn()
    print(f"ok  {name:<34} {(time.monotonic() - start) * 1000:8.1f} ms")
    return result


def main():
    if not API_KEY:
        raise SpaceError("set SPACE_API_KEY (create a key with `space keys create` on the server)")
    total = time.monotonic()

    # 1. Create: the answer comes at once, with the operation, the sandbox and a session token.
    #    The Idempotency-Key makes it safe to retry this exact request after a network error.
    created = step("create sandbox (request)", lambda: control(
        "POST", "/v1/sandboxes", {"template": "base", "metadata": {"example": "quickstart"}},
        headers={"Idempotency-Key": str(uuid.uuid4())}))
    sandbox_id = created["sandbox"]["id"]
    print(f"    sandbox {sandbox_id}, operation {created['operation']['id']}")
    finished = False
    try:
        step("wait until running", lambda: wait_operation(created["operation"]["id"]))
        sbx = Sandbox(sandbox_id, created["session"])

        # 2. Run a command over the data plane and stream its output.
        stdout, stderr, exit_info = step("run python3 -c 'print(6*7)'",
                                         lambda: sbx.run(["python3", "-c", "print(6*7)"]))
        sys.stdout.write(stdout.decode())
        print(f"    exit: {exit_info}")
        if exit_info.get("exit_code") != 0:
            raise SpaceError(f"command failed: {exit_info}; stderr: {stderr.decode()!r}")
        if stdout.strip() != b"42":
            raise SpaceError(f"expected 42, got {stdout!r}")

        # 3. Files: write one and read it back.
        content = f"hello from {sandbox_id}\n".encode()
        step("upload /tmp/hello.txt", lambda: sbx.upload("/tmp/hello.txt", content))
        back = step("download /tmp/hello.txt", lambda: sbx.download("/tmp/hello.txt"))
        if back != content:
            raise SpaceError(f"downloaded {back!r}, uploaded {content!r}")
        finished = True
    finally:
        # 4. Delete (also an operation), even when a step above failed.
        try:
            deleted = step("delete sandbox (request)", lambda: control("DELETE", f"/v1/sandboxes/{sandbox_id}"))
            step("wait until deleted", lambda: wait_operation(deleted["operation"]["id"]))
        except SpaceError as e:
            if finished:
                raise
            print(f"    (cleanup failed too: {e})", file=sys.stderr)

    print(f"all done in {(time.monotonic() - total) * 1000:.0f} ms")


if __name__ == "__main__":
    try:
        main()
    except SpaceError as e:
        print(f"quickstart failed: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
