"""`scripts/testbed k8s up | down | kill-node | restart-apiserver`: making the bed (building
Kubernetes first if this machine has no build of it), bringing it to what was asked, and
taking it apart by pid. Runs outside the bed's namespace; standard library only."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from typing import Any

from _testbed import requirements
from _testbed.common import (
    Failure,
    kill_pids,
    lock_dir,
    log,
    prepare_wheelhouse,
    wait_reaped,
    warn,
)
from _testbed.common.control import request
from _testbed.common.host import (
    EC2_BEDS,
    K8S_BEDS,
    NETNS_RE,
    delete_netns,
    mounts_under,
    netns_exists,
    netns_pids,
)
from _testbed.k8s import build, components, host, images, nodes, pki, render, runtime_image
from _testbed.k8s.layout import (
    ADMIN_USER,
    API_URL,
    CONTEXTS,
    DEFAULT_QUOTA,
    ETCD_PORT,
    LOOPBACK,
    MAX_NODES,
    RBAC_FILE,
    VENV_BIN,
    BedPaths,
    cache_root,
    default_netns,
    load_state,
    node_specs,
    save_state,
    wheelhouse_dir,
)

HIDDEN_IN_NODES = ("/var/lib", "/var/log", "/run", "/var/run")  # each node has its own
SERVICE_ACCOUNT_TIMEOUT_S = 60.0


def check_dir(d: str) -> None:
    for hidden in HIDDEN_IN_NODES:
        if d == hidden or d.startswith(hidden + "/"):
            raise Failure(f"--dir {d} is under {hidden}, which every node of the bed has a "
                          f"directory of its own on; nodes could not read the bed's files",
                          hint="use a directory elsewhere, e.g. under /tmp")
    if os.path.islink(d):
        raise Failure(f"{d} is a symlink; refusing to use it as the bed's directory")
    if os.path.exists(d) and os.stat(d).st_uid != 0:
        raise Failure(f"{d} exists and is not owned by root; refusing to use it")


def bed_lock(paths: BedPaths, create: bool = False) -> int | None:
    """Serialise commands on one bed: a flock on its directory (made if `create`; None if it
    does not exist). Not its parent's, as the EC2 bed does: both beds' default directories
    are in /tmp, and they would wait on each other."""
    if create:
        os.makedirs(paths.dir, mode=0o755, exist_ok=True)
    return lock_dir(paths.dir) if os.path.isdir(paths.dir) else None


def admin_api(paths: BedPaths) -> components.Api:
    return components.Api(paths, pki.tokens_of(paths)[ADMIN_USER])


# ---------------------------------------------------------------------------- up


def ensure_cached(with_runtime_image: bool, with_wheelhouse: bool
                  ) -> tuple[str, str, str, dict[str, str] | None]:
    """What the bed boots from, built on this machine's first call (minutes) and cached by
    version: Kubernetes, the node image, the runtime's wheelhouse (which a daemon in the bed
    could not make: the namespace has no way to the package index) and, if asked, the runtime
    image. Returns the build's directory, the node image and its archive, and the runtime
    image (name, archive, key)."""
    requirements.ensure_debian_packages(requirements.K8S_PACKAGES)
    host.check_cgroups()
    version_dir = build.ensure_built(cache_root())
    images_dir = os.path.join(cache_root(), "images")
    node_image, node_archive = images.ensure_node_image(images_dir)
    runtime: dict[str, str] | None = None
    house = None
    if with_wheelhouse or with_runtime_image:
        directory = wheelhouse_dir(os.environ)
        os.makedirs(directory, mode=0o755, exist_ok=True)
        house = prepare_wheelhouse(os.path.join(VENV_BIN, "python"), directory,
                                   "`up --no-wheelhouse` skips it")
    if with_runtime_image:
        assert house is not None
        name, archive = runtime_image.ensure_runtime_image(images_dir, node_image,
                                                           node_archive, house)
        runtime = {"name": name, "archive": archive, "key": os.path.basename(house)}
    return version_dir, node_image, node_archive, runtime


def cmd_build(args: argparse.Namespace) -> int:
    """Build (or find in the cache) what `up` boots from, and start nothing: the test suite
    runs it before its first test, so a machine's first build is no test's time."""
    t0 = time.monotonic()
    version_dir, node_image, _, runtime = ensure_cached(args.runtime_image, args.runtime_image)
    print(f"Kubernetes {version_dir}, node image {node_image}"
          + (f", runtime image {runtime['name']}" if runtime else "")
          + f" ({time.monotonic() - t0:.1f} s)")
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    paths = BedPaths(os.path.abspath(args.dir))
    check_dir(paths.dir)
    version_dir, node_image, node_archive, runtime = ensure_cached(args.runtime_image,
                                                                   not args.no_wheelhouse)
    lock = bed_lock(paths, create=True)  # the bed's first, then the registry's, always
    reg_lock = lock_dir(K8S_BEDS.ensure_dir())
    try:
        state = load_state(paths) if os.path.isdir(paths.dir) else None
        if state is not None and args.netns and args.netns != state["netns"]:
            raise Failure(f"the bed in {paths.dir} runs in namespace {state['netns']}, "
                          f"not {args.netns}", hint="k8s down first, or another --dir")
        netns = (state or {}).get("netns") or args.netns or default_netns()
        if state is None:
            claim_netns(paths, netns)
            state = {"kind": "k8s", "version": 1, "dir": paths.dir, "netns": netns,
                     "procs": {}, "nodes": {}, "wanted": {"nodes": 2, "gpu_nodes": 1}}
        for key, value in (("nodes", args.nodes), ("gpu_nodes", args.gpu_nodes)):
            if value is not None:
                state["wanted"][key] = value
        info = build.build_info(version_dir)
        if state.get("cache") not in (None, version_dir) and \
                any(components.is_ours(p, paths) for p in state["procs"].values()):
            warn(f"this machine's build is now {version_dir}; what runs is from "
                 f"{state['cache']} (nodes booted from now on use the new one): `down` "
                 f"and `up` to run it all")
        state.update(cache=version_dir, package_version=info["package_version"],
                     kubernetes=info["kubernetes"], node_image=node_image)
        if runtime is not None:
            state["runtime_image"] = runtime
        elif state.get("runtime_image") and \
                not os.path.isfile(state["runtime_image"]["archive"]):
            warn(f"the bed's runtime image {state['runtime_image']['name']} is gone from the "
                 f"cache; nodes booted from now on lack it (`up --runtime-image` makes it)")
            del state["runtime_image"]
        os.makedirs(paths.dir, mode=0o755, exist_ok=True)
        save_state(paths, state)  # before making anything: `down` can always clean up
        K8S_BEDS.register(paths.dir, netns)
        os.close(reg_lock)  # the bed is registered: other beds may come and go meanwhile
        reg_lock = -1
        archives = [os.path.join(version_dir, "images", "pause.tar"), node_archive]
        if state.get("runtime_image"):
            archives.append(state["runtime_image"]["archive"])
        timings = converge(paths, state, archives)
    finally:
        if lock is not None:
            os.close(lock)
        if reg_lock >= 0:
            os.close(reg_lock)
    print_summary(paths, state, timings, time.monotonic() - t0)
    return 0


def claim_netns(paths: BedPaths, netns: str) -> None:
    if not NETNS_RE.match(netns):
        raise Failure(f"--netns {netns!r} is not a usable namespace name")
    mine = K8S_BEDS.live_beds()
    theirs = EC2_BEDS.live_beds()
    if (netns in mine and mine[netns] != paths.dir) or netns in theirs:
        raise Failure(f"network namespace {netns} belongs to another test bed "
                      f"({mine.get(netns) or theirs.get(netns)})", hint="use another --netns")
    if netns_exists(netns) and netns not in mine:
        raise Failure(f"network namespace {netns} exists and is not a test bed's",
                      hint="use another --netns")


def converge(paths: BedPaths, state: dict[str, Any], archives: list[str]) -> dict[str, float]:
    """Start what is not running, in dependency order; add and remove nodes to match
    state["wanted"]. Returns timings for the summary."""
    netns, bin_dir = state["netns"], os.path.join(state["cache"], "bin")
    specs = node_specs(state["wanted"]["nodes"], state["wanted"]["gpu_nodes"])
    for d in (paths.logs, paths.kube, paths.flexvolume, paths.nodes):
        os.makedirs(d, exist_ok=True)
    for sub, mode in (("run", 0o700), ("state", 0o755), ("config", 0o755)):
        d = os.path.join(paths.client, sub)  # `exec`'s XDG directories: a daemon's own
        os.makedirs(d, mode=mode, exist_ok=True)
        os.chmod(d, mode)
    pki.ensure_pki(paths)
    pki.write_kubeconfigs(paths, specs)
    host.setup_network(netns, [s.ip for s in specs])
    api = admin_api(paths)
    timings: dict[str, float] = {}
    for name in components.ORDER:
        if components.is_ours(state["procs"].get(name), paths):
            continue
        t = time.monotonic()
        pid = components.start(name, paths, netns, bin_dir, specs[0].name)
        state["procs"][name] = pid
        save_state(paths, state)
        wait_component(name, pid, paths, api)
        timings[name] = time.monotonic() - t
        if name == "apiserver":
            bootstrap(api)
    for name in sorted(set(state["nodes"]) - {s.name for s in specs}):
        remove_node(paths, state, api, name)
    host.save_kernel_settings()
    started: dict[str, int] = {}
    for spec in specs:
        have = state["nodes"].get(spec.name) or {}
        if nodes.is_node(have.get("pid"), paths, spec.name):
            continue
        host.remove_cgroups(netns, spec.name)  # a dead node's leftovers
        pid = nodes.start(spec, paths, netns, bin_dir, archives)
        state["nodes"][spec.name] = {"index": spec.index, "gpus": spec.gpus, "ip": spec.ip,
                                     "pid": pid, "started_at": time.time()}
        started[spec.name] = pid
        save_state(paths, state)
    if started:
        log(f"  booting node(s) {', '.join(started)} ...")
        took = nodes.wait_ready(api, paths, started)
        timings.update({f"node {n} Ready": s for n, s in took.items()})
    runtime = state.get("runtime_image")
    for spec in specs:
        if spec.gpus:
            nodes.ensure_gpus(api, spec)
        if runtime and spec.name not in started:  # booted before the bed had the image
            t = time.monotonic()
            if nodes.import_image(paths, spec.name, bin_dir, runtime["name"],
                                  runtime["archive"]):
                timings[f"runtime image into {spec.name}"] = time.monotonic() - t
    wait_service_accounts(api)
    return timings


def wait_component(name: str, pid: int, paths: BedPaths, api: components.Api) -> None:
    check: Any
    if name == "controller":
        def check() -> bool:
            return bool(request(paths.control_sock, "ping", timeout=5))
    elif name == "etcd":
        def check() -> bool:
            got = request(paths.control_sock, "http", timeout=10, method="GET",
                          url=f"http://{LOOPBACK}:{ETCD_PORT}/health", token=None)
            return bool(got["status"] == 200)
    elif name == "apiserver":
        def check() -> bool:
            return api.call("GET", "/readyz", timeout=10)[0] == 200
    else:
        started = time.monotonic()

        def check() -> bool:  # no health port: alive for a moment is all we can see
            return time.monotonic() - started > 0.5

    components.wait_until(name, check, pid, paths.log(name), timeout=90)


def bootstrap(api: components.Api) -> None:
    """The bed's namespaces, RBAC and quota (created if missing; a quota changed since is
    kept as it is)."""
    for item in render.bootstrap_objects(DEFAULT_QUOTA, clusterd_rbac())["items"]:
        meta = item["metadata"]
        group = "api/v1" if item["apiVersion"] == "v1" else f"apis/{item['apiVersion']}"
        plural = {"Namespace": "namespaces", "RoleBinding": "rolebindings",
                  "ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings",
                  "ResourceQuota": "resourcequotas", "Role": "roles",
                  "ServiceAccount": "serviceaccounts"}[item["kind"]]
        where = f"/namespaces/{meta['namespace']}" if "namespace" in meta else ""
        api.ok("POST", f"/{group}{where}/{plural}", item, allow=(409,))


def clusterd_rbac() -> list[dict[str, Any]]:
    """The Role and ClusterRole README gives (docs/kubernetes-rbac.yaml), as written there."""
    import yaml  # PyYAML: the project's venv has it, as Debian's python3 (python3-yaml)

    with open(RBAC_FILE) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def wait_service_accounts(api: components.Api) -> None:
    """Pods can be created in a namespace once its default service account has its token."""
    deadline = time.monotonic() + SERVICE_ACCOUNT_TIMEOUT_S
    for _, namespace, _ in CONTEXTS:
        while True:
            status, text = api.call("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/"
                                           "default")
            if status == 200 and json.loads(text).get("secrets"):
                break
            if time.monotonic() > deadline:
                raise Failure(f"namespace {namespace} has no default service account with a "
                              f"token after {SERVICE_ACCOUNT_TIMEOUT_S:.0f}s (the "
                              f"controller-manager's job)", hint="see its log")
            time.sleep(0.2)


def remove_node(paths: BedPaths, state: dict[str, Any], api: components.Api,
                name: str) -> None:
    node = state["nodes"].pop(name)
    nodes.kill(node.get("pid"), paths, name)
    api.call("DELETE", f"/api/v1/nodes/{name}")
    host.remove_cgroups(state["netns"], name)
    host.remove_node_ip(state["netns"], node["ip"])
    shutil.rmtree(paths.node(name).root, ignore_errors=True)
    save_state(paths, state)
    log(f"  removed node {name}")


def print_summary(paths: BedPaths, state: dict[str, Any], timings: dict[str, float],
                  total: float) -> None:
    specs = node_specs(state["wanted"]["nodes"], state["wanted"]["gpu_nodes"])
    what = ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()) or "everything was running"
    log(f"Kubernetes test bed in {paths.dir} is up in {total:.1f}s (namespace "
        f"{state['netns']}; {what})")
    log(f"  Kubernetes {state['kubernetes']} (Debian {state['package_version']}), built in "
        f"{state['cache']}")
    log(f"  API {API_URL} inside the namespace; contexts "
        f"{', '.join(c for c, _, _ in CONTEXTS)} in {paths.kubeconfig} "
        f"(KUBECONFIG in `exec`)")
    described = [f"{s.name} ({s.ip}" + (f", {s.gpus} GPUs)" if s.gpus else ")") for s in specs]
    log(f"  nodes: {', '.join(described)}")
    log(f"  node image: {state['node_image'].removeprefix('docker.io/')}")
    if state.get("runtime_image"):
        log(f"  runtime image: {state['runtime_image']['name'].removeprefix('docker.io/')} "
            f"(clusterd's runtime {state['runtime_image']['key']} in /home/sky/.clusterd; "
            f"$CLUSTERD_TESTBED_K8S_RUNTIME_IMAGE in `exec`)")
    log("  try: scripts/testbed k8s exec -- kubectl get nodes -o wide")


# ---------------------------------------------------------------------------- down


def cmd_down(args: argparse.Namespace) -> int:
    paths = BedPaths(os.path.abspath(args.dir))
    lock = bed_lock(paths)
    reg_lock = lock_dir(K8S_BEDS.ensure_dir())
    try:
        state = load_state(paths) if os.path.isdir(paths.dir) else None
        netns = (state or {}).get("netns") or K8S_BEDS.registered_netns(paths.dir)
        if state is None and not os.path.isdir(paths.dir) and netns is None:
            log(f"no Kubernetes test bed in {paths.dir}; nothing to do")
            return 0
        teardown(paths, state or {"netns": netns, "procs": {}, "nodes": {}})
    finally:
        if lock is not None:
            os.close(lock)
        os.close(reg_lock)
    log(f"Kubernetes test bed in {paths.dir} is down")
    return 0


def teardown(paths: BedPaths, state: dict[str, Any]) -> None:
    """Stop everything the bed started, by pid (nodes first: their pods die with them), then
    whatever else runs in its namespace (daemons `exec` started), its cgroups, the namespace
    (its bridge, addresses and rules go with it), the registry entry, the kernel settings
    (when it is the last bed), and its directory. Idempotent."""
    errors: list[str] = []
    netns = state.get("netns")
    for name, node in (state.get("nodes") or {}).items():
        nodes.kill(node.get("pid"), paths, name)
    for name in reversed(components.ORDER):
        components.stop((state.get("procs") or {}).get(name), paths)
    for name, pid in (state.get("procs") or {}).items():  # added later (the archive relay)
        if name not in components.ORDER:
            components.stop(pid, paths)
    if netns:
        for _ in range(5):
            pids = netns_pids(netns)
            if not pids:
                break
            kill_pids(pids)
        left = netns_pids(netns)
        if left:
            errors.append(f"processes {left} in namespace {netns} would not die")
        errors += host.remove_cgroups(netns)
        if not left:
            try:
                delete_netns(netns)
            except Failure as e:
                errors.append(str(e))
        K8S_BEDS.unregister(netns)
    if not set(K8S_BEDS.live_beds()) - {netns}:
        errors += host.restore_kernel_settings()
    if errors:
        raise Failure("down did not finish (kept " + paths.dir + " so it can be retried):\n  "
                      + "\n  ".join(errors))
    if os.path.isdir(paths.dir):
        mounted = mounts_under(paths.dir)
        if mounted:
            raise Failure(f"{paths.dir} has mounts under it ({', '.join(mounted)}); "
                          "not deleting it")
        shutil.rmtree(paths.dir)
    wait_reaped()


def check_counts(nodes_n: int | None, gpu_n: int | None) -> str | None:
    """A usage error for `up`'s node counts, or None."""
    if nodes_n is not None and not 1 <= nodes_n <= MAX_NODES:
        return f"--nodes must be between 1 and {MAX_NODES}"
    if gpu_n is not None and not 0 <= gpu_n <= MAX_NODES:
        return f"--gpu-nodes must be between 0 and {MAX_NODES}"
    return None

