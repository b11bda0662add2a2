"""Drives kubernetes-sigs/agent-sandbox's own Python client (vendored,
unmodified, in agent-sandbox/) against SPACE's operator: TestAgentSandboxClient
runs it. Its test functions that need no pod inside the sandbox (test_client.py)
run as they are; the ones that run commands through the sandbox's runtime do
not apply (SPACE serves commands on its data plane: the Go test runs one through
the claim's Secret between the two phases).

  conformance.py create POOL NS      their tests, then one claim left Ready;
                                     prints {"claim": ..., "sandbox": ...}
  conformance.py terminate POOL NS CLAIM
                                     terminate that claim and delete_all a
                                     second one, as their termination test does

Debian's python3-kubernetes and python3-prometheus-client are found by
appending Debian's dist-packages to the path: the interpreter's own packages
(pydantic 2, which the client needs and Debian 12 lacks) come first.
"""
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "agent-sandbox"))
sys.path.append("/usr/lib/python3/dist-packages")

if sys.argv[1] == "probe":
    import kubernetes, prometheus_client, pydantic, requests  # noqa: E401,F401
    from pydantic import field_validator  # noqa: F401  (pydantic 2)
    sys.exit(0)

from k8s_agent_sandbox import SandboxClient  # noqa: E402
import test_client  # noqa: E402  (theirs)


def create(pool, ns):
    client = SandboxClient()
    test_client.test_wrong_warmpool_name(client, ns)
    test_client.test_claim_annotation(client, pool, ns)
    test_client.test_explicit_close_connection_and_persistence(client, pool, ns)
    sb = client.create_sandbox(pool, namespace=ns, labels={"conformance": "yes"},
                               pod_labels={"team": "conformance"}, shutdown_after_seconds=3600)
    status, msg = sb.status()
    assert status == "SandboxReady", (status, msg)
    assert sb.claim_name in client.list_all_sandboxes(ns), client.list_all_sandboxes(ns)
    assert sb.claim_name in client.list_all_sandboxes(ns, label_selector="conformance=yes")
    assert client.get_sandbox_claim_warmpool_name(sb.claim_name, ns) == pool
    obj = client.k8s_helper.get_sandbox(sb.sandbox_id, ns)
    assert obj["metadata"]["labels"].get("team") == "conformance", obj["metadata"]
    print(json.dumps({"claim": sb.claim_name, "sandbox": sb.sandbox_id}))


def terminate(pool, ns, claim):
    # What test_client.test_termination_and_deletion checks, without its
    # two 30 s waits on a claim named None (terminate() clears the handle's
    # claim_name before it looks the claim up again).
    client = SandboxClient()
    first = client.get_sandbox(claim, namespace=ns)
    second = client.create_sandbox(pool, namespace=ns)
    first.terminate()
    deadline = time.monotonic() + 60
    while (status := first.status())[0] != "SandboxNotFound":
        assert time.monotonic() < deadline, status
        time.sleep(0.2)
    assert client.k8s_helper.get_sandbox_claim(claim, ns) is None
    client.delete_all()
    assert client.list_active_sandboxes() == []
    assert not second.is_active and second.commands is None


if __name__ == "__main__":
    if sys.argv[1] == "create":
        create(sys.argv[2], sys.argv[3])
    else:
        terminate(sys.argv[2], sys.argv[3], sys.argv[4])
