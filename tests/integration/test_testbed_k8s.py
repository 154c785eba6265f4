"""The Kubernetes test bed (scripts/testbed k8s), driven only through its command line and
through kubectl, ssh and kubernetes-asyncio run inside its network namespace: real nodes
(kubelet, containerd, runc, CNI) Ready with distinct names and labels, fake GPUs the real
scheduler places and refuses pods by, an sshd pod reached through the API server's
port-forward and through a NodePort, logs and exec through the API server, fault rules on the
API endpoint, the two contexts and the quota, a lost node, an API server restart cutting
tunnels, a namespace with no link out, and a `down` that leaves nothing behind.

The first `up` on a machine builds Kubernetes from Debian's source (minutes: see the README);
later ones take about half a minute."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import daemons_of, pids_with, short_tempdir, wait_for

pytestmark = [pytest.mark.k8s, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
TESTBED = ROOT / "scripts" / "testbed"
SSH_OPTS = ["-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
            "-o", "ConnectTimeout=10"]
KERNEL_SETTINGS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic",
                   "kernel/panic_on_oops", "kernel/keys/root_maxkeys",
                   "kernel/keys/root_maxbytes")
# Paths the kubelet and containerd would make on the machine if the bed let them.
HOST_PATHS = ("/var/log/pods", "/var/log/containers", "/var/lib/kubelet", "/var/lib/cni",
              "/var/lib/containerd", "/run/containerd", "/opt/containerd", "/etc/cni",
              "/usr/libexec/kubernetes", "/etc/kubernetes")
# kubernetes-asyncio inside the namespace: create a pod in a context, print the outcome.
CREATE_POD = """
import asyncio, json, sys
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.rest import ApiException

async def main(context, name):
    await config.load_kube_config(context=context)
    async with client.ApiClient() as api:
        v1 = client.CoreV1Api(api)
        ns = {"bed-a": "bed-a", "bed-b": "bed-b"}[context]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
               "spec": {"containers": [{"name": "c", "image": sys.argv[3],
                                        "imagePullPolicy": "Never",
                                        "command": ["sleep", "infinity"]}],
                        "terminationGracePeriodSeconds": 1}}
        try:
            await v1.create_namespaced_pod(ns, pod)
            print(json.dumps({"status": 201}))
        except ApiException as e:
            body = json.loads(e.body)
            print(json.dumps({"status": e.status, "reason": body["reason"],
                              "message": body["message"]}))

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


@dataclasses.dataclass
class Bed:
    dir: Path
    netns: str
    key: Path
    kernel_before: dict[str, str]
    paths_before: dict[str, bool]

    def testbed(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        n = 2 if args[0] == "fault" else 1  # `--dir` goes after the (sub)command
        cmd = [sys.executable, str(TESTBED), "k8s", *args[:n], "--dir", str(self.dir),
               *args[n:]]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)

    def ok(self, *args: str, timeout: float = 300) -> str:
        p = self.testbed(*args, timeout=timeout)
        assert p.returncode == 0, f"testbed k8s {' '.join(args)}: {p.stderr}{p.stdout}"
        return p.stdout

    def run(self, *cmd: str, timeout: float = 120,
            input_text: str | None = None) -> subprocess.CompletedProcess[str]:
        """cmd inside the bed's namespace, as `exec` runs it (KUBECONFIG: clusterd's)."""
        return subprocess.run([sys.executable, str(TESTBED), "k8s", "exec", "--dir",
                               str(self.dir), "--", *cmd], capture_output=True, text=True,
                              timeout=timeout, input=input_text)

    def kubectl(self, *args: str, context: str = "bed-a", admin: bool = False,
                input_text: str | None = None, check: bool = True,
                timeout: float = 120) -> str:
        where = ["--kubeconfig", str(self.dir / "kube" / "admin.kubeconfig")] if admin \
            else ["--context", context]
        p = self.run("kubectl", *where, *args, input_text=input_text, timeout=timeout)
        if check:
            assert p.returncode == 0, f"kubectl {' '.join(args)}: {p.stderr}{p.stdout}"
        return p.stdout + (p.stderr if not check else "")

    def status(self) -> dict[str, Any]:
        got: dict[str, Any] = json.loads(self.testbed("status", "--json").stdout)
        return got

    def node(self, name: str) -> dict[str, Any]:
        (row,) = [n for n in self.status()["nodes"] if n["name"] == name]
        return row

    def pod(self, name: str, namespace: str = "bed-a") -> dict[str, Any]:
        got: dict[str, Any] = json.loads(self.kubectl("get", "pod", name, "-n", namespace,
                                                      "-o", "json", admin=True))
        return got

    def wait_running(self, name: str, namespace: str = "bed-a",
                     timeout: float = 90) -> dict[str, Any]:
        def running() -> dict[str, Any] | None:
            pod = self.pod(name, namespace)
            ready = [c for c in pod["status"].get("conditions", [])
                     if c["type"] == "Ready" and c["status"] == "True"]
            return pod if pod["status"].get("phase") == "Running" and ready else None

        pod: dict[str, Any] = wait_for(running, timeout, f"pod {name} to run", interval=0.5)
        return pod


def sleeper(name: str, image: str, **spec: Any) -> str:
    container: dict[str, Any] = {"name": "c", "image": image, "imagePullPolicy": "Never",
                                 "command": ["sleep", "infinity"]}
    container.update(spec.pop("container", {}))
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                       "spec": {"containers": [container], "terminationGracePeriodSeconds": 1,
                                **spec}})


@pytest.fixture(scope="module")
def bed() -> Iterator[Bed]:
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("the Kubernetes test bed needs root and iproute2")
    root = short_tempdir("cdk8s-")
    kernel = {s: Path("/proc/sys", s).read_text().strip() for s in KERNEL_SETTINGS}
    before = {p: os.path.lexists(p) for p in HOST_PATHS}
    b = Bed(root / "bed", f"cdk8s-{os.getpid()}", root / "id_ed25519", kernel, before)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(b.key)],
                   check=True)
    try:
        up = subprocess.run([sys.executable, str(TESTBED), "k8s", "up", "--dir", str(b.dir),
                             "--netns", b.netns, "--nodes", "2", "--gpu-nodes", "1"],
                            capture_output=True, text=True, timeout=1500)
        assert up.returncode == 0, up.stderr + up.stdout
        yield b
    finally:
        subprocess.run([sys.executable, str(TESTBED), "k8s", "down", "--dir", str(b.dir)],
                       capture_output=True, text=True, timeout=300)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def image(bed: Bed) -> str:
    return str(bed.status()["node_image"])


# ---------------------------------------------------------------------------- the bed


def test_up_is_idempotent(bed: Bed) -> None:
    before = bed.status()
    again = bed.ok("up")
    assert "everything was running" in again
    after = bed.status()
    assert {n: p["pid"] for n, p in after["processes"].items()} == \
        {n: p["pid"] for n, p in before["processes"].items()}
    assert [(n["name"], n["kubelet_pid"]) for n in after["nodes"]] == \
        [(n["name"], n["kubelet_pid"]) for n in before["nodes"]]
    assert all(p["alive"] for p in after["processes"].values())


def test_nodes_ready_with_distinct_names_and_labels(bed: Bed) -> None:
    status = bed.status()
    nodes = {n["name"]: n for n in status["nodes"]}
    assert sorted(nodes) == ["cpu-1", "cpu-2", "gpu-1"]
    assert all(n["ready"] and n["running"] and n["kubelet_pid"] for n in nodes.values())
    assert len({n["labels"]["clusterd.testbed/node"] for n in nodes.values()}) == 3
    assert len({n["labels"]["kubernetes.io/hostname"] for n in nodes.values()}) == 3
    assert len({n["ip"] for n in nodes.values()}) == 3
    assert all(Path(f"/proc/{n['kubelet_pid']}/comm").read_text().strip() == "kubelet"
               for n in nodes.values())
    # Each node is a kubelet of its own, in a PID namespace of its own.
    assert len({os.readlink(f"/proc/{n['kubelet_pid']}/ns/pid") for n in nodes.values()}) == 3
    listed = bed.kubectl("get", "nodes", "-o", "json", context="bed-b")
    assert sorted(i["metadata"]["name"] for i in json.loads(listed)["items"]) == sorted(nodes)
    version = json.loads(bed.kubectl("version", "-o", "json"))
    assert version["serverVersion"]["gitVersion"] == "v1.20.2"
    assert [c["name"] for c in status["contexts"]] == ["bed-a", "bed-b"]


def test_contexts_are_users_of_their_own_namespaces(bed: Bed) -> None:
    denied = bed.kubectl("get", "pods", "-n", "bed-a", context="bed-b", check=False)
    assert "forbidden" in denied.lower() and "clusterd-b" in denied
    env = json.loads(subprocess.run(
        [sys.executable, str(TESTBED), "k8s", "env", "--dir", str(bed.dir), "--json"],
        capture_output=True, text=True, check=True,
        env={**os.environ, "KUBECONFIG": "/elsewhere", "KUBERNETES_SERVICE_HOST": "10.0.0.1",
             "CLUSTERD_TESTBED_KEEP_XDG": ""}).stdout)
    assert env["KUBECONFIG"] == str(bed.dir / "kube" / "kubeconfig")
    assert "KUBERNETES_SERVICE_HOST" not in env
    assert Path(env["XDG_RUNTIME_DIR"]).stat().st_mode & 0o777 == 0o700
    assert (bed.dir / "kube" / "kubeconfig").stat().st_mode & 0o077 == 0
    assert env["PATH"].split(":")[0].endswith("/bin") and \
        Path(env["PATH"].split(":")[0], "kubectl").exists()
    config = bed.kubectl("config", "view", "-o", "json")
    assert json.loads(config)["current-context"] == "bed-a"


def test_gpu_node_and_the_real_scheduler(bed: Bed, image: str) -> None:
    gpu = bed.node("gpu-1")
    assert gpu["capacity"]["nvidia.com/gpu"] == "2"
    assert gpu["labels"]["skypilot.co/accelerator"] == "a100"
    assert "nvidia.com/gpu" not in bed.node("cpu-1")["capacity"]
    limits = {"container": {"resources": {"limits": {"nvidia.com/gpu": "1"}}}}
    bed.kubectl("apply", "-f", "-", input_text=sleeper("gpu-one", image, **limits))
    too_many = {"container": {"resources": {"limits": {"nvidia.com/gpu": "4"}}}}
    bed.kubectl("apply", "-f", "-", input_text=sleeper("gpu-four", image, **too_many))
    assert bed.wait_running("gpu-one")["spec"]["nodeName"] == "gpu-1"

    def refused() -> str | None:
        events = json.loads(bed.kubectl("get", "events", "-n", "bed-a", "-o", "json",
                                        "--field-selector", "involvedObject.name=gpu-four"))
        found = [e["message"] for e in events["items"] if e["reason"] == "FailedScheduling"]
        return found[0] if found else None

    message = wait_for(refused, 60, "FailedScheduling for gpu-four", interval=0.5)
    assert "Insufficient nvidia.com/gpu" in message
    assert bed.pod("gpu-four")["status"]["phase"] == "Pending"
    bed.kubectl("delete", "pod", "gpu-one", "gpu-four", "--wait=false")


def test_sshd_pod_through_port_forward_and_node_port(bed: Bed, image: str) -> None:
    public = bed.key.with_suffix(".pub").read_text().strip()
    bed.kubectl("create", "secret", "generic", "ssh-key", f"--from-literal=key.pub={public}")
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "sshd", "labels": {"app": "sshd"}},
           "spec": {"terminationGracePeriodSeconds": 1,
                    "nodeSelector": {"clusterd.testbed/node": "cpu-1"},
                    "containers": [{"name": "node", "image": image, "imagePullPolicy": "Never",
                                    "ports": [{"containerPort": 22}],
                                    # Ready once sshd listens (the entrypoint has run by then)
                                    "readinessProbe": {"tcpSocket": {"port": 22},
                                                       "periodSeconds": 1},
                                    "volumeMounts": [{"name": "keys",
                                                      "mountPath": "/etc/clusterd/ssh"}]}],
                    "volumes": [{"name": "keys", "secret": {"secretName": "ssh-key"}}]}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "sshd"},
               "spec": {"type": "NodePort", "selector": {"app": "sshd"},
                        "ports": [{"port": 22, "targetPort": 22}]}}
    bed.kubectl("apply", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List",
                                                           "items": [pod, service]}))
    started = time.monotonic()
    running = bed.wait_running("sshd")
    print(f"sshd pod Running after {time.monotonic() - started:.1f}s")
    # logs through the API server: the entrypoint prints the host key
    logs = bed.kubectl("logs", "sshd")
    assert re.search(r"clusterd-node: host key ssh-ed25519 \S+", logs), logs
    assert "1 authorised key(s) for sky" in logs
    # exec through the API server
    assert bed.kubectl("exec", "sshd", "--", "sh", "-c", "echo $((6*7)) $(id -un)").split() \
        == ["42", "root"]
    forward = subprocess.Popen(
        [sys.executable, str(TESTBED), "k8s", "exec", "--dir", str(bed.dir), "--",
         "kubectl", "port-forward", "pod/sshd", ":22"], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    try:
        assert forward.stdout is not None
        line = forward.stdout.readline()
        m = re.search(r"Forwarding from 127\.0\.0\.1:(\d+)", line)
        assert m, line
        port = m.group(1)
        ssh = ["ssh", *SSH_OPTS, "-i", str(bed.key), "-p", port, "sky@127.0.0.1"]
        r = bed.run(*ssh, "python3 -c 'import sys; print(sys.version_info[:2])'; "
                          "sudo -n true && echo sudo-ok; id -un")
        assert r.returncode == 0, r.stderr
        assert r.stdout.split("\n")[:3] == ["(3, 11)", "sudo-ok", "sky"]
        src = bed.dir.parent / "payload"
        src.mkdir()
        (src / "f.txt").write_text("through the API server\n")
        r = bed.run("rsync", "-a", "-e", " ".join(["ssh", *SSH_OPTS, "-i", str(bed.key),
                                                   "-p", port]),
                    f"{src}/", "sky@127.0.0.1:payload/")
        assert r.returncode == 0, r.stderr
        assert bed.kubectl("exec", "sshd", "--", "cat", "/home/sky/payload/f.txt") == \
            "through the API server\n"
    finally:
        forward.terminate()
        forward.wait(10)
    node_port = json.loads(bed.kubectl("get", "service", "sshd", "-o", "json"))[
        "spec"]["ports"][0]["nodePort"]
    node_ip = bed.node("cpu-2")["ip"]  # any node's address: kube-proxy sends it on
    r = bed.run("ssh", *SSH_OPTS, "-i", str(bed.key), "-p", str(node_port), f"sky@{node_ip}",
                "hostname")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "sshd"
    assert running["status"]["podIP"].startswith("10.77.1.")


def test_fault_rule_fires_then_clears(bed: Bed, image: str) -> None:
    rule = bed.ok("fault", "add", "--verb", "create", "--resource", "pods", "--code", "403",
                  "--count", "1").strip()
    first = json.loads(bed.run("python", "-c", CREATE_POD, "bed-a", "faulted-1", image)
                       .stdout)
    assert first["status"] == 403 and first["reason"] == "Forbidden"
    assert 'pods "faulted-1" is forbidden' in first["message"]
    second = json.loads(bed.run("python", "-c", CREATE_POD, "bed-a", "faulted-1", image)
                        .stdout)
    assert second == {"status": 201}
    rules = json.loads(bed.ok("fault", "list", "--json"))["rules"]
    assert [(r["id"], r["fired"], r["count"]) for r in rules] == [(rule, 1, 1)]
    # one context's namespace only, every time, until cleared
    bed.ok("fault", "add", "--verb", "create", "--resource", "pods", "--code", "500",
           "--namespace", "bed-b")
    in_b = json.loads(bed.run("python", "-c", CREATE_POD, "bed-b", "faulted-2", image).stdout)
    assert (in_b["status"], in_b["reason"]) == (500, "InternalError")
    in_a = json.loads(bed.run("python", "-c", CREATE_POD, "bed-a", "faulted-3", image).stdout)
    assert in_a == {"status": 201}
    conflict = bed.ok("fault", "add", "--verb", "create", "--resource", "pods", "--code", "409",
                      "--namespace", "bed-a", "--count", "1").strip()
    assert json.loads(bed.run("python", "-c", CREATE_POD, "bed-a", "x", image).stdout)[
        "reason"] == "AlreadyExists"
    bed.ok("fault", "remove", conflict)
    assert "removed 2 fault rule(s)" in bed.ok("fault", "clear")
    assert "no fault rules" in bed.ok("fault", "list")
    assert json.loads(bed.run("python", "-c", CREATE_POD, "bed-b", "faulted-2", image)
                      .stdout) == {"status": 201}
    bed.kubectl("delete", "pod", "faulted-1", "faulted-3", "--wait=false")
    bed.kubectl("delete", "pod", "faulted-2", "--wait=false", context="bed-b")


def test_quota_of_bed_b_runs_out(bed: Bed, image: str) -> None:
    bed.ok("quota", "--pods", "0")
    out = json.loads(bed.run("python", "-c", CREATE_POD, "bed-b", "over-quota", image).stdout)
    assert out["status"] == 403 and "exceeded quota" in out["message"]
    got = json.loads(bed.ok("quota", "--pods", "20", "--json"))
    assert got["hard"]["pods"] == "20" and got["context"] == "bed-b"


def test_namespace_has_no_link_out(bed: Bed, image: str) -> None:
    links = subprocess.run(["ip", "-n", bed.netns, "-d", "-o", "link", "show"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    kinds = {}
    for line in links:
        name = line.split(":")[1].strip().split("@")[0]
        kinds[name] = ("bridge" if " bridge " in line else "veth" if " veth " in line
                       else "loopback" if "loopback" in line else line)
    assert kinds.pop("lo") == "loopback" and kinds.pop("k8sbr0") == "bridge"
    assert set(kinds.values()) <= {"veth"}, kinds  # the pods' ends, on the bridge
    assert all("master k8sbr0" in line for line in links if " veth " in line)
    routes = subprocess.run(["ip", "-n", bed.netns, "-4", "route", "show", "table", "all"],
                            capture_output=True, text=True, check=True).stdout.splitlines()
    for line in routes:
        words = line.split()
        dest = words[1] if words[0] in ("local", "broadcast", "unreachable") else words[0]
        assert dest != "default", line
        assert dest.startswith(("10.77.", "127.")), line
    probe = ("import socket, errno\ns = socket.socket(); s.settimeout(5)\n"
             "try:\n    s.connect(('192.0.2.1', 80)); print('connected')\n"
             "except OSError as e:\n    print(errno.errorcode.get(e.errno, e))")
    assert bed.run("python3", "-c", probe).stdout.strip() == "ENETUNREACH"
    bed.kubectl("apply", "-f", "-", input_text=sleeper("probe", image))
    bed.wait_running("probe")
    assert bed.kubectl("exec", "probe", "--", "python3", "-c", probe).strip() == "ENETUNREACH"
    bed.kubectl("delete", "pod", "probe", "--wait=false")


def test_restart_apiserver_cuts_port_forwards(bed: Bed, image: str) -> None:
    bed.kubectl("apply", "-f", "-", input_text=sleeper("pf", image))
    bed.wait_running("pf")
    forward = subprocess.Popen(
        [sys.executable, str(TESTBED), "k8s", "exec", "--dir", str(bed.dir), "--",
         "kubectl", "port-forward", "pod/pf", ":22"], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    try:
        assert forward.stdout is not None
        assert "Forwarding from" in forward.stdout.readline()
        pid = bed.status()["processes"]["apiserver"]["pid"]
        out = bed.ok("restart-apiserver")
        assert "restarted" in out
        assert bed.status()["processes"]["apiserver"]["pid"] != pid
        # kubectl port-forward ends when its tunnel through the API server is cut
        forward.wait(60)
    finally:
        if forward.poll() is None:
            forward.terminate()
            forward.wait(10)
    assert bed.kubectl("get", "pod", "pf", "-o", "name").strip() == "pod/pf"
    bed.kubectl("delete", "pod", "pf", "--wait=false")


def test_kill_node_loses_it_and_up_brings_it_back(bed: Bed, image: str) -> None:
    bed.kubectl("apply", "-f", "-", input_text=sleeper(
        "doomed", image, nodeSelector={"clusterd.testbed/node": "cpu-2"}))
    bed.wait_running("doomed")
    before = bed.node("cpu-2")
    pids = [before["kubelet_pid"], before["containerd_pid"], before["node_pid"]]
    out = bed.ok("kill-node", "cpu-2")
    assert "node cpu-2 lost" in out
    wait_for(lambda: not any(Path(f"/proc/{p}").exists() for p in pids), 10,
             "the node's processes to die")
    assert bed.node("cpu-2")["running"] is False
    wait_for(lambda: not bed.node("cpu-2")["ready"], 60, "cpu-2 to be NotReady", interval=1)
    # its pods are evicted (marked for deletion) once their toleration of that runs out
    wait_for(lambda: "deletionTimestamp" in bed.pod("doomed")["metadata"], 90,
             "the pod on the lost node to be evicted", interval=1)
    again = bed.testbed("kill-node", "cpu-2")
    assert again.returncode == 1 and "down already" in again.stderr
    unknown = bed.testbed("kill-node", "cpu-9")
    assert unknown.returncode == 1 and "no node cpu-9" in unknown.stderr
    bed.ok("up")
    assert bed.node("cpu-2")["ready"]
    # back, the kubelet finishes the eviction: the pod is gone
    wait_for(lambda: "doomed" not in bed.kubectl("get", "pods", "-o", "name"), 90,
             "the evicted pod to go", interval=1)


def test_bad_usage(bed: Bed) -> None:
    p = bed.testbed("fault", "add", "--verb", "create")
    assert p.returncode == 2 and "--code" in p.stderr
    p = bed.testbed("up", "--nodes", "0")
    assert p.returncode == 2
    p = subprocess.run([sys.executable, str(TESTBED), "k8s", "status", "--dir",
                        str(bed.dir.parent / "nothing")], capture_output=True, text=True)
    assert p.returncode == 2


def test_a_daemon_started_through_exec_launches_with_nothing_set_up(bed: Bed) -> None:
    """`up` prepared the runtime's wheelhouse (the namespace has no way to the package index)
    and `exec` names the bed's image: clusterctl run through `exec` starts a daemon that
    launches a cluster of pods with no config and no wheelhouse made by hand."""
    env = json.loads(bed.ok("env", "--json"))
    # The node image (the runtime image comes with a later test): the runtime is installed.
    assert env["CLUSTERD_KUBERNETES_IMAGE"] == env["CLUSTERD_TESTBED_K8S_NODE_IMAGE"]
    assert not (Path(env["XDG_CONFIG_HOME"]) / "clusterd" / "config.yaml").exists()
    task = bed.dir.parent / "plain.yaml"
    task.write_text("resources:\n  cpus: 0.5\n  memory: 1\nrun: echo plain on $(hostname)\n")
    try:
        launched = bed.run("clusterctl", "launch", "-c", "plain", "--infra", "kubernetes",
                           str(task), timeout=900)
        assert launched.returncode == 0, launched.stderr
        assert "plain on plain-" in launched.stdout
        assert "needs the package index" not in launched.stderr
        down = bed.run("clusterctl", "down", "-y", "plain", timeout=300)
        assert down.returncode == 0, down.stderr
    finally:
        for pid in daemons_of(Path(env["XDG_RUNTIME_DIR"])):
            os.kill(pid, 15)
        wait_for(lambda: not daemons_of(Path(env["XDG_RUNTIME_DIR"])), 30,
                 "the bed's daemon to stop")


def test_runtime_image_holds_clusterds_runtime(bed: Bed) -> None:
    """`up --runtime-image` on a running bed: the image is imported into its nodes, and a pod
    of it has the runtime of the wheelhouse daemons in the bed use, as clusterd installs it."""
    out = bed.ok("up", "--runtime-image", timeout=1200)
    assert "runtime image" in out
    env = json.loads(bed.ok("env", "--json"))
    image = env["CLUSTERD_TESTBED_K8S_RUNTIME_IMAGE"]
    assert bed.status()["runtime_image"] == image
    (key,) = [k for k in os.listdir(env["CLUSTERD_WHEELHOUSE_DIR"]) if image.endswith(k)]
    bed.kubectl("apply", "-f", "-", input_text=sleeper(
        "runtime", image, nodeSelector={"clusterd.testbed/node": "cpu-2"}))
    bed.wait_running("runtime")
    got = bed.kubectl("exec", "runtime", "--", "su", "sky", "-c", f"""cd
.clusterd/current/bin/python -c "import ray, clusterd; print(ray.__version__)"
test -e .clusterd/venvs/{key}/.clusterd-ready && echo ready
readlink .clusterd/current
find .clusterd ! -user sky | wc -l""")
    assert got.split() == ["2.60.0", "ready", f"venvs/{key}", "0"]
    bed.kubectl("delete", "pod", "runtime", "--wait=false")


def test_an_ec2_bed_alongside(bed: Bed) -> None:
    """Both beds up at once (a failover from aws to kubernetes runs them together), each in
    its own namespace; the EC2 bed's down leaves this one as it was."""
    ec2_dir, netns = bed.dir.parent / "ec2", f"cdk8s-ec2-{os.getpid()}"

    def ec2(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(TESTBED), "ec2", args[0], "--dir",
                               str(ec2_dir), *args[1:]], capture_output=True, text=True,
                              timeout=300)

    try:
        up = ec2("up", "--netns", netns, "--no-wheelhouse")
        assert up.returncode == 0, up.stderr + up.stdout
        assert ec2("status").returncode == 0
        status = bed.status()
        assert all(n["ready"] for n in status["nodes"])
        ec2_controller = json.loads(ec2("status", "--json").stdout)["controller_pid"]
        apiserver = status["processes"]["apiserver"]["pid"]
        assert os.readlink(f"/proc/{apiserver}/ns/net") != \
            os.readlink(f"/proc/{ec2_controller}/ns/net")
    finally:
        down = ec2("down")
    assert down.returncode == 0, down.stderr
    assert all(n["ready"] and n["running"] for n in bed.status()["nodes"])
    assert "cpu-1" in bed.kubectl("get", "nodes", "-o", "name")


def test_up_removes_nodes_it_is_not_asked_for(bed: Bed) -> None:
    bed.ok("up", "--nodes", "1", "--gpu-nodes", "0")
    assert [n["name"] for n in bed.status()["nodes"]] == ["cpu-1"]
    assert bed.kubectl("get", "nodes", "-o", "name", admin=True).split() == ["node/cpu-1"]
    addresses = subprocess.run(["ip", "-n", bed.netns, "-4", "-o", "addr", "show", "dev",
                                "k8sbr0"], capture_output=True, text=True, check=True).stdout
    assert sorted(line.split()[3] for line in addresses.splitlines()) == [
        "10.77.0.1/16", "10.77.0.11/16"]
    assert sorted(os.listdir(bed.dir / "nodes")) == ["cpu-1"]
    assert [p.name for p in Path("/sys/fs/cgroup/memory").glob(
        f"clusterd-testbed-k8s.{bed.netns}/*") if p.is_dir()] == ["cpu-1"]


# ---------------------------------------------------------------------------- down


def test_down_leaves_nothing(bed: Bed) -> None:
    status = bed.status()
    pids = [p["pid"] for p in status["processes"].values()] + [
        pid for n in status["nodes"] for pid in (n["node_pid"], n["kubelet_pid"],
                                                  n["containerd_pid"])]
    others = [f for f in os.listdir("/run/clusterd-testbed/k8s")
              if f.endswith(".json") and f not in (f"{bed.netns}.json", "kernel-settings.json")]
    # a daemon started through `exec` lives in the bed's namespace, and goes with it
    daemon = subprocess.Popen([sys.executable, str(TESTBED), "k8s", "exec", "--dir",
                               str(bed.dir), "--", "sleep", "4242"], start_new_session=True)
    wait_for(lambda: Path(f"/proc/{daemon.pid}/comm").read_text().strip() == "sleep", 10,
             "the daemon to start")
    assert os.readlink(f"/proc/{daemon.pid}/ns/net") == os.readlink(
        f"/proc/{status['processes']['apiserver']['pid']}/ns/net")
    bed.ok("down")
    assert daemon.wait(10) < 0  # killed by a signal
    assert bed.netns not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                           text=True).stdout
    assert not [p for p in pids if Path(f"/proc/{p}").exists()]
    assert not pids_with(str(bed.dir))
    assert not bed.dir.exists()
    assert not list(Path("/sys/fs/cgroup").glob(f"*/clusterd-testbed-k8s.{bed.netns}"))
    assert not Path(f"/run/clusterd-testbed/k8s/{bed.netns}.json").exists()
    for path, existed in bed.paths_before.items():
        assert os.path.lexists(path) == existed, path
    if not others:
        now = {s: Path("/proc/sys", s).read_text().strip() for s in KERNEL_SETTINGS}
        assert now == bed.kernel_before
        assert not Path("/run/clusterd-testbed/k8s/kernel-settings.json").exists()
    assert bed.testbed("down").returncode == 0
    assert bed.testbed("status").returncode == 2
