"""Kubernetes as people run it, on the Kubernetes test bed: credentials that expire (an exec
plugin's tokens, as EKS's and GKE's kubeconfigs give), the least RBAC README documents, and a
ResourceQuota that wants limits. The bed's contexts bed-x and bed-x-silent get tokens from a
real exec plugin: a service account's token bound to a Secret that the bed deletes when the
token expires (20 s here), so the API server really refuses it from then on; bed-x's plugin
says when, bed-x-silent's does not (only the 401 tells). Context bed-b's user holds exactly
docs/kubernetes-rbac.yaml."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.k8sbed import TESTBED, K8sBed
from tests.support import Daemon, running

pytestmark = [pytest.mark.k8s, pytest.mark.ray]

TTL_S = 20
CONFIG = """
kubernetes:
  allowed_contexts: [bed-x, bed-x-silent, bed-b]
  image: {image}
  image_pull_policy: Never
  provision_timeout: 5
"""


def task(context: str) -> str:
    return f"""
resources:
  infra: kubernetes/{context}
  cpus: 0.5
  memory: 1
run: echo launched on {context}
"""


@pytest.fixture(scope="module")
def daemon(k8s: K8sBed) -> Iterator[Daemon]:
    # The plugin reads its tokens' lifetime from the environment it is run in: the daemon's.
    with running(k8s.daemon("cdk8x-", CONFIG.format(image=k8s.image),
                            CLUSTERD_TESTBED_K8S_TOKEN_TTL=str(TTL_S))) as d:
        yield d


def launch(daemon: Daemon, cluster: str, context: str) -> subprocess.CompletedProcess[str]:
    (daemon.root / f"{cluster}.yaml").write_text(task(context))
    return daemon.ctl("launch", "-c", cluster, f"{cluster}.yaml", timeout=900)


def tokens(k8s: K8sBed) -> dict[str, int]:
    """How many tokens the bed's plugin has issued, and how many of them it has revoked (the
    bed's controller counts them)."""
    done = subprocess.run(
        [sys.executable, "-c", "import json, sys; sys.path.insert(0, sys.argv[1]); "
         "from _testbed.common.control import request; "
         "print(json.dumps(request(sys.argv[2], 'token_stats')))",
         str(Path(TESTBED).parent), str(k8s.dir / "control.sock")],
        capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    stats: dict[str, int] = json.loads(done.stdout)
    return stats


def ssh(daemon: Daemon, alias: str, command: str) -> subprocess.CompletedProcess[str]:
    """The user's `ssh CLUSTER`: its ProxyCommand opens a new port-forward every time."""
    config = Path(daemon.env["HOME"]) / ".ssh" / "config"
    return subprocess.run(["ssh", "-F", str(config), "-o", "BatchMode=yes", alias, command],
                          capture_output=True, text=True, timeout=120)


TOKEN_THEN_CALLS = """
import json, os, ssl, subprocess, sys, time, urllib.error, urllib.request
plugin, bed_dir = sys.argv[1], sys.argv[2]
out = subprocess.run([sys.executable, plugin, "--dir", bed_dir], capture_output=True, check=True,
                     env={**os.environ, "CLUSTERD_TESTBED_K8S_TOKEN_TTL": "2"}).stdout
token = json.loads(out)["status"]["token"]
context = ssl.create_default_context(cafile=os.path.join(bed_dir, "pki", "ca.crt"))
codes, deadline = [], time.monotonic() + 40
while time.monotonic() < deadline and 401 not in codes:
    request = urllib.request.Request("https://127.0.0.1:6443/api/v1/namespaces/bed-a/pods",
                                     headers={"Authorization": f"Bearer {token}"})
    try:
        codes.append(urllib.request.urlopen(request, context=context, timeout=10).status)
    except urllib.error.HTTPError as e:
        codes.append(e.code)
    time.sleep(0.5)
print(json.dumps(codes))
"""


def test_the_beds_plugin_tokens_really_stop_working(k8s: K8sBed) -> None:
    """The bed's side of it: a token of the plugin works, then the API server refuses it
    (within its authentication cache's 10 s of the Secret's deletion)."""
    plugin = Path(TESTBED).parent / "_testbed" / "k8s" / "exec_credential.py"
    done = subprocess.run(["ip", "netns", "exec", k8s.netns, sys.executable, "-c",
                           TOKEN_THEN_CALLS, str(plugin), str(k8s.dir)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    codes = json.loads(done.stdout)
    assert codes[0] == 200 and codes[-1] == 401, codes


CONTEXTS = ("bed-x", "bed-x-silent")


def test_exec_plugin_tokens_are_refreshed_past_their_expiry(k8s: K8sBed,
                                                            daemon: Daemon) -> None:
    """Launch, then exec, logs, a refresh (API calls) and new SSH connections (new
    port-forwards) keep working across several expiries of the plugin's tokens: on bed-x,
    whose plugin says when its tokens expire, and on bed-x-silent, whose plugin does not (a
    401 is the only sign). Both clusters live through the same expiries."""
    clusters = {context: f"exp-{context.removeprefix('bed-')}" for context in CONTEXTS}
    before = tokens(k8s)
    try:
        for context, cluster in clusters.items():
            result = launch(daemon, cluster, context)
            assert result.returncode == 0, result.stderr + daemon.log()[-4000:]
            assert f"launched on {context}" in result.stdout
        deadline = time.monotonic() + 3 * TTL_S + 15
        rounds = 0
        while time.monotonic() < deadline or rounds < 2:
            rounds += 1
            for cluster in clusters.values():
                done = daemon.ctl("exec", cluster, "--", f"echo round {rounds}", timeout=300)
                assert done.returncode == 0, done.stderr + daemon.log()[-3000:]
                assert f"round {rounds}" in done.stdout
                logs = daemon.ctl("logs", cluster, timeout=120)
                assert logs.returncode == 0 and f"round {rounds}" in logs.stdout, logs.stderr
                status = daemon.ctl("status", "--refresh", "--json", cluster)
                assert status.returncode == 0, status.stderr
                (row,) = [c for c in json.loads(status.stdout) if c["name"] == cluster]
                assert row["status"] == "UP", row
                reached = ssh(daemon, cluster, "echo through a new port-forward")
                assert reached.returncode == 0, reached.stderr + daemon.log()[-3000:]
            time.sleep(TTL_S / 2)  # the tokens expire meanwhile; nothing here waits on them
        after = tokens(k8s)
        # The old tokens were really revoked while the clusters were used, and new ones got.
        assert after["revoked"] - before["revoked"] >= 5, (before, after)
        assert after["issued"] - before["issued"] >= 6, (before, after)
        # bed-x-silent's plugin gives no expiry: each new token there was asked for by a 401.
        assert "credentials refused; retrying with new ones" in daemon.log() or \
            "port-forward refused" in daemon.log()
    finally:
        downs = [daemon.ctl("down", "-y", cluster, timeout=300) for cluster in clusters.values()]
        assert all(down.returncode == 0 for down in downs), [d.stderr for d in downs]


def test_the_documented_rbac_is_enough_and_a_missing_verb_is_named(
        k8s: K8sBed, daemon: Daemon) -> None:
    """bed-b's user has docs/kubernetes-rbac.yaml and nothing else: launch, exec, ssh and
    down work; with one verb taken away, the failure names it and says RBAC."""
    result = launch(daemon, "rbac", "bed-b")
    assert result.returncode == 0, result.stderr + daemon.log()[-4000:]
    removed = False
    try:
        done = daemon.ctl("exec", "rbac", "--", "echo minimal rights")
        assert done.returncode == 0 and "minimal rights" in done.stdout, done.stderr
        assert ssh(daemon, "rbac", "true").returncode == 0
        role = json.loads(k8s.kubectl("-n", "bed-b", "get", "role", "clusterd", "-o", "json"))
        (pods,) = [r for r in role["rules"] if r["resources"] == ["pods"]]
        assert "deletecollection" in pods["verbs"]
        pods["verbs"].remove("deletecollection")
        patch = json.dumps({"rules": role["rules"]})
        k8s.kubectl("-n", "bed-b", "patch", "role", "clusterd", "--type", "merge", "-p", patch)
        removed = True
        down = daemon.ctl("down", "-y", "rbac", timeout=300)
        assert down.returncode != 0
        assert 'cannot deletecollection resource "pods"' in down.stderr, down.stderr
        assert "RBAC" in down.stderr and "kubernetes-rbac.yaml" in down.stderr, down.stderr
    finally:
        if removed:
            k8s.kubectl("-n", "bed-b", "apply", "-f",
                        str(Path(__file__).resolve().parents[2] / "docs" /
                            "kubernetes-rbac.yaml"))
        assert daemon.ctl("down", "-y", "rbac", timeout=300).returncode == 0


def test_a_quota_that_wants_limits_is_named_as_quota_not_rbac(
        k8s: K8sBed, daemon: Daemon) -> None:
    k8s.ok("quota", "--limits-cpu", "8")
    try:
        result = launch(daemon, "limits", "bed-b")
        assert result.returncode != 0
        assert "ResourceQuota clusterd-testbed-quota wants every pod to state limits.cpu (a " \
            "quota rule, not a permission; a LimitRange default fills it in)" in result.stderr, \
            result.stderr
        assert "RBAC" not in result.stderr, result.stderr
    finally:
        k8s.ok("quota", "--limits-cpu", "none")
        daemon.ctl("down", "-y", "limits", timeout=300)
