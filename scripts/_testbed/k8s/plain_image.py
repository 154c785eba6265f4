"""`scripts/testbed k8s plain-image`: a plain Python image, as people run on real clusters (like
`python:3.11`), and Debian's archive within the pods' reach, as a real cluster's pods have it.

The image is Debian bookworm (debootstrap minbase from Debian's archive, cached like the node
image) with python3 and python3-venv and nothing of what clusterd needs on a node: no sshd, no
rsync, no sudo, no user; its entrypoint is python3. It is named as what it stands in for,
Python's official `python:3.11-slim` (Debian bookworm, Python 3.11, none of those either).
Its apt sources name the archive the machine uses (deb.debian.org), with Debian's own keys:
what it installs is checked as anywhere.

The archive: the bed's namespace has no link out, so a relay carries TCP connections to
BED_IP:80 (inside) over a Unix socket in the bed's directory to the archive's port 80
(outside): socat on each side, started here, recorded with the bed's processes, stopped by
`down`. Pods reach it as deb.debian.org through a host alias (the pod_config `hostAliases`
this command prints), since the bed has no DNS. Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import time
from typing import Any
from urllib.parse import urlparse

from _testbed.common import Failure, debian_mirror, debootstrap, log, progress, run
from _testbed.k8s import components, nodes
from _testbed.k8s.commands import bed_lock
from _testbed.k8s.images import SUITE, oci_archive
from _testbed.k8s.layout import BED_IP, BedPaths, cache_root, save_state
from _testbed.k8s.operations import require_bed

PACKAGES = ("python3", "python3-venv", "ca-certificates")
# It stands in for Python's official slim image of bookworm's Python (3.11), and is named so:
# clusterd's default image on a daemon of that Python lands on it, as on a real cluster.
NAME = "docker.io/library/python:3.11-slim"
RELAY_PORT = 80
RELAY_IN, RELAY_OUT = "archive-relay-in", "archive-relay-out"


def ensure_plain_image(images_dir: str) -> tuple[str, str, str]:
    """(name, archive, archive host) of the plain image: found, or built now (a minute)."""
    mirror = debian_mirror()
    key = hashlib.sha256(json.dumps([SUITE, mirror, PACKAGES, 1]).encode()).hexdigest()[:12]
    name = NAME
    archive = os.path.join(images_dir, f"plain-{key}.tar")
    host = urlparse(mirror).hostname or ""
    if os.path.isfile(archive):
        return name, archive, host
    os.makedirs(images_dir, mode=0o755, exist_ok=True)
    work = archive.removesuffix(".tar") + ".build"
    shutil.rmtree(work, ignore_errors=True)
    rootfs = os.path.join(work, "rootfs")
    os.makedirs(work)
    start = time.monotonic()
    # Progress on stderr: `plain-image --json` prints its answer, and only that, on stdout.
    progress(f"building the plain image {name} (debootstrap {SUITE}: python3, no sshd; once) "
             "...")
    debootstrap(SUITE, rootfs, PACKAGES, mirror)
    for rel in ("var/lib/apt/lists", "var/cache/apt/archives"):  # as images ship: no lists
        d = os.path.join(rootfs, rel)
        for entry in os.listdir(d):
            if os.path.isfile(os.path.join(d, entry)) and entry != "lock":
                os.unlink(os.path.join(d, entry))
    layer = os.path.join(work, "layer.tar")
    run(["tar", "--numeric-owner", "--xattrs", "-C", rootfs, "--exclude=./dev/*",
         "--exclude=./proc/*", "--exclude=./sys/*", "-cf", layer, "."], timeout=600)
    oci_archive(archive, name, [layer], {
        "Entrypoint": ["python3"],
        "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "LANG=C.UTF-8"], "WorkingDir": "/"})
    shutil.rmtree(work, ignore_errors=True)
    progress(f"plain image {name} built in {time.monotonic() - start:.0f}s "
             f"({os.path.getsize(archive) >> 20} MB)")
    return name, archive, host


def _relay_commands(paths: BedPaths, host: str) -> dict[str, list[str]]:
    sock = os.path.join(paths.dir, "archive-relay.sock")
    return {RELAY_OUT: ["socat", f"UNIX-LISTEN:{sock},fork,unlink-early,mode=600",
                        f"TCP:{host}:{RELAY_PORT}"],
            RELAY_IN: ["socat", f"TCP-LISTEN:{RELAY_PORT},bind={BED_IP},reuseaddr,fork",
                       f"UNIX-CONNECT:{sock}"]}


def ensure_relay(paths: BedPaths, state: dict[str, Any], host: str) -> None:
    """The archive relay's two socat processes, running (started if not)."""
    commands = _relay_commands(paths, host)
    for name in (RELAY_OUT, RELAY_IN):
        if components.is_ours(state["procs"].get(name), paths):
            continue
        cmd = commands[name]
        if name == RELAY_IN:
            cmd = ["ip", "netns", "exec", state["netns"], *cmd]
        with open(paths.log(name), "ab") as out:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                    cwd=paths.dir, start_new_session=True, close_fds=True)
        state["procs"][name] = proc.pid
        save_state(paths, state)
        sock = commands[RELAY_OUT][1].split(":", 1)[1].split(",", 1)[0]
        deadline = time.monotonic() + 10
        while name == RELAY_OUT and not os.path.exists(sock):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise Failure(f"the archive relay did not start: see {paths.log(name)}")
            time.sleep(0.05)


def stop_relay(paths: BedPaths, state: dict[str, Any]) -> None:
    for name in (RELAY_IN, RELAY_OUT):
        components.stop((state.get("procs") or {}).get(name), paths)


def cmd_plain_image(args: argparse.Namespace) -> int:
    paths = BedPaths(os.path.abspath(args.dir))
    name, archive, host = ensure_plain_image(os.path.join(cache_root(), "images"))
    lock = bed_lock(paths)
    try:
        state = require_bed(paths)
        bin_dir = os.path.join(state["cache"], "bin")
        for node, info in state["nodes"].items():
            if nodes.is_node(info.get("pid"), paths, node):
                nodes.import_image(paths, node, bin_dir, name, archive)
        ensure_relay(paths, state, host)
    finally:
        if lock is not None:
            os.close(lock)
    out = {"image": name, "archive_host": host,
           "pod_config": {"spec": {"hostAliases": [{"ip": BED_IP, "hostnames": [host]}]}}}
    if args.json:
        print(json.dumps(out))
    else:
        log(f"plain image {name} in every node; pods reach {host} as {BED_IP}:{RELAY_PORT} "
            f"with the host alias: {json.dumps(out['pod_config'])}")
    return 0
