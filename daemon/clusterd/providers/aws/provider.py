"""The `aws` provider: clusters of EC2 instances.

Each cluster gets a security group of its own (SSH plus the task's ports) in the configured
VPC, instances from the daemon's own key pair (its public half imported per region), and tags
naming the cluster, the node's role and this daemon (`clusterd-managed-by`), so that every
instance can be found by tag: a crashed launch resumes by reusing what it finds, teardown
sweeps everything of this daemon's with the cluster's name, and one DescribeInstances per
region answers a refresh of all clusters.

One AWS account may serve several daemons (people, machines), and nothing stops two of them
from naming a cluster alike: only instances with this daemon's `clusterd-managed-by` tag, or
whose ids its record holds, are ever reused, stopped or terminated. Others found under the
cluster's name are another clusterd's: reported (`on_foreign`) and left alone.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path
from typing import Any, ClassVar

import anyio

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd import log
from clusterd.nodes import ClusterInfo, NodeInfo, NodeStatus, SSHTarget
from clusterd.providers.aws import lifetimes
from clusterd.providers.aws.catalog import Catalog, CatalogMiss, load_catalog, region_rank
from clusterd.providers.aws.creation import (
    DEFAULT_DISK_GB,
    TAG_ROLE,
    gpus_of,
    instance_tags,
    kept_and_extra,
    launch_spec,
    run_instances,
)
from clusterd.providers.aws.ec2 import EC2Api, Instance, ObjectStoreAccess, tag_value
from clusterd.providers.aws.handle import AWSHandle, AWSNode
from clusterd.providers.aws.images import default_image_kind
from clusterd.providers.aws.limits import check_volume, instance_arch
from clusterd.providers.aws.network import TAG_CLOUD_NAME, TAG_MANAGED_BY, ClusterNetwork
from clusterd.providers.aws.profile import InstanceProfiles
from clusterd.providers.base import (
    BlockScope,
    ClusterRequest,
    ForeignReport,
    Orphan,
    Placement,
    ProviderContext,
    ProviderDefaults,
    ProviderOf,
    ProvisionError,
)
from clusterd.providers.ports import port_ranges
from clusterd.ssh.connections import SSHConnections
from clusterd.ssh.keys import DaemonKey
from clusterd.user_config import AWSConfig, UserConfig

logger = log.get("clusterd.aws")

NODE_STATES = {
    "pending": NodeStatus.PENDING,
    "running": NodeStatus.RUNNING,
    "stopping": NodeStatus.STOPPING,
    "shutting-down": NodeStatus.STOPPING,
    "stopped": NodeStatus.STOPPED,
    "terminated": NodeStatus.TERMINATED,
}
STATE_TIMEOUT_S = 900.0
SSH_ATTEMPT_S = 20.0
ENABLED_CACHE_S = 60.0


class AWSProvider(ProviderDefaults[AWSHandle]):
    name: ClassVar[str] = "aws"
    skypilot_cloud: ClassVar[str] = "AWS"
    can_stop: ClassVar[bool] = True
    stops_by_shutdown: ClassVar[bool] = True
    terminate_discards_nodes: ClassVar[bool] = True
    keeps_node_times: ClassVar[bool] = True
    honoured_fields: ClassVar[frozenset[str]] = frozenset({
        "resources.instance_type", "resources.use_spot", "resources.disk_size",
        "resources.disk_tier", "resources.image_id", "resources.ports", "resources.labels",
    })

    def __init__(self, config: Callable[[], UserConfig], connections: SSHConnections,
                 key: DaemonKey, managed_by: str, api: EC2Api | None = None,
                 on_foreign: ForeignReport | None = None,
                 on_progress: Callable[[str, str], Awaitable[None]] | None = None,
                 catalog_dir: str = "") -> None:
        self._config = config
        self._catalog_dir = catalog_dir  # the settings' CLUSTERD_CATALOG_DIR: before the config's
        self._connections = connections
        self._key = key
        self.managed_by = managed_by
        self.on_foreign = on_foreign
        self.api = api or EC2Api(lambda: self._aws().request_timeout_s, tell=on_progress)
        self._network = ClusterNetwork(self.api, managed_by)
        self._profiles = InstanceProfiles(self.api, managed_by)
        self._enabled: tuple[bool, float] | None = None

    @classmethod
    def build(cls, context: ProviderContext) -> AWSProvider:
        return cls(context.config, context.connections, DaemonKey(context.state_dir / "ssh"),
                   context.daemon_id, on_foreign=context.on_foreign,
                   on_progress=context.on_progress, catalog_dir=context.settings.catalog_dir)

    def object_store(self) -> ObjectStoreAccess:
        """What bucket storage needs: S3 clients, region and credentials of this provider's
        own session."""
        return self.api.object_store()

    def _aws(self) -> AWSConfig:
        return self._config().aws

    def catalog(self) -> Catalog:
        try:
            return load_catalog(Path(self._catalog_dir) if self._catalog_dir
                                else self._config().catalog_dir)
        except (OSError, ValueError) as exc:
            raise ProtocolError(ErrorCode.INVALID_ARGUMENT, str(exc),
                                "fix catalog_dir in the config, or unset "
                                "CLUSTERD_CATALOG_DIR to use clusterd's own") from None

    async def accelerators(self) -> Catalog:
        return self.catalog()

    # -- placements -----------------------------------------------------------------------

    async def placements(self, request: ClusterRequest) -> list[Placement]:
        resources = request.resources
        if resources.image_id and resources.image_id.startswith("docker:"):
            raise ProvisionError("resources.image_id: docker images are not supported on aws "
                                 "yet", BlockScope.PROVIDER, "name an AMI (ami-...)")
        refused = check_volume(resources.disk_tier, resources.disk_size_gb or DEFAULT_DISK_GB)
        if refused:
            raise ProvisionError(f"aws: {refused}", BlockScope.PROVIDER,
                                 "ask for a larger disk_size, or a lower disk_tier")
        regions = frozenset(r for r, _ in resources.region_images) or None
        try:
            choice = self.catalog().choose(resources, regions)
        except CatalogMiss as exc:
            raise ProvisionError(f"aws: {exc}", BlockScope.PROVIDER,
                                 "`clusterctl show-gpus` lists the accelerators on offer"
                                 ) from None
        names: dict[str, dict[str, str]] = {}
        failures: list[ProvisionError] = []

        async def lookup(region: str) -> None:
            try:
                names[region] = await self.api.zone_names(region)
            except ProvisionError as exc:
                failures.append(exc)

        async with anyio.create_task_group() as group:
            for region in sorted({o.region for o in choice.offers}):
                group.start_soon(lookup, region)
        if not names and failures:
            raise failures[0]
        spec = choice.spec
        placements = []
        for offer in choice.offers:
            zone = names.get(offer.region, {}).get(offer.zone_id)
            if zone is None or (resources.infra.zone and zone != resources.infra.zone):
                continue
            placements.append(Placement(
                "aws", offer.region, zone, spec.instance_type, spec.vcpus, spec.memory_gb,
                spec.accelerator, spec.accelerator_count,
                offer.price_for(choice.spot) or 0.0, choice.spot,
            ))
        # Cheapest first; where prices tie, by region preference, then zone name (a, b, c).
        placements.sort(key=lambda p: (p.price_per_hour, region_rank(p.region or ""),
                                       p.zone or ""))
        if not placements:
            where = resources.infra.zone or resources.infra.region or "any zone"
            raise ProvisionError(f"aws: {spec.instance_type} is not offered in {where}",
                                 BlockScope.PROVIDER)
        return placements

    # -- create / wait --------------------------------------------------------------------

    async def create(self, request: ClusterRequest, placement: Placement) -> AWSHandle:
        region, zone = placement.region or "", placement.zone or ""
        try:
            return await self._create(request, placement, region, zone)
        except BaseException:
            # Nothing of a failed attempt stays behind (the next one goes elsewhere); but the
            # nodes a repair set out to complete are the cluster's, with the user's data.
            survivors = request.previous.instance_ids if isinstance(
                request.previous, AWSHandle) and request.previous.region == region else []
            with anyio.CancelScope(shield=True), anyio.move_on_after(120):
                await self._terminate_tagged(region, request.cloud_name, keep=survivors)
            raise

    async def _create(self, request: ClusterRequest, placement: Placement, region: str,
                      zone: str) -> AWSHandle:
        config = self._aws()
        resources = request.resources
        pair = await anyio.to_thread.run_sync(self._key.ensure)
        key_name = f"clusterd-{pair.digest}"
        await self._network.ensure_key_pair(region, key_name, pair.public_openssh)
        vpc = await self._network.vpc(region, config.vpc_name)
        subnet = await self._network.subnet(region, vpc, zone,
                                             public=not config.use_internal_ips)
        group = await self._network.ensure_security_group(
            region, vpc, request.cloud_name, self._tags(request, None), resources.ports)
        image, root_device = await self._image(region, resources, placement)
        existing = await self._cluster_instances(region, request.cloud_name)
        stopped = [i["InstanceId"] for i in existing if i["State"]["Name"] in
                   ("stopped", "stopping")]
        if stopped:
            await self._wait_states(region, stopped, {"stopped"})
            await self.api.call(region, "StartInstances", InstanceIds=stopped)
        roles = [tag_value(i, TAG_ROLE) for i in existing]
        launch = launch_spec(config, request, placement, image=image, root_device=root_device,
                             key_name=key_name, subnet=subnet, security_group=group)
        launched: list[Instance] = []
        if "head" not in roles:
            launched += await self._run(region, zone, request, launch, "head", 1)
        workers = request.num_nodes - 1 - roles.count("worker")
        if workers > 0:
            launched += await self._run(region, zone, request, launch, "worker", workers)
        instances = await self._keep(region, request, existing + launched)
        return AWSHandle(
            region=region, zone=zone, instance_type=placement.instance_type,
            spot=placement.spot, vpc=vpc, subnet=subnet, security_group=group,
            key_name=key_name, ssh_user=config.ssh_user,
            use_internal_ips=config.use_internal_ips, cpus=placement.cpus,
            gpus=gpus_of(placement.accelerator, placement.accelerator_count),
            nodes=_nodes_of(instances),
        )

    def handle_for_intent(self, cloud_name: str, intent: Placement | None) -> AWSHandle:
        return AWSHandle.for_intent(intent)

    async def _run(self, region: str, zone: str, request: ClusterRequest,
                   launch: dict[str, Any], role: str, count: int) -> list[Instance]:
        return await run_instances(self.api, region, zone, request, launch,
                                   self._tags(request, role), role, count)

    async def _keep(self, region: str, request: ClusterRequest,
                    known: list[Instance]) -> list[Instance]:
        """The cluster's instances: those we made or found, plus any the listing shows;
        the ones beyond a head and num_nodes-1 workers are terminated."""
        listed = await self._cluster_instances(region, request.cloud_name)
        kept, extra = kept_and_extra(known, listed, request.num_nodes)
        if extra:
            logger.warning("terminating extra instances", cluster=request.cloud_name,
                           instances=extra)
            await self.api.call(region, "TerminateInstances", InstanceIds=extra)
        return kept

    def _tags(self, request: ClusterRequest, role: str | None) -> list[dict[str, str]]:
        return instance_tags(self._aws(), request, self.managed_by, role)

    async def _image(self, region: str, resources: Any, placement: Placement
                     ) -> tuple[str, str]:
        arch = instance_arch(placement.instance_type or "")
        image = dict(resources.region_images).get(region) or resources.image_id
        if not image or not image.startswith("ami-"):
            image = await self.api.default_image(
                region, default_image_kind(placement.accelerator), arch)
        return image, await self._network.root_device(region, image)

    async def wait(self, cloud_name: str, handle: AWSHandle, timeout_s: float) -> AWSHandle:
        """Every node running, with its addresses, and answering SSH."""
        region = handle.region
        ids = handle.instance_ids
        with anyio.fail_after(timeout_s):
            instances = await self._wait_states(region, ids, {"running"})
            handle = dataclasses.replace(handle, nodes=_nodes_of(instances))
            info = await self.cluster_info(cloud_name, handle)
            await self._connections.wait_reachable(
                [_ssh_of(node) for node in info.nodes], attempt_s=SSH_ATTEMPT_S,
                first_delay_s=1.0, max_delay_s=10.0)
        return handle

    async def _wait_states(self, region: str, ids: list[str], wanted: set[str]
                           ) -> list[Instance]:
        """Poll until every instance is in one of `wanted`; fails if one is terminated."""
        delay = 0.3
        deadline = time.monotonic() + STATE_TIMEOUT_S
        while True:
            instances = await self.api.instances(
                region, [{"Name": "instance-id", "Values": ids}])
            states = {i["InstanceId"]: i["State"]["Name"] for i in instances}
            gone = [i for i in instances if i["State"]["Name"] in ("terminated",
                                                                    "shutting-down")]
            if gone and "terminated" not in wanted:
                reason = gone[0].get("StateReason", {}).get("Message", "")
                raise ProvisionError(f"aws/{region}: instance {gone[0]['InstanceId']} was "
                                     f"terminated ({reason or 'no reason given'})",
                                     BlockScope.ZONE)
            if len(states) == len(ids) and set(states.values()) <= wanted:
                return instances
            if time.monotonic() > deadline:
                raise ProvisionError(f"aws/{region}: instances did not reach "
                                     f"{'/'.join(sorted(wanted))} in time: {states}",
                                     BlockScope.ZONE)
            await anyio.sleep(delay)
            delay = min(delay * 1.5, 5.0)

    # -- what exists ----------------------------------------------------------------------

    async def _cluster_instances(self, region: str, cloud_name: str,
                                 recorded: Collection[str] = ()) -> list[Instance]:
        """The cluster's instances (not terminated) that are this daemon's: tagged with its
        name and this daemon's id, or `recorded` (ids its record holds). Others tagged with
        its name are another clusterd's: reported, and left out."""
        listed = await self.api.instances(region, [
            {"Name": f"tag:{TAG_CLOUD_NAME}", "Values": [cloud_name]},
            {"Name": "instance-state-name",
             "Values": [s for s in NODE_STATES if s != "terminated"]},
        ])
        ours: list[Instance] = []
        foreign: list[tuple[str, str | None]] = []
        for instance in listed:
            owner = tag_value(instance, TAG_MANAGED_BY)
            if owner == self.managed_by or instance["InstanceId"] in recorded:
                ours.append(instance)
            else:
                foreign.append((instance["InstanceId"], owner))
        if foreign:
            await self._report_foreign(region, cloud_name, "instance", foreign)
        return ours

    async def _report_foreign(self, region: str, cloud_name: str, kind: str,
                              found: list[tuple[str, str | None]]) -> None:
        """Say what of another clusterd's (id, its managed-by tag) was left alone. The same
        sentence for the same finding, whatever the operation, so that it can be said once."""
        owners = sorted({owner or "none" for _, owner in found})
        ids = sorted(i for i, _ in found)
        many = len(ids) > 1
        text = (f"aws/{region}: {len(ids)} {kind}{'s' if many else ''} tagged as cluster "
                f"{cloud_name} belong{'' if many else 's'} to another clusterd "
                f"(clusterd-managed-by: {', '.join(owners)}; this daemon is {self.managed_by})"
                f" and {'were' if many else 'was'} left alone: {', '.join(ids)}")
        logger.warning("another clusterd's resources left alone", cluster=cloud_name,
                       region=region, kind=kind, found=ids, managed_by=owners)
        if self.on_foreign is not None:
            await self.on_foreign(cloud_name, text)

    async def query(self, cloud_name: str, handle: AWSHandle) -> list[NodeInfo]:
        result = (await self.query_many([(cloud_name, handle)]))[cloud_name]
        if isinstance(result, ProvisionError):
            raise result
        return result

    async def query_many(
        self, clusters: list[tuple[str, AWSHandle]]
    ) -> dict[str, list[NodeInfo] | ProvisionError]:
        """One DescribeInstances per region (all of this daemon's instances, by tag)."""
        by_region: dict[str, list[tuple[str, AWSHandle]]] = {}
        for cloud_name, handle in clusters:
            by_region.setdefault(handle.region, []).append((cloud_name, handle))
        found: dict[str, list[NodeInfo] | ProvisionError] = {}

        async def one_region(region: str, members: list[tuple[str, AWSHandle]]) -> None:
            try:
                instances = await self.managed_instances(region)
            except ProvisionError as exc:
                found.update({name: exc for name, _ in members})
                return
            by_cluster: dict[str, list[Instance]] = {}
            for instance in instances:
                cluster = tag_value(instance, TAG_CLOUD_NAME) or ""
                by_cluster.setdefault(cluster, []).append(instance)
            for name, handle in members:
                found[name] = self._node_infos(name, handle, by_cluster.get(name, []))

        async with anyio.create_task_group() as group:
            for region, members in by_region.items():
                group.start_soon(one_region, region, members)
        return found

    async def managed_instances(self, region: str) -> list[Instance]:
        """Every instance this daemon made in `region`, whatever its state."""
        return await self.api.instances(
            region, [{"Name": f"tag:{TAG_MANAGED_BY}", "Values": [self.managed_by]}])

    def _node_infos(self, cloud_name: str, handle: AWSHandle,
                    instances: list[Instance]) -> list[NodeInfo]:
        recorded = set(handle.instance_ids)
        current = [i for i in instances if i["State"]["Name"] != "terminated"
                   or i["InstanceId"] in recorded]
        seen = {i["InstanceId"] for i in current}
        stops = {i["InstanceId"]: lifetimes.stopped_at(i) for i in current}
        infos = [dataclasses.replace(self._node_info(cloud_name, handle, node),
                                     stopped_at=stops.get(node.id))
                 for node in _nodes_of(current)]
        infos += [NodeInfo(node_id=node_id, internal_ip="", status=NodeStatus.TERMINATED,
                           reason="the instance no longer exists")
                  for node_id in sorted(recorded - seen)]
        return infos

    def _node_info(self, cloud_name: str, handle: AWSHandle, node: AWSNode) -> NodeInfo:
        region = handle.region
        address = node.ip if handle.use_internal_ips else (node.public_ip or node.ip)
        target = None
        if address:
            target = SSHTarget(
                host=address, port=22, user=handle.ssh_user or self._aws().ssh_user,
                identity_file=str(self._key.ensure().private_path),
                host_key_alias=node.id, proxy_command=self._aws().proxy_command(region),
            )
        return NodeInfo(
            node_id=node.id,
            internal_ip=node.ip,
            status=NODE_STATES.get(node.state, NodeStatus.PENDING),
            ssh=target,
            runtime_dir=f"~/.clusterd/clusters/{cloud_name}",
            workdir="~/sky_workdir",
            cpus=float(handle.cpus or 1),
            gpus=float(handle.gpus or 0),
            reason=node.reason,
            image=node.image,
            check_gpu_driver=True,
            external_ip="" if handle.use_internal_ips else node.public_ip or "",
            launched_at=lifetimes.launched_at(node.launched),
        )

    async def cluster_info(self, cloud_name: str, handle: AWSHandle) -> ClusterInfo:
        nodes = [self._node_info(cloud_name, handle, n) for n in handle.nodes]
        if not nodes or any(n.ssh is None for n in nodes):
            raise ProvisionError(f"{cloud_name} has no reachable instances recorded",
                                 BlockScope.FATAL)
        return ClusterInfo(tuple(nodes), shutdown_to_stop=True)

    # -- stop / start / terminate ---------------------------------------------------------

    async def stop(self, cloud_name: str, handle: AWSHandle) -> None:
        if handle.spot:
            raise ProtocolError(ErrorCode.UNSUPPORTED,
                                "spot instances cannot be stopped, only terminated",
                                "tear the cluster down instead: clusterctl down")
        region = handle.region
        ids = [i["InstanceId"] for i in await self._cluster_instances(
            region, cloud_name, handle.instance_ids)]
        if ids:
            await self.api.call(region, "StopInstances", InstanceIds=ids)
            await self._wait_states(region, ids, {"stopped"})

    async def start(self, cloud_name: str, handle: AWSHandle) -> AWSHandle:
        region = handle.region
        recorded = handle.instance_ids
        instances = await self.api.instances(region, [{"Name": "instance-id",
                                                       "Values": recorded}])
        gone = [i for i in instances if i["State"]["Name"] in ("terminated", "shutting-down")]
        if gone or len(instances) < len(recorded):
            what = (f"{gone[0]['InstanceId']} was terminated "
                    f"({gone[0].get('StateReason', {}).get('Message') or 'no reason given'})"
                    if gone else "an instance no longer exists")
            raise ProvisionError(f"{cloud_name} cannot be started where it lives "
                                 f"(aws/{region}/{handle.zone}): {what}",
                                 BlockScope.FATAL, "tear it down and launch it again")
        await self._wait_states(region, recorded, {"stopped", "running"})
        stopped = [i["InstanceId"] for i in await self.api.instances(
            region, [{"Name": "instance-id", "Values": recorded},
                     {"Name": "instance-state-name", "Values": ["stopped"]}])]
        if stopped:
            await self.api.call(region, "StartInstances", InstanceIds=stopped)
        # Addresses can change when an instance starts again: the handle follows them.
        return await self.wait(cloud_name, handle, STATE_TIMEOUT_S)

    async def terminate(self, cloud_name: str, handle: AWSHandle) -> None:
        if not handle.region:
            return
        await self._terminate_tagged(handle.region, cloud_name, handle.instance_ids)

    async def _terminate_tagged(self, region: str, cloud_name: str,
                                extra: list[str] | None = None,
                                keep: Collection[str] = ()) -> None:
        """Terminate the cluster's instances that are this daemon's, and those recorded
        (`extra`) even if their tags were lost; never those in `keep`."""
        ids = {i["InstanceId"] for i in await self._cluster_instances(region, cloud_name,
                                                                      extra or ())}
        if extra:
            listed = await self.api.instances(region, [
                {"Name": "instance-id", "Values": extra},
                {"Name": "instance-state-name",
                 "Values": ["pending", "running", "stopping", "stopped"]}])
            ids |= {i["InstanceId"] for i in listed}
        ids -= set(keep)
        if ids:
            logger.info("terminating instances", cluster=cloud_name, region=region,
                        instances=sorted(ids))
            await self.api.call(region, "TerminateInstances", InstanceIds=sorted(ids))

    async def open_ports(self, cloud_name: str, handle: AWSHandle,
                         ports: tuple[str, ...]) -> None:
        if ports and handle.security_group:
            await self._network.open_ports(handle.region, handle.security_group,
                                           port_ranges(ports))

    async def cleanup_ports(self, cloud_name: str, handle: AWSHandle) -> None:
        """Remove what the cluster had around its nodes: its grant of buckets, and its security
        group once no instance of it holds it (another clusterd's of the same name is left
        alone, and reported)."""
        await self._profiles.release(cloud_name)
        if handle.region:
            foreign = await self._network.remove_security_groups(handle.region, cloud_name)
            if foreign:
                await self._report_foreign(handle.region, cloud_name, "security group",
                                           foreign)

    async def apply_autostop(self, cloud_name: str, handle: AWSHandle,
                             down: bool | None) -> None:
        if handle.spot or not handle.region:
            return  # one-time spot instances only ever terminate
        behaviour = "terminate" if down else "stop"
        for node in handle.nodes:
            # The Attribute/Value form: EC2 takes both, and some EC2-compatible endpoints
            # (moto) only this one.
            await self.api.call(handle.region, "ModifyInstanceAttribute",
                                InstanceId=node.id,
                                Attribute="instanceInitiatedShutdownBehavior", Value=behaviour)

    async def grant_buckets(self, cloud_name: str, handle: AWSHandle,
                            buckets: tuple[str, ...]) -> bool:
        arn = await self._profiles.ensure(cloud_name, buckets)
        await self._profiles.associate(handle.region, [n.id for n in handle.nodes], arn)
        return True

    # -- check ----------------------------------------------------------------------------

    async def enabled(self) -> bool:
        now = time.monotonic()
        if self._enabled is None or now - self._enabled[1] > ENABLED_CACHE_S:
            self._enabled = (await self.api.credentials_configured(), now)
        return self._enabled[0]

    async def check(self) -> dict[str, Any]:
        try:
            with anyio.fail_after(15):
                if not await self.api.credentials_configured():
                    return {"ok": False, "detail": "no AWS credentials found (environment, "
                            "~/.aws/credentials, AWS_PROFILE)"}
                region = await self.api.default_region()
                identity = await self.api.call(region, "GetCallerIdentity", service="sts")
                regions = await self.api.call(region, "DescribeRegions", Filters=[
                    {"Name": "opt-in-status", "Values": ["opt-in-not-required", "opted-in"]}])
        except ProvisionError as exc:
            return {"ok": False, "detail": exc.message, "hint": exc.hint}
        except TimeoutError:
            return {"ok": False, "detail": "the AWS API did not answer within 15 s"}
        enabled = sorted(r["RegionName"] for r in regions.get("Regions", []))
        offered = self.catalog().regions()
        return {
            "ok": True,
            "detail": f"credentials of {identity.get('Arn')}",
            "identity": identity.get("Arn"),
            "account": identity.get("Account"),
            "regions": enabled,
            "catalog_regions": sorted(offered & set(enabled)),
        }

    async def aclose(self) -> None:
        await self.api.aclose()

    async def orphans(self, known: Callable[[], set[str]]) -> list[Orphan]:
        """Per region of the catalog: this daemon's instances and security groups whose
        cluster no record names."""
        found: dict[tuple[str, str], tuple[list[str], list[str]]] = {}

        async def region(name: str) -> None:
            instances = await self.managed_instances(name)
            groups = (await self.api.call(name, "DescribeSecurityGroups", Filters=[
                {"Name": f"tag:{TAG_MANAGED_BY}", "Values": [self.managed_by]}])).get(
                    "SecurityGroups", [])
            for instance in instances:
                if instance["State"]["Name"] != "terminated":
                    key = (name, tag_value(instance, TAG_CLOUD_NAME) or "?")
                    found.setdefault(key, ([], []))[0].append(instance["InstanceId"])
            for group in groups:
                key = (name, tag_value(group, TAG_CLOUD_NAME) or "?")
                found.setdefault(key, ([], []))[1].append(group["GroupId"])

        async with anyio.create_task_group() as group:
            for name in sorted(self.catalog().regions()):
                group.start_soon(region, name)
        recorded = known()
        return [Orphan(self.name, region_name, cloud_name, tuple(sorted(ids)),
                       tuple(sorted(groups)))
                for (region_name, cloud_name), (ids, groups) in sorted(found.items())
                if cloud_name not in recorded]


    async def remove_orphan(self, orphan: Orphan) -> None:
        """Terminate its instances (this daemon's by tag, and those it listed), then remove
        its security group."""
        handle = AWSHandle(orphan.region or "", nodes=tuple(AWSNode(i) for i in orphan.instances))
        await self.terminate(orphan.cloud_name, handle)
        await self.cleanup_ports(orphan.cloud_name, handle)

def _nodes_of(instances: list[Instance]) -> tuple[AWSNode, ...]:
    """Instances as a handle records them: the head first, then workers by launch time."""
    nodes = [AWSNode(
        id=i["InstanceId"],
        role=tag_value(i, TAG_ROLE) or "worker",
        ip=i.get("PrivateIpAddress") or "",
        public_ip=i.get("PublicIpAddress"),
        state=i["State"]["Name"],
        reason=(i.get("StateReason") or {}).get("Message", "")
        if i["State"]["Name"] != "running" else "",
        launched=str(i.get("LaunchTime") or ""),
        image=str(i.get("ImageId") or ""),
    ) for i in instances]
    nodes.sort(key=lambda n: (n.role != "head", n.launched, n.id))
    return tuple(nodes)


# mypy checks here that the class is a provider of its own handles, whole.
_PROVIDER: type[ProviderOf[AWSHandle]] = AWSProvider


def _ssh_of(node: NodeInfo) -> SSHTarget:
    assert node.ssh is not None  # every node of a cloud cluster is reached over SSH
    return node.ssh
