"""The Kubernetes test bed's pure parts (scripts/_testbed/k8s): reading a request as the API
server does, fault rules and the Status they answer with, the files it renders, node
addressing, its apt sources, the openapi-gen input list, and the proxy's HTTP framing over a
socket pair. No root, no network."""

from __future__ import annotations

import base64
import json
import socket
import sys
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from _testbed.k8s import render
from _testbed.k8s.apt import sources_text
from _testbed.k8s.build import ldflags, openapi_dirs
from _testbed.k8s.faults import (
    Request,
    body_name,
    make_rule,
    pick_rule,
    request_info,
    status_body,
)
from _testbed.k8s.host import guard_ruleset
from _testbed.k8s.images import oci_archive, read_archive
from _testbed.k8s.layout import RBAC_FILE, BedPaths, NodeSpec, bed_env, node_specs, removed_env
from _testbed.k8s.proxy import Faults, Stream, parse_head, relay_body

# ---------------------------------------------------------------------------- request info


@pytest.mark.parametrize(("method", "target", "want"), [
    ("POST", "/api/v1/namespaces/bed-a/pods", Request("create", "pods", "bed-a")),
    ("GET", "/api/v1/namespaces/bed-a/pods", Request("list", "pods", "bed-a")),
    ("GET", "/api/v1/namespaces/bed-a/pods?watch=1&resourceVersion=5",
     Request("watch", "pods", "bed-a")),
    ("GET", "/api/v1/watch/namespaces/bed-a/pods", Request("watch", "pods", "bed-a")),
    ("GET", "/api/v1/namespaces/bed-a/pods/p1", Request("get", "pods", "bed-a", "p1")),
    ("DELETE", "/api/v1/namespaces/bed-a/pods/p1", Request("delete", "pods", "bed-a", "p1")),
    ("DELETE", "/api/v1/namespaces/bed-a/pods", Request("deletecollection", "pods", "bed-a")),
    ("PATCH", "/api/v1/nodes/cpu-1/status", Request("patch", "nodes/status", "", "cpu-1")),
    ("POST", "/api/v1/namespaces/bed-b/pods/p1/portforward",
     Request("create", "pods/portforward", "bed-b", "p1")),
    ("GET", "/api/v1/namespaces/bed-b/pods/p1/exec?command=ls",
     Request("get", "pods/exec", "bed-b", "p1")),
    ("GET", "/api/v1/namespaces", Request("list", "namespaces")),
    ("GET", "/api/v1/namespaces/bed-a", Request("get", "namespaces", "bed-a", "bed-a")),
    ("PUT", "/api/v1/namespaces/bed-a/finalize",
     Request("update", "namespaces/finalize", "bed-a", "bed-a")),
    ("POST", "/apis/apps/v1/namespaces/bed-a/deployments",
     Request("create", "deployments", "bed-a", api_group="apps")),
    ("GET", "/version", Request("get")),
    ("GET", "/apis", Request("get")),
])
def test_request_info_reads_requests_as_the_api_server(method: str, target: str,
                                                       want: Request) -> None:
    assert request_info(method, target) == want


# ---------------------------------------------------------------------------- rules


def test_rule_matches_only_what_it_names_and_count_spends_it() -> None:
    faults = Faults()
    rule = faults.add({"code": 403, "verb": "create", "resource": "pods", "count": 2})
    create_a = request_info("POST", "/api/v1/namespaces/bed-a/pods")
    create_b = request_info("POST", "/api/v1/namespaces/bed-b/pods")
    assert faults.fire(request_info("GET", "/api/v1/namespaces/bed-a/pods")) is None
    assert faults.fire(request_info("POST", "/api/v1/namespaces/bed-a/services")) is None
    assert faults.fire(request_info("POST", "/api/v1/namespaces/bed-a/pods/x/exec")) is None
    fired = [faults.fire(create_a), faults.fire(create_b), faults.fire(create_a)]
    assert [f.id if f else None for f in fired] == [rule.id, rule.id, None]
    assert faults.list()[0]["fired"] == 2


def test_first_live_rule_in_order_wins_and_namespace_scopes() -> None:
    only_a = make_rule("r1", {"code": 500, "namespace": "bed-a", "count": 1})
    every = make_rule("r2", {"code": 429})
    req = request_info("POST", "/api/v1/namespaces/bed-a/pods")
    assert pick_rule([only_a, every], req) is only_a
    only_a.fired = 1
    assert pick_rule([only_a, every], req) is every
    assert pick_rule([only_a], request_info("POST", "/api/v1/namespaces/bed-b/pods")) is None


@pytest.mark.parametrize(("spec", "error"), [
    ({}, "needs --code"),
    ({"code": 200}, "400-599"),
    ({"code": 403, "verb": "frobnicate"}, "--verb"),
    ({"code": 403, "count": 0}, "at least 1"),
    ({"code": 403, "delay": -1}, "--delay"),
    ({"code": 403, "resource": "Pods!"}, "not a Kubernetes name"),
    ({"code": 403, "colour": "red"}, "unknown"),
])
def test_bad_rules_are_refused(spec: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        make_rule("r1", spec)


def test_status_bodies_are_the_api_servers() -> None:
    create = request_info("POST", "/api/v1/namespaces/bed-a/pods")
    forbidden = status_body(403, create, "head-1")
    assert forbidden["kind"] == "Status" and forbidden["code"] == 403
    assert forbidden["reason"] == "Forbidden" and forbidden["status"] == "Failure"
    assert forbidden["message"].startswith('pods "head-1" is forbidden: exceeded quota')
    assert forbidden["details"] == {"kind": "pods", "name": "head-1"}
    conflict = status_body(409, create, "head-1")
    assert (conflict["reason"], conflict["message"]) == ("AlreadyExists",
                                                         'pods "head-1" already exists')
    throttled = status_body(429, create)
    assert throttled["reason"] == "TooManyRequests"
    assert throttled["details"]["retryAfterSeconds"] == 1
    assert status_body(500, create)["reason"] == "InternalError"
    assert status_body(403, create, message="nope")["message"] == "nope"
    assert body_name(json.dumps({"metadata": {"generateName": "w-"}}).encode()) == "w-"
    assert body_name(b"not json") == ""


# ---------------------------------------------------------------------------- rendering


def test_nodes_have_fixed_addresses_pod_ranges_and_labels() -> None:
    specs = node_specs(2, 1)
    assert [(s.name, s.ip, s.gpus) for s in specs] == [
        ("cpu-1", "10.77.0.11", 0), ("cpu-2", "10.77.0.12", 0), ("gpu-1", "10.77.0.111", 2)]
    assert specs[0].pod_range == ("10.77.1.2", "10.77.1.254")
    assert specs[2].pod_range == ("10.77.101.2", "10.77.101.254")
    assert len({s.labels["clusterd.testbed/node"] for s in specs}) == 3
    gpu = specs[2].labels
    assert gpu["skypilot.co/accelerator"] == "a100" and gpu["clusterd.testbed/pool"] == "gpu"
    assert "skypilot.co/accelerator" not in specs[0].labels
    # adding nodes later renumbers none
    assert node_specs(3, 2)[:2] == specs[:2] and node_specs(3, 2)[3] == specs[2]


def test_kubeconfigs_have_two_contexts_and_the_ca() -> None:
    tokens = {"clusterd-a": "ta", "clusterd-b": "tb"}
    config = yaml.safe_load(render.clusterd_kubeconfig("https://127.0.0.1:6443", b"PEM",
                                                       tokens))
    assert config["current-context"] == "bed-a"
    assert {c["name"]: (c["context"]["namespace"], c["context"]["user"])
            for c in config["contexts"]} == {"bed-a": ("bed-a", "clusterd-a"),
                                             "bed-b": ("bed-b", "clusterd-b")}
    assert {u["name"]: u["user"]["token"] for u in config["users"]} == tokens
    (cluster,) = config["clusters"]
    assert cluster["cluster"]["server"] == "https://127.0.0.1:6443"
    assert base64.b64decode(cluster["cluster"]["certificate-authority-data"]) == b"PEM"
    admin = yaml.safe_load(render.admin_kubeconfig("https://127.0.0.1:6444", b"PEM", "t0"))
    assert admin["current-context"] == "bed-admin"


def test_exec_contexts_and_the_rbac_context_get_what_readme_says() -> None:
    plugin = render.exec_plugin("/py", "/p/exec_credential.py", "/bed", silent=True)
    config = yaml.safe_load(render.clusterd_kubeconfig(
        "https://127.0.0.1:6443", b"PEM", {"clusterd-a": "ta", "clusterd-b": "tb"},
        {"bed-x": plugin}))
    users = {u["name"]: u["user"] for u in config["users"]}
    assert users["bed-x-user"]["exec"]["args"] == ["/p/exec_credential.py", "--dir", "/bed",
                                                   "--silent"]
    assert users["bed-x-user"]["exec"]["apiVersion"] == "client.authentication.k8s.io/v1beta1"
    with open(RBAC_FILE) as f:
        documented = [d for d in yaml.safe_load_all(f) if d]
    items = render.bootstrap_objects({"pods": "3"}, documented)["items"]
    by_kind = {(i["kind"], i["metadata"]["name"]): i for i in items}
    role = by_kind[("Role", "clusterd")]
    assert role["metadata"]["namespace"] == "bed-b" and role["rules"] == documented[0]["rules"]
    assert by_kind[("RoleBinding", "clusterd-b-clusterd")]["roleRef"]["name"] == "clusterd"
    assert ("RoleBinding", "clusterd-b-admin") not in by_kind  # exactly the file, no more
    readers = by_kind[("ClusterRoleBinding", "clusterd-testbed:node-reader")]["subjects"]
    assert [s["name"] for s in readers] == ["clusterd-a"]
    assert any(r["resources"] == ["pods/portforward"] for r in role["rules"])
    assert by_kind[("ServiceAccount", "clusterd-x")]["metadata"]["namespace"] == "bed-a"


def test_token_file_lines() -> None:
    text = render.token_file([("t1", "admin", ["system:masters"]), ("t2", "clusterd-a", []),
                              ("t3", "system:node:cpu-1", ["system:nodes", "x"])])
    assert text.splitlines() == ['t1,admin,admin,"system:masters"', "t2,clusterd-a,clusterd-a",
                                 't3,system:node:cpu-1,system:node:cpu-1,"system:nodes,x"']


def test_containerd_kubelet_and_cni_configs() -> None:
    node = NodeSpec("cpu-2", 2)
    toml = tomllib.loads(render.containerd_config(node, "docker.io/x/pause:3.4", "/b/cni"))
    cri = toml["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["restrict_oom_score_adj"] is True and cri["netns_mounts_under_state_dir"] is True
    assert cri["sandbox_image"] == "docker.io/x/pause:3.4" and cri["cni"]["conf_dir"] == "/b/cni"
    assert toml["plugins"]["io.containerd.internal.v1.opt"]["path"].startswith("/var/lib/")
    kubelet = json.loads(render.kubelet_config(node, "/cg/cpu-2", "/b/ca.crt", "/b/resolv"))
    assert (kubelet["address"], kubelet["cgroupRoot"], kubelet["cgroupDriver"]) == (
        "10.77.0.12", "/cg/cpu-2", "cgroupfs")
    assert kubelet["failSwapOn"] is False and kubelet["makeIPTablesUtilChains"] is False
    assert kubelet["authentication"]["anonymous"]["enabled"] is False
    assert kubelet["volumePluginDir"].startswith("/var/lib/kubelet/")
    cni = json.loads(render.cni_config(node))
    (bridge,) = cni["plugins"]
    assert (bridge["bridge"], bridge["isGateway"]) == ("k8sbr0", False)
    assert bridge["ipam"]["ranges"] == [[{"subnet": "10.77.0.0/16", "rangeStart": "10.77.2.2",
                                          "rangeEnd": "10.77.2.254"}]]


def test_bootstrap_objects_and_gpu_patch() -> None:
    items = render.bootstrap_objects({"pods": "3"})["items"]
    kinds = [(i["kind"], i["metadata"].get("namespace"), i["metadata"]["name"]) for i in items]
    assert ("Namespace", None, "bed-a") in kinds and ("Namespace", None, "bed-b") in kinds
    (quota,) = [i for i in items if i["kind"] == "ResourceQuota"]
    assert quota["metadata"]["namespace"] == "bed-b" and quota["spec"]["hard"] == {"pods": "3"}
    bindings = {i["metadata"]["name"]: i for i in items if i["kind"] == "RoleBinding"}
    assert bindings["clusterd-a-admin"]["metadata"]["namespace"] == "bed-a"
    assert json.loads(render.gpu_capacity_patch(2)) == [
        {"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": "2"},
        {"op": "add", "path": "/status/allocatable/nvidia.com~1gpu", "value": "2"}]


def test_exec_environment_drops_other_clusters_settings() -> None:
    paths = BedPaths("/tmp/bed")
    env = bed_env(paths, {"KUBECONFIG": "/home/me/.kube/config", "KUBERNETES_SERVICE_HOST": "x",
                          "PATH": "/usr/bin", "HOME": "/root"},
                  {"cache": "/c/v1", "node_image": "docker.io/clusterd-testbed/node:abc"})
    assert env["KUBECONFIG"] == "/tmp/bed/kube/kubeconfig"
    assert "KUBERNETES_SERVICE_HOST" not in env
    assert env["PATH"].split(":")[0] == "/c/v1/bin"
    assert env["CLUSTERD_TESTBED_K8S_NODE_IMAGE"] == "clusterd-testbed/node:abc"
    assert removed_env("KUBECTL_EXTERNAL_DIFF") and not removed_env("HOME")


def test_exec_environment_gives_a_daemon_the_beds_image_and_wheelhouse(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A daemon started through `exec` launches pods with no config of its own: its default
    image is the bed's (the runtime image if there is one), its wheelhouse the one `up`
    prepared (the cache's, or the caller's CLUSTERD_WHEELHOUSE_DIR, as `up` used)."""
    monkeypatch.setenv("CLUSTERD_TESTBED_K8S_CACHE", "/c")
    paths = BedPaths("/tmp/bed")
    state: dict[str, object] = {"cache": "/c/v1",
                                "node_image": "docker.io/clusterd-testbed/node:abc"}
    env = bed_env(paths, {"PATH": "/usr/bin", "CLUSTERD_KUBERNETES_IMAGE": "elsewhere/x:1"},
                  state)
    assert env["CLUSTERD_KUBERNETES_IMAGE"] == "clusterd-testbed/node:abc"
    assert env["CLUSTERD_WHEELHOUSE_DIR"] == "/c/wheelhouse"
    state["runtime_image"] = {"name": "docker.io/clusterd-testbed/node-runtime:abc-k1"}
    env = bed_env(paths, {"PATH": "/usr/bin", "CLUSTERD_WHEELHOUSE_DIR": "/w"}, state)
    assert env["CLUSTERD_KUBERNETES_IMAGE"] == "clusterd-testbed/node-runtime:abc-k1"
    assert env["CLUSTERD_WHEELHOUSE_DIR"] == "/w"


def test_apt_sources_add_deb_src_and_guard_drops_other_links() -> None:
    text = sources_text([{"Types": "deb", "URIs": "http://deb.debian.org/debian",
                          "Suites": "bookworm", "Components": "main",
                          "Signed-By": "/usr/share/keyrings/debian-archive-keyring.gpg"}])
    assert "Types: deb deb-src\n" in text and "Signed-By: /usr/share/keyrings" in text
    guard = guard_ruleset()
    assert 'iifname != "k8sbr0" counter drop' in guard
    assert 'oifname != "k8sbr0" counter drop' in guard


def test_ldflags_name_the_vendored_version_packages() -> None:
    flags = ldflags("2026-01-01T00:00:00Z")
    assert "-X 'k8s.io/kubernetes/vendor/k8s.io/component-base/version.gitVersion=v1.20.2'" \
        in flags
    assert "k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version.gitMinor=20" in flags


def test_openapi_dirs_as_upstream_lists_them(tmp_path: Path) -> None:
    def put(rel: str, text: str) -> None:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)

    tagged = "// +k8s:openapi-gen=true\npackage v1\n"
    put("pkg/apis/a/v1/doc.go", tagged)
    put("staging/src/k8s.io/api/core/v1/doc.go", tagged)
    put("staging/src/k8s.io/code-generator/x/doc.go", tagged)  # left out, as upstream
    put("vendor/github.com/other/doc.go", tagged)  # third-party vendor: left out
    put("pkg/apis/b/doc.go", "// +k8s:deepcopy-gen=package\npackage b\n")
    # a file with some tag at column 0 that mentions openapi-gen anywhere counts (as upstream's
    # two greps have it); a tag not at column 0 does not
    put("pkg/apis/c/types.go", "// +k8s:deepcopy-gen=true\n// x +k8s:openapi-gen=false\n")
    put("pkg/apis/d/doc.go", "package d\n  // +k8s:openapi-gen=true\n")
    assert openapi_dirs(str(tmp_path)) == ["pkg/apis/a/v1", "pkg/apis/c",
                                           "vendor/k8s.io/api/core/v1"]


# ---------------------------------------------------------------------------- proxy framing


def test_relay_streams_chunked_bodies_and_keeps_what_follows() -> None:
    a, b = socket.socketpair()
    c, d = socket.socketpair()
    body = b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    a.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body + b"NEXT")
    src = Stream(b)
    head = src.read_head()
    assert head is not None
    first, headers = parse_head(head)
    assert first == "HTTP/1.1 200 OK" and headers["transfer-encoding"] == "chunked"
    relay_body(src, c, headers, until_close=False)  # the pair's buffer holds it all
    got = b""
    d.settimeout(5)
    while len(got) < len(body):  # it was sent in pieces, as they came
        got += d.recv(4096)
    assert got == body
    assert src.take() == b"NEXT"  # the next message stays in the buffer (an upgrade's bytes)
    for s in (a, b, c, d):
        s.close()


def test_relay_by_content_length_and_drop() -> None:
    a, b = socket.socketpair()
    a.sendall(b'{"metadata": {"name": "x"}}rest')
    kept = relay_body(Stream(b), None, {"content-length": "27"}, until_close=False)
    assert body_name(kept) == "x"
    a.close()
    b.close()


def test_image_archives_round_trip(tmp_path: Path) -> None:
    layers = []
    for i in range(2):
        layer = tmp_path / f"l{i}.tar"
        layer.write_bytes(f"layer {i}".encode() * 100)
        layers.append(str(layer))
    archive = tmp_path / "image.tar"
    oci_archive(str(archive), "docker.io/clusterd-testbed/node:k1", layers,
                {"Entrypoint": ["/e"]})
    with tarfile.open(archive) as t:
        index = json.load(t.extractfile("index.json"))  # type: ignore[arg-type]
    annotations = index["manifests"][0]["annotations"]
    assert annotations["io.containerd.image.name"] == "docker.io/clusterd-testbed/node:k1"
    out = tmp_path / "out"
    out.mkdir()
    got, config = read_archive(str(archive), str(out))
    assert [Path(p).read_bytes() for p in got] == [Path(p).read_bytes() for p in layers]
    assert config["config"] == {"Entrypoint": ["/e"]}
    assert len(config["rootfs"]["diff_ids"]) == 2


def test_up_refuses_plainly_where_the_kubelet_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from _testbed.common import Failure
    from _testbed.k8s import host

    monkeypatch.setattr(host, "cgroup_mounts",
                        lambda: [("/sys/fs/cgroup", "cgroup2", "rw,nsdelegate")])
    with pytest.raises(Failure, match=r"the real kubelet .* cannot run on this machine: it has "
                                      r"cgroup v2 only"):
        host.check_cgroups()
    v1 = [(f"/sys/fs/cgroup/{c}", "cgroup", f"rw,{c}") for c in ("cpu", "cpuacct", "memory")]
    monkeypatch.setattr(host, "cgroup_mounts", lambda: v1)
    with pytest.raises(Failure, match="without cpuset, pids"):
        host.check_cgroups()
