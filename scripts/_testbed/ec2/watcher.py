"""The watcher: keeps one EC2 node (sshd in a network, PID and mount namespace of its own, on
its VPC's bridge: network.py) per running instance in moto, polling moto's backend every POLL_S
seconds.

  running, no node              -> boot a node (first boot: a new disk, disk.py, with the key
                                   pair's key and for a runtime image its template's files)
  running, node at another IP   -> stopped and started between two polls: kill it, boot again
  running, node died            -> boot it again after a backoff (logged)
  running, shutdown requested   -> apply InstanceInitiatedShutdownBehavior through the API
  stopping / stopped            -> kill the node's PID namespace; keep its disk
  shutting-down / terminated    -> kill it and delete the disk
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from _testbed.common import (
    assert_loopback,
    ensure_keygen,
    getpw,
    read_text,
    sshd_config,
    write_file,
)
from _testbed.ec2 import disk, drivers, images, network
from _testbed.ec2.layout import (
    NODE_DISK,
    NODE_HOME,
    NODE_INIT_MODULE,
    NODE_MOUNT,
    NODE_USER,
    SCRIPTS,
    BedPaths,
    InstancePaths,
)
from _testbed.ec2.regions import image_by_name, vpc_cidr

log = logging.getLogger("testbed.ec2.watcher")

POLL_S = 0.25
BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 15.0)  # restarting a node that keeps dying
SHUTDOWN_REASON = ("Client.InstanceInitiatedShutdown",
                   "Client.InstanceInitiatedShutdown: Instance initiated shutdown")
NODE_STATES = ("booting", "up", "down", "none")


@dataclasses.dataclass
class Node:
    instance_id: str
    region: str
    ip: str
    proc: subprocess.Popen[bytes] | None = None
    up: bool = False  # sshd has answered since this boot
    deaths: int = 0  # in a row, for the backoff
    restart_at: float = 0.0

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def instances(backend: Any) -> list[Any]:
    """Every instance in a moto EC2 backend (a snapshot; moto's threads keep changing it)."""
    for _ in range(5):
        try:
            return [i for r in list(backend.reservations.values()) for i in list(r.instances)]
        except RuntimeError:  # changed while we copied it
            time.sleep(0.01)
    return []


class Watcher:
    """Runs the poll loop in a thread of its own; `node_state` and `stop_all` are thread-safe.

    backends() gives {region: moto EC2 backend}; api(region) a boto3 EC2 client to moto."""

    def __init__(self, paths: BedPaths, backends: Callable[[], dict[str, Any]],
                 api: Callable[[str], Any], roots: dict[str, str] | None = None) -> None:
        self.paths = paths
        # suite -> its root (images.py): the public images that name one boot in it; without,
        # every image boots in the host's root (as before the bed had images)
        self.roots = dict(roots or {})
        self.backends = backends
        self.api = api
        self._nodes: dict[str, Node] = {}
        self._templates: dict[str, str] = {}  # runtime image id -> its template home
        self._gone: set[str] = set()  # terminated instances already cleaned up
        self._partitioned: set[str] = set()  # instances whose link is cut
        # Addresses that nodes answer on: replaced, never changed in place, so moto's threads
        # read it without the lock (a boot holds the lock for seconds).
        self._held: frozenset[str] = frozenset()
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.stop_all()

    def partition(self, instance_id: str, cut: bool) -> bool:
        """Cut an instance's link (cut) or restore it; it stays so across the node's boots.
        True if a live node's link changed now."""
        with self._lock:
            if cut:
                self._partitioned.add(instance_id)
            else:
                self._partitioned.discard(instance_id)
            node = self._nodes.get(instance_id)
            changed = node is not None and node.alive() and network.set_link(instance_id,
                                                                              not cut)
            if changed and not cut:
                assert node is not None
                network.forget_neighbour(node.ip)  # its failed ARP entry would linger seconds
        log.info("instance %s: link %s%s", instance_id, "cut" if cut else "restored",
                 "" if changed else " (from its next boot)")
        return changed

    def held_addresses(self) -> frozenset[str]:
        """The addresses live nodes answer on (and booting ones will): for addresses.py, from
        any thread, without waiting."""
        return self._held

    def partitioned(self, instance_id: str) -> bool:
        with self._lock:
            return instance_id in self._partitioned

    def node_state(self, instance_id: str, instance_state: str) -> tuple[str, int | None]:
        """("booting" | "up" | "down" | "none", the node's pid)."""
        with self._lock:
            node = self._nodes.get(instance_id)
            if node is not None and node.alive():
                assert node.proc is not None
                return ("up" if node.up else "booting"), node.proc.pid
        return ("down" if instance_state == "running" else "none"), None

    def use_template(self, image_id: str, template: str) -> None:
        """Instances of image_id start, on their first boot, with a copy of template's files in
        their home (as an EBS volume made from an AMI's snapshot)."""
        with self._lock:
            self._templates[image_id] = template

    def stop_all(self) -> None:
        with self._lock:
            for node in list(self._nodes.values()):
                self._kill(node)

    # ------------------------------------------------------------------------ the loop

    def _loop(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self.tick()
            except Exception:
                log.exception("watcher tick failed")

    def tick(self) -> None:
        for region, backend in self.backends().items():
            for inst in instances(backend):
                with self._lock:
                    self._handle(region, backend, inst)

    def _handle(self, region: str, backend: Any, inst: Any) -> None:
        iid, state = inst.id, inst.state
        node = self._nodes.get(iid)
        if state == "running":
            if node is not None and node.alive() and inst.private_ip != node.ip:
                # Stopped and started again between two ticks (it has a new address): the
                # stop was missed, and the machine boots again as a stop and start would.
                self._kill(node)
                del self._nodes[iid]
                node = None
                log.info("instance %s was stopped and started: node killed, booting it again",
                         iid)
            if node is None or not node.alive():
                self._boot_when_due(region, backend, inst, node)
            else:
                if not node.up and os.path.exists(self.paths.instance(iid).ready):
                    node.up, node.deaths = True, 0
                    log.info("node %s is up: ssh ubuntu@%s", iid, node.ip)
                self._check_shutdown_request(region, inst, node)
        elif state in ("stopping", "stopped"):
            if node is not None:
                self._kill(node)
                del self._nodes[iid]
                log.info("instance %s is %s: node killed, disk kept", iid, state)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.paths.instance(iid).shutdown_request)
        elif state in ("shutting-down", "terminated") and iid not in self._gone:
            if node is not None:
                self._kill(node)
                del self._nodes[iid]
            shutil.rmtree(self.paths.instance(iid).root, ignore_errors=True)
            self._gone.add(iid)
            log.info("instance %s is %s: node killed, disk deleted", iid, state)

    def _boot_when_due(self, region: str, backend: Any, inst: Any, node: Node | None) -> None:
        if node is not None and node.proc is not None:  # it died under a running instance
            code = node.proc.returncode
            node.proc = None
            node.up = False
            delay = BACKOFF_S[min(node.deaths, len(BACKOFF_S) - 1)]
            node.deaths += 1
            node.restart_at = time.monotonic() + delay
            log.warning("node %s died (exit %s) while its instance runs; booting it again in "
                        "%.0fs (see %s)", inst.id, code, delay,
                        self.paths.instance(inst.id).node_log)
        if node is not None and time.monotonic() < node.restart_at:
            return
        ip = inst.private_ip
        if not ip or not ip.startswith("127."):
            if node is None:  # log once
                log.error("instance %s has no loopback private IP (%s); it gets no node",
                          inst.id, ip)
                self._nodes[inst.id] = Node(inst.id, region, ip or "", restart_at=float("inf"))
            return
        if node is None:
            node = self._nodes[inst.id] = Node(inst.id, region, assert_loopback(ip))
        try:
            self._held = self._held | {node.ip}
            node.proc = self._boot(backend, inst, node.ip, region)
        except Exception:
            log.exception("could not boot a node for %s", inst.id)
            node.deaths += 1
            node.restart_at = time.monotonic() + BACKOFF_S[-1]

    # ------------------------------------------------------------------------ nodes

    def image_of(self, backend: Any, inst: Any) -> tuple[str | None, str | None]:
        """(the root an instance boots in, None for the host's; its stand-in driver)."""
        ami = backend.amis.get(inst.image_id) if backend is not None else None
        public = image_by_name(getattr(ami, "name", None))
        if public is None:
            return None, None
        return self.roots.get(public.root), public.driver

    def _boot(self, backend: Any, inst: Any, ip: str, region: str) -> subprocess.Popen[bytes]:
        ipaths = self.paths.instance(inst.id)
        root, driver = self.image_of(backend, inst)
        ids = images.login_ids(root)
        if ids is None:
            pw = getpw(NODE_USER)
            if pw is None:
                raise RuntimeError(f"there is no user {NODE_USER} (`ec2 up` makes it)")
            ids = pw.pw_uid, pw.pw_gid
        os.makedirs(ipaths.root, mode=0o755, exist_ok=True)
        os.makedirs(ipaths.control, mode=0o755, exist_ok=True)
        if not os.path.exists(ipaths.disk):
            self._first_boot(backend, inst, ipaths, *ids)
        image_args = ["--root", root] if root is not None else []
        if driver is not None:
            drivers.write_stand_ins(ipaths.driver_bin, driver, inst.instance_type, inst.id)
            image_args += ["--extra-bin", ipaths.driver_bin]
        ensure_keygen(ipaths.host_key, f"{inst.id}-host")
        host_key_on_node = os.path.join(NODE_MOUNT, os.path.basename(ipaths.host_key))
        want = sshd_config(f"EC2 node {inst.id} of the clusterd test bed in {self.paths.dir} "
                           f"(written by scripts/testbed ec2)", f"{ip}:22", host_key_on_node,
                           NODE_USER)
        if read_text(ipaths.sshd_config) != want:
            write_file(ipaths.sshd_config, want, 0o644)
        for stale in (ipaths.shutdown_request, ipaths.ready):  # from before this boot: moot
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)
        cmd = ["unshare", "--net", "--mount", "--pid", "--fork", "--mount-proc",
               "--kill-child=SIGKILL",
               "--", sys.executable, "-m", NODE_INIT_MODULE, "--instance-id", inst.id,
               "--disk", ipaths.disk, "--disk-mount", NODE_DISK, "--control", ipaths.control,
               "--sbin", self.paths.node_sbin, "--node-mount", NODE_MOUNT,
               "--home-mount", NODE_HOME,
               "--sshd-config", os.path.join(NODE_MOUNT, os.path.basename(ipaths.sshd_config)),
               "--ip", ip, "--prefix", vpc_cidr(region).split("/")[1], *image_args]
        with open(ipaths.node_log, "ab") as lf:
            lf.write(f"--- testbed: booting {inst.id} ({ip}) at "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
            lf.flush()
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=lf, stderr=lf, cwd="/",
                start_new_session=True, close_fds=True,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": SCRIPTS,
                     "LANG": "C.UTF-8"})
        write_file(ipaths.node_pid, f"{proc.pid}\n", 0o644)
        try:
            link = network.attach(inst.id, region, proc.pid,
                                  link_up=inst.id not in self._partitioned)
        except BaseException:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            raise
        log.info("booting node %s at %s (pid %d, link %s, root %s%s)", inst.id, ip, proc.pid,
                 link, root or "the host's", f", {driver} driver stand-in" if driver else "")
        return proc

    def _first_boot(self, backend: Any, inst: Any, ipaths: InstancePaths, uid: int,
                    gid: int) -> None:
        """A new disk (disk.py): /etc/skel, the key pair's public key in .ssh/authorized_keys
        and, for a runtime image, a copy of its template's files."""
        key = backend.key_pairs.get(inst.key_name) if inst.key_name else None
        if key is None:
            log.warning("instance %s has no key pair (%r): nobody can log in to it",
                        inst.id, inst.key_name)
        template = self._templates.get(inst.image_id)
        disk.make(ipaths.disk, skeleton="/etc/skel", uid=uid, gid=gid, template=template,
                  authorized_key=key.public_key if key is not None else None)
        if template is not None:
            log.info("instance %s: its home starts from the runtime image %s", inst.id,
                     inst.image_id)

    def _kill(self, node: Node) -> None:
        """SIGKILL the node's unshare: its PID 1 and with it every process of the node die.
        Then its veth goes, and only then is its address free for another instance: the
        kernel dismantles a namespace with no process left in its own time, and until then
        the old node's network stack answers on the address (ARP, and a reset for every
        connection, its sshd being dead). A new instance given the address had its SSH
        connections refused, for as long as the bridge sent them to the old node."""
        proc = node.proc
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            node.proc, node.up = None, False
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.paths.instance(node.instance_id).node_pid)
        network.delete_link(network.veth_name(node.instance_id))  # both ends go
        if node.ip.startswith("127."):
            network.forget_neighbour(node.ip)  # the old node's MAC, in the bed's cache
        self._held = self._held - {node.ip}

    # ------------------------------------------------------------------------ shutdown

    def _check_shutdown_request(self, region: str, inst: Any, node: Node) -> None:
        ipaths = self.paths.instance(inst.id)
        text = read_text(ipaths.shutdown_request)
        if text is None:
            return
        what = (text.split() or ["poweroff"])[0]
        if what == "reboot":
            log.info("node %s asked for a reboot", inst.id)
            self._kill(node)
            os.unlink(ipaths.shutdown_request)
            return  # the next tick boots it again, the instance never stopped running
        behaviour = inst.instance_initiated_shutdown_behavior or "stop"
        log.info("node %s shut itself down (%s): %s the instance", inst.id, what,
                 "terminating" if behaviour == "terminate" else "stopping")
        ec2 = self.api(region)
        if behaviour == "terminate":
            ec2.terminate_instances(InstanceIds=[inst.id])
        else:
            ec2.stop_instances(InstanceIds=[inst.id])
        set_state_reason(inst, *SHUTDOWN_REASON)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(ipaths.shutdown_request)
        self._handle(region, None, inst)  # kill the node now, not on the next tick


def set_state_reason(inst: Any, code: str, message: str) -> None:
    """What the API cannot do: say why an instance changed state."""
    from moto.ec2.models.instances import StateReason

    inst.state_reason = StateReason(message, code)
