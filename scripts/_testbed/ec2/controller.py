"""The EC2 test bed's controller: the one long-lived process in the bed's network namespace
(started by `scripts/testbed ec2 up` as `ip netns exec NAME python -m _testbed.ec2.controller`).

It runs moto in-process on 127.0.0.1:5000 (with EC2's fresh address on a start: renumber.py;
no address handed out while a node still answers on it: addresses.py; RunInstances client
tokens bound to their reservations: client_tokens.py),
the API endpoint clients call on 127.0.0.1:4566, and nodes on SERVICE_IP:4566 (proxy.py), the
instance metadata service on 169.254.169.254 (imds.py), the regions and their images
(regions.py; the runtime images' templates come from the command line), a bridge per VPC
(network.py), the watcher that boots a node per running instance (watcher.py), the firewall
that enforces security groups (firewall.py), and answers the command line on DIR/control.sock
(control.py). It is ready once that socket answers `ping`. SIGTERM stops it, and every node
with it. With --iam, moto checks every request against its caller's IAM policies, as AWS does
(accounts.py, iam_auth.py); the controller's own calls use an admin's keys.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

from _testbed.common import assert_loopback
from _testbed.common.control import ControlServer, RequestError
from _testbed.ec2 import accounts, addresses, client_tokens, iam_auth, images, network, renumber
from _testbed.ec2 import regions as bed_regions
from _testbed.ec2.firewall import Firewall
from _testbed.ec2.imds import ImdsServer, Instance, Metadata
from _testbed.ec2.layout import (
    ACCESS_KEY_ID,
    ACCOUNT_ID,
    API_IP,
    API_PORT,
    MOTO_IP,
    MOTO_PORT,
    MOTO_URL,
    READY_MARKER,
    SECRET_ACCESS_KEY,
    SERVICE_IP,
    BedPaths,
    runtime_venv,
)
from _testbed.ec2.proxy import ApiServer, Endpoint
from _testbed.ec2.watcher import Watcher, instances, set_state_reason

log = logging.getLogger("testbed.ec2.controller")

SPOT_REASON = ("Server.SpotInstanceTermination",
               "Server.SpotInstanceTermination: Spot instance termination")


class Bed:
    """What the control socket's requests act on. Methods raise RequestError to refuse."""

    def __init__(self, paths: BedPaths, regions: list[str], iam: bool = False,
                 roots: dict[str, str] | None = None) -> None:
        self.paths = paths
        self.iam = iam
        self._keys = (ACCESS_KEY_ID, SECRET_ACCESS_KEY)  # of the controller's own calls
        self.regions: list[str] = []
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.firewall = Firewall(lambda: list(self.regions), self.api)
        self.endpoint = Endpoint(self.subnet_zone, on_call=self.firewall.saw_call)
        self.watcher = Watcher(paths, self.backends, self.api, roots)
        self._wanted = regions
        # the runtime images: key -> its template (the last one is the current one), and
        # key -> {region: AMI id}
        self._templates: dict[str, str] = {}
        self._runtime_ids: dict[str, dict[str, str]] = {}

    # ------------------------------------------------------------------------ start / stop

    def start(self) -> None:
        import moto.server

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        renumber.install()
        client_tokens.install()
        addresses.install(self.watcher.held_addresses)
        self.moto = moto.server.ThreadedMotoServer(ip_address=assert_loopback(MOTO_IP),
                                                   port=MOTO_PORT, verbose=False)
        self.moto.start()
        if self.iam:
            iam_auth.install()
            self._keys = accounts.bootstrap(self.paths)
        self.add_regions(self._wanted)
        self.api_server = ApiServer((assert_loopback(API_IP), API_PORT), (MOTO_IP, MOTO_PORT),
                                    self.endpoint)
        # The nodes' way to the API (S3, as through a VPC endpoint): their own 127.0.0.1 is
        # their own.
        self.node_api_server = ApiServer((assert_loopback(SERVICE_IP), API_PORT),
                                         (MOTO_IP, MOTO_PORT), self.endpoint)
        self.imds = ImdsServer(Metadata(self.instance_at, lambda: self.client("iam"),
                                        self.assume_role))
        for name, server in (("api", self.api_server), ("node-api", self.node_api_server),
                             ("imds", self.imds)):
            threading.Thread(target=server.serve_forever, name=name, daemon=True).start()
        self.firewall.start()
        self.watcher.start()
        if self.iam:
            accounts.enforce()
        log.info("moto on %s, the API on http://%s:%d%s", MOTO_URL, API_IP, API_PORT,
                 " (enforcing IAM)" if self.iam else "")

    def stop(self) -> None:
        self.endpoint.stopping.set()
        self.watcher.stop()
        self.firewall.stop()
        for server in (self.api_server, self.node_api_server, self.imds):
            server.shutdown()
        self.moto.stop()

    # ------------------------------------------------------------------------ moto

    def backend(self, region: str) -> Any:
        from moto.ec2.models import ec2_backends

        return ec2_backends[ACCOUNT_ID][region]

    def backends(self) -> dict[str, Any]:
        return {r: self.backend(r) for r in list(self.regions)}

    def api(self, region: str) -> Any:
        """A boto3 EC2 client to moto itself (not counted, no fault rules)."""
        with self._lock:
            if region not in self._clients:
                import boto3

                client = boto3.session.Session(
                    aws_access_key_id=self._keys[0], aws_secret_access_key=self._keys[1],
                    region_name=region).client("ec2", endpoint_url=MOTO_URL)
                # The controller's own changes (a preemption, a node's shutdown) bypass the
                # endpoint: the firewall hears of them here.
                client.meta.events.register("after-call.ec2", self._after_own_call)
                self._clients[region] = client
            return self._clients[region]

    def _after_own_call(self, model: Any, **kwargs: Any) -> None:
        self.firewall.saw_call("ec2", model.name)

    def client(self, service: str) -> Any:
        """A boto3 client of a global service (IAM, STS) to moto itself."""
        with self._lock:
            if service not in self._clients:
                import boto3

                self._clients[service] = boto3.session.Session(
                    aws_access_key_id=self._keys[0], aws_secret_access_key=self._keys[1],
                    region_name="us-east-1").client(service, endpoint_url=MOTO_URL)
            return self._clients[service]

    def assume_role(self, role_arn: str, session: str, seconds: int) -> dict[str, Any]:
        """An instance profile's role's credentials, as EC2 gets them: from STS, as the EC2
        service (which the role trusts), not as a caller whose own policies IAM checks."""
        from moto.sts.models import sts_backends

        made = sts_backends[ACCOUNT_ID]["aws"].assume_role(
            region_name="us-east-1", role_session_name=session, role_arn=role_arn,
            policy=None, duration=seconds, external_id=None)
        expiration = made.expiration if made.expiration.tzinfo else made.expiration.replace(
            tzinfo=datetime.UTC)
        return {"AccessKeyId": made.access_key_id, "SecretAccessKey": made.secret_access_key,
                "SessionToken": made.session_token, "Expiration": expiration}

    def instance_at(self, ip: str) -> Instance | None:
        """The running instance whose private address is ip (what the metadata service
        answers for), with the instance profile associated with it now."""
        for region in list(self.regions):
            for inst in instances(self.backend(region)):
                if inst.private_ip == ip and inst.state == "running":
                    profile = getattr(inst, "iam_instance_profile", None) or {}
                    return Instance(inst.id, region, inst.placement.zone, ip,
                                    profile.get("Arn") if isinstance(profile, dict) else None)
        return None

    def subnet_zone(self, region: str, subnet_id: str) -> str | None:
        if region not in self.regions:
            return None
        try:
            return str(self.backend(region).get_subnet(subnet_id).availability_zone)
        except Exception:  # moto's InvalidSubnetIdError: let moto answer the call itself
            return None

    def find(self, instance_id: str) -> tuple[str, Any]:
        for region in list(self.regions):
            for inst in instances(self.backend(region)):
                if inst.id == instance_id:
                    return region, inst
        raise RequestError(f"no instance {instance_id} in the bed",
                           hint="`scripts/testbed ec2 status` lists them")

    # ------------------------------------------------------------------------ requests

    def handle(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        if op == "ping":
            return {"pid": os.getpid(), "regions": self.regions}
        if op == "status":
            return {"regions": self.status(), "runtime_images": self.runtime_images(),
                    "firewall": self.firewall.status()}
        if op == "preempt":
            return self.preempt(str(args.get("instance_id")))
        if op in ("partition", "heal"):
            return self.partition(str(args.get("instance_id")), cut=op == "partition")
        if op == "firewall":
            if args.get("enforce") is not None:
                self.firewall.set_enforce(bool(args["enforce"]))
            return {**self.firewall.status(), "ruleset": self.firewall.rules()}
        if op == "calls":
            return {"calls": self.endpoint.calls(reset=bool(args.get("reset")))}
        if op == "add_regions":
            return {"added": self.add_regions(list(args.get("regions") or []))}
        if op == "runtime_image":
            return {"images": self.add_runtime_image(str(args.get("key")),
                                                     str(args.get("template")))}
        if op == "fault_add":
            return {"rule": self.endpoint.add_rule(dict(args.get("rule") or {})).to_json()}
        if op == "fault_list":
            return {"rules": [r.to_json() for r in self.endpoint.rules()]}
        if op == "fault_remove":
            rule_id = str(args.get("id"))
            if not self.endpoint.remove_rule(rule_id):
                raise RequestError(f"no fault rule {rule_id}",
                                   hint="`scripts/testbed ec2 fault list` shows them")
            return {}
        if op == "fault_clear":
            return {"removed": self.endpoint.clear_rules()}
        raise RequestError(f"unknown request {op!r}")

    def add_regions(self, regions: list[str]) -> list[str]:
        try:
            regions = bed_regions.check_regions(regions)
        except ValueError as e:
            raise RequestError(str(e)) from e
        added = []
        for region in regions:
            if region in self.regions:
                continue
            bed_regions.setup_region(self.api(region), self.backend(region), region)
            network.ensure_bridge(region)
            self.regions.append(region)
            added.append(region)
            for key in self._templates:
                self._register_runtime_image(region, key)
        return added

    def add_runtime_image(self, key: str, template: str) -> dict[str, str]:
        """Register the runtime image of wheelhouse KEY, whose instances start with template as
        their home, in every region (now and later ones); it becomes the current one.
        Idempotent. Returns {region: AMI id}."""
        if not os.path.isfile(os.path.join(template, runtime_venv(key), READY_MARKER)):
            raise RequestError(f"{template} is not a runtime image's template for {key}",
                               hint="`scripts/testbed ec2 up --runtime-image` builds it")
        self._templates.pop(key, None)
        self._templates[key] = template
        for region in list(self.regions):
            self._register_runtime_image(region, key)
        return self.runtime_images()

    def _register_runtime_image(self, region: str, key: str) -> None:
        ami = bed_regions.register_runtime_image(self.backend(region), region, key)
        self._runtime_ids.setdefault(key, {})[region] = ami
        self.watcher.use_template(ami, self._templates[key])
        log.info("region %s: runtime image %s is %s", region, key, ami)

    def runtime_images(self) -> dict[str, str]:
        """{region: AMI id} of the current runtime image ({} if there is none)."""
        keys = list(self._templates)
        return dict(self._runtime_ids.get(keys[-1], {})) if keys else {}

    def status(self) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for region in list(self.regions):
            backend = self.backend(region)
            rows = []
            for inst in instances(backend):
                node, pid = self.watcher.node_state(inst.id, inst.state)
                reason = inst.state_reason
                rows.append({
                    "id": inst.id, "state": inst.state,
                    "state_reason": reason.code or None,
                    "state_reason_message": reason.message or None,
                    "private_ip": inst.private_ip, "type": inst.instance_type,
                    "lifecycle": "spot" if inst.lifecycle == "spot" else "on-demand",
                    "zone": inst.placement.zone, "key_name": inst.key_name,
                    "shutdown_behavior": inst.instance_initiated_shutdown_behavior,
                    "tags": dict(backend.tags.get(inst.id, {})),
                    "node": node, "node_pid": pid,
                    "partitioned": self.watcher.partitioned(inst.id),
                })
            out[region] = rows
        return out

    def preempt(self, instance_id: str) -> dict[str, Any]:
        region, inst = self.find(instance_id)
        if inst.lifecycle != "spot":
            raise RequestError(f"{instance_id} is an on-demand instance; only spot instances "
                               f"can be preempted",
                               hint="`scripts/testbed ec2 status` shows each instance's lifecycle")
        if inst.state in ("shutting-down", "terminated"):
            raise RequestError(f"{instance_id} is already {inst.state}")
        self.api(region).terminate_instances(InstanceIds=[instance_id])
        set_state_reason(inst, *SPOT_REASON)
        now = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
        inst._reason = f"Service initiated ({now} GMT)"
        log.info("preempted spot instance %s in %s", instance_id, region)
        return {"instance_id": instance_id, "region": region, "state": inst.state}

    def partition(self, instance_id: str, cut: bool) -> dict[str, Any]:
        region, inst = self.find(instance_id)
        if inst.state in ("shutting-down", "terminated"):
            raise RequestError(f"{instance_id} is {inst.state}")
        now = self.watcher.partition(instance_id, cut)
        return {"instance_id": instance_id, "region": region, "state": inst.state,
                "partitioned": cut, "link_changed": now}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="controller")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--regions", required=True)
    ap.add_argument("--iam", action="store_true")
    ap.add_argument("--image-roots", action="store_true",
                    help="boot the public images in their Debian roots (images.py; `up` built "
                         "them)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    interfaces = network.interfaces()
    if interfaces != ["lo"]:
        log.error("refusing to run: this network namespace has interfaces %s, not only lo",
                  interfaces)
        return 1
    network.setup_bed_namespace()
    paths = BedPaths(os.path.abspath(args.dir))
    roots = images.ensure_all() if args.image_roots else None
    bed = Bed(paths, args.regions.split(","), iam=args.iam, roots=roots)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    bed.start()
    server = ControlServer(paths.control_sock, bed.handle)
    threading.Thread(target=server.serve_forever, name="control", daemon=True).start()
    log.info("ready: pid %d, regions %s, control socket %s", os.getpid(),
             ",".join(bed.regions), paths.control_sock)
    stopping.wait()
    log.info("stopping")
    server.shutdown()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(paths.control_sock)
    bed.stop()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
