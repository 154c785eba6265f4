"""The user's configuration file: `$CLUSTERD_CONFIG`, else `~/.config/clusterd/config.yaml`.

It follows SkyPilot's `~/.sky/config.yaml` layout for the keys clusterd reads, so a user's
settings carry over:

    catalog_dir: ~/.sky/catalogs/v7     # a catalog in SkyPilot's CSV format (DIR/aws/vms.csv)
    strict: true                        # refuse task fields without effect (--strict)
    aws:
      vpc_name: my-vpc                  # instances go in this VPC (default: the default VPC)
      use_internal_ips: true            # reach nodes by private IP (no public IPs)
      ssh_user: ubuntu                  # the image's login user
      ssh_proxy_command: ssh -W %h:%p jump   # or per region: {us-east-1: "...", ...}
      labels: {team: ml}                # tags on everything clusterd creates
      request_timeout: 30               # seconds an EC2 API call may take (then retried)
      owner_tag_hostname: true          # tag clusterd-owner: user@host (default: user only)
      disk_price_per_gb_month: 0.08     # what a GB of EBS costs per month (cost reports)
    kubernetes:
      allowed_contexts: [ctx-a, ctx-b]  # the kubeconfig contexts to use, in failover order
                                        # (default: the current context)
      networking_mode: portforward      # or nodeport: how the daemon reaches the pods' sshd
      provision_timeout: 10             # seconds a pod may wait unscheduled before failover
      image: registry/node:tag          # the pods' image (default: python:X.Y-slim)
      ssh_user: sky                     # the image's login user
      image_pull_policy: IfNotPresent
      autoscaler: gke                   # or karpenter, coreweave, generic: pods may wait
                                        # for nodes it adds (provision_timeout then 600)
      pod_config: {spec: {tolerations: [...]}}   # merged into every pod (docs/kubernetes.md)
      ephemeral_storage: 4Gi            # local disk each pod asks for (runtime, workdir)
      ephemeral_storage_limit: 50Gi     # and may use at most (default: no limit)
      pricing:                          # what pods cost (cost reports; default: nothing)
        cpu_per_hour: 0.031             # dollars per CPU requested and hour
        memory_gib_per_hour: 0.004      # per GiB of memory requested and hour
        gpu_per_hour: {A100: 2.9, T4: 0.35}   # per GPU of that type and hour
        disk_gb_per_month: 0.1          # per GB of the task's disk_size and month
    budget:                             # per calendar month, UTC (docs/budgets.md)
      monthly: 200                      # dollars
      warn_at: 0.8                      # warn at this fraction of it
      action: stop                      # past it: warn, stop or down what spends
      providers: {aws: {monthly: 150, action: down}}   # each also its own
    cost:
      idle_warning_after: 2h            # warn of a cluster UP, idle, with no autostop
                                        # (90s, 30m, 2h, 1d; a number: minutes; off)

The file is read again whenever it changes; a bad value is reported (file and key) by the
operation that needs it, and never stops the daemon.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from clusterctl import paths
from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.cost.budget import ACTIONS, Budget, BudgetAction
from clusterd.pod_config import PodConfigError
from clusterd.pod_config import parse as parse_pod_config
from clusterd.quantities import parse_quantity
from clusterd.safe_yaml import YAMLProblem, read_regular_file, safe_load

MAX_CONFIG_BYTES = 1024 * 1024

AWS_KEYS = {"vpc_name", "use_internal_ips", "ssh_user", "ssh_proxy_command", "labels",
            "request_timeout", "owner_tag_hostname", "disk_price_per_gb_month"}
KUBERNETES_KEYS = {"allowed_contexts", "networking_mode", "provision_timeout", "image",
                   "ssh_user", "image_pull_policy", "pod_config", "autoscaler",
                   "ephemeral_storage", "ephemeral_storage_limit", "pricing"}
PRICING_KEYS = {"cpu_per_hour", "memory_gib_per_hour", "gpu_per_hour", "disk_gb_per_month"}
# gp3's list price in us-east-1: the catalog has no disk prices.
DEFAULT_EBS_PRICE_PER_GB_MONTH = 0.08
# SkyPilot's Kubernetes keys that clusterd does not read (yet): accepted, not read.
IGNORED_KUBERNETES_KEYS = {"ports", "remote_identity", "custom_metadata",
                           "high_availability", "kueue", "dws", "context_configs",
                           "fuse_device_manager_daemonset_config"}
# SkyPilot's `kubernetes.autoscaler` values: the kind of autoscaler that adds nodes.
AUTOSCALERS = ("generic", "gke", "karpenter", "coreweave")
# How long a pod may wait for a node: without an autoscaler, a node that is busy now
# (SkyPilot's 10 s); with one, a node it adds (minutes on every cloud).
PROVISION_TIMEOUT_S = 10.0
AUTOSCALER_PROVISION_TIMEOUT_S = 600.0
# What a pod asks of its node's disk by default: the runtime (a venv with Ray, about 1.5 GB
# installed) and the workdir, with room for the job's own files.
DEFAULT_EPHEMERAL_STORAGE = "4Gi"
TOP_LEVEL_KEYS = {"catalog_dir", "aws", "kubernetes", "strict", "budget", "cost"}
BUDGET_KEYS = {"monthly", "warn_at", "action"}
COST_KEYS = {"idle_warning_after"}
# The idle-cost guard's default (cost/idle_guard.py): two hours idle with no autostop.
DEFAULT_IDLE_WARNING_AFTER_S = 7200.0
DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# SkyPilot keys that mean something there but nothing here (yet): accepted, not read.
IGNORED_TOP_LEVEL = {"jobs", "serve", "allowed_clouds", "docker", "nvidia_gpus", "admin_policy",
                     "gcp", "azure", "api_server", "workspaces", "provision"}
IGNORED_AWS_KEYS = {"security_group_name", "remote_identity", "specific_reservations",
                    "prioritize_reservations", "disk_encrypted", "post_provision_runcmd"}


class ConfigError(ProtocolError):
    def __init__(self, path: Path, key: str, message: str) -> None:
        super().__init__(ErrorCode.INVALID_ARGUMENT, f"{path}: {key}: {message}",
                         "fix the configuration file (see docs/providers.md: Configuration)")


@dataclasses.dataclass(frozen=True)
class AWSConfig:
    vpc_name: str | None = None
    use_internal_ips: bool = False
    ssh_user: str = "ubuntu"
    ssh_proxy_command: str | dict[str, str] | None = None
    labels: tuple[tuple[str, str], ...] = ()
    request_timeout_s: float = 30.0
    # The clusterd-owner tag names this machine too (user@host), for whoever reads the
    # account's tags; off by default, since a host name says more than is asked.
    owner_tag_hostname: bool = False
    disk_price_per_gb_month: float = DEFAULT_EBS_PRICE_PER_GB_MONTH

    def proxy_command(self, region: str) -> str | None:
        if isinstance(self.ssh_proxy_command, dict):
            return self.ssh_proxy_command.get(region)
        return self.ssh_proxy_command


@dataclasses.dataclass(frozen=True)
class KubernetesPricing:
    """What a pod costs, from what it requests (clusterd/cost/prices.py); all 0 unless set."""

    cpu_per_hour: float = 0.0
    memory_gib_per_hour: float = 0.0
    gpu_per_hour: tuple[tuple[str, float], ...] = ()  # (accelerator type, dollars per hour)
    disk_gb_per_month: float = 0.0

    def gpu(self, accelerator: str) -> float | None:
        """Dollars per hour of one GPU of that type (case-insensitive); None: not priced."""
        return next((price for name, price in self.gpu_per_hour
                     if name.lower() == accelerator.lower()), None)

    def pod_per_hour(self, cpus: float, memory_gb: float, accelerator: str | None = None,
                     gpus: float = 0) -> tuple[float, str | None]:
        """Dollars per hour of one pod requesting this much, and the GPU type left out of
        it for want of a price (None: nothing left out). The one place pods are priced: the
        provider's placements and the cost ledger both ask here."""
        price = cpus * self.cpu_per_hour + memory_gb * self.memory_gib_per_hour
        if not (accelerator and gpus):
            return price, None
        per_gpu = self.gpu(accelerator)
        if per_gpu is None:
            return price, accelerator
        return price + gpus * per_gpu, None


@dataclasses.dataclass(frozen=True)
class KubernetesConfig:
    allowed_contexts: tuple[str, ...] = ()  # none: the kubeconfig's current context
    networking_mode: str = "portforward"
    # SkyPilot's default: a pod the scheduler cannot place within this is capacity elsewhere.
    provision_timeout_s: float = 10.0
    image: str | None = None
    ssh_user: str = "sky"
    image_pull_policy: str = "IfNotPresent"
    autoscaler: str | None = None  # one of AUTOSCALERS
    pod_config: str = ""  # canonical JSON (pod_config.parse)
    ephemeral_storage: str = DEFAULT_EPHEMERAL_STORAGE
    ephemeral_storage_limit: str = ""
    pricing: KubernetesPricing = dataclasses.field(default_factory=KubernetesPricing)


@dataclasses.dataclass(frozen=True)
class UserConfig:
    path: Path
    catalog_dir: Path | None = None
    aws: AWSConfig = dataclasses.field(default_factory=AWSConfig)
    kubernetes: KubernetesConfig = dataclasses.field(default_factory=KubernetesConfig)
    # Refuse task fields that would be accepted without effect (as --strict does).
    strict: bool = False
    budgets: tuple[Budget, ...] = ()  # the account's first (if any), then per provider
    # A cluster UP and idle this long with no autostop is warned of; None: never.
    idle_warning_after_s: float | None = DEFAULT_IDLE_WARNING_AFTER_S


def config_path() -> Path:
    explicit = os.environ.get("CLUSTERD_CONFIG")
    return Path(explicit) if explicit else Path(paths.config_dir()) / "config.yaml"


def parse(path: Path, text: str) -> UserConfig:
    try:
        raw = safe_load(text) or {}
    except YAMLProblem as exc:
        raise ConfigError(path, "(file)", f"not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(path, "(file)", "expected a map of settings")
    for key in raw:
        if key not in TOP_LEVEL_KEYS | IGNORED_TOP_LEVEL:
            raise ConfigError(path, str(key), "unknown key")
    catalog = raw.get("catalog_dir")
    if catalog is not None and not isinstance(catalog, str):
        raise ConfigError(path, "catalog_dir", "expected a directory path")
    strict = raw.get("strict", False)
    if not isinstance(strict, bool):
        raise ConfigError(path, "strict", "expected true or false")
    return UserConfig(
        path=path,
        catalog_dir=Path(os.path.expanduser(catalog)) if catalog else None,
        aws=_aws(path, raw.get("aws")),
        kubernetes=_kubernetes(path, raw.get("kubernetes")),
        strict=strict,
        budgets=_budgets(path, raw.get("budget")),
        idle_warning_after_s=_cost(path, raw.get("cost")),
    )


def _cost(path: Path, raw: Any) -> float | None:
    """`cost: {idle_warning_after: 2h}`: the idle-cost guard's time (None: off)."""
    if raw is None:
        return DEFAULT_IDLE_WARNING_AFTER_S
    if not isinstance(raw, dict):
        raise ConfigError(path, "cost", "expected a map (idle_warning_after)")
    for key in raw:
        if key not in COST_KEYS:
            raise ConfigError(path, f"cost.{key}", "unknown key (expected idle_warning_after)")
    return _duration(path, "cost.idle_warning_after",
                     raw.get("idle_warning_after", DEFAULT_IDLE_WARNING_AFTER_S / 60))


def _duration(path: Path, key: str, value: Any) -> float | None:
    """Seconds from `90s`, `30m`, `2h`, `1d` or a number of minutes; None for off/false/0."""
    if value is False or value == 0 or value == "off":
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value) * 60
    elif isinstance(value, str) and value[-1:] in DURATION_UNITS:
        try:
            seconds = float(value[:-1]) * DURATION_UNITS[value[-1]]
        except ValueError:
            seconds = -1.0
    else:
        seconds = -1.0
    if not 0 < seconds <= 366 * 86400:
        raise ConfigError(path, key, f"expected a time such as 90s, 30m, 2h or 1d (a number: "
                          f"minutes), or off; got {str(value)[:40]!r}")
    return seconds


def _aws(path: Path, raw: Any) -> AWSConfig:
    if raw is None:
        return AWSConfig()
    if not isinstance(raw, dict):
        raise ConfigError(path, "aws", "expected a map")
    for key in raw:
        if key not in AWS_KEYS | IGNORED_AWS_KEYS:
            raise ConfigError(path, f"aws.{key}", "unknown key")
    vpc = raw.get("vpc_name")
    if vpc is not None and (not isinstance(vpc, str) or not vpc):
        raise ConfigError(path, "aws.vpc_name", "expected a VPC name")
    internal = raw.get("use_internal_ips", False)
    if not isinstance(internal, bool):
        raise ConfigError(path, "aws.use_internal_ips", "expected true or false")
    owner_host = raw.get("owner_tag_hostname", False)
    if not isinstance(owner_host, bool):
        raise ConfigError(path, "aws.owner_tag_hostname", "expected true or false")
    user = _user_name(path, "aws.ssh_user", raw.get("ssh_user", "ubuntu"))
    proxy = raw.get("ssh_proxy_command")
    if proxy is not None:
        if isinstance(proxy, dict):
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in proxy.items()):
                raise ConfigError(path, "aws.ssh_proxy_command",
                                  "expected a command, or a map of region to command")
        elif not isinstance(proxy, str):
            raise ConfigError(path, "aws.ssh_proxy_command",
                              "expected a command, or a map of region to command")
    labels = raw.get("labels") or {}
    if not isinstance(labels, dict) or not all(
            isinstance(v, str | int | float) and not isinstance(v, bool)
            for v in labels.values()):
        raise ConfigError(path, "aws.labels", "expected a map of tag name to value")
    timeout = raw.get("request_timeout", 30.0)
    if (not isinstance(timeout, int | float) or isinstance(timeout, bool)
            or not 0.5 <= timeout <= 600):
        raise ConfigError(path, "aws.request_timeout", "expected seconds between 0.5 and 600")
    return AWSConfig(
        vpc_name=vpc,
        use_internal_ips=internal,
        ssh_user=user,
        ssh_proxy_command=proxy,
        labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
        request_timeout_s=float(timeout),
        owner_tag_hostname=owner_host,
        disk_price_per_gb_month=_dollars(path, "aws.disk_price_per_gb_month",
                                         raw.get("disk_price_per_gb_month",
                                                 DEFAULT_EBS_PRICE_PER_GB_MONTH)),
    )


def _dollars(path: Path, key: str, value: Any) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value < 1e6:
        raise ConfigError(path, key, f"expected a price in dollars, got {str(value)[:40]!r}")
    return float(value)


def _pricing(path: Path, raw: Any) -> KubernetesPricing:
    if raw is None:
        return KubernetesPricing()
    if not isinstance(raw, dict):
        raise ConfigError(path, "kubernetes.pricing", "expected a map")
    for key in raw:
        if key not in PRICING_KEYS:
            raise ConfigError(path, f"kubernetes.pricing.{key}", "unknown key (expected one "
                              f"of {', '.join(sorted(PRICING_KEYS))})")
    gpus = raw.get("gpu_per_hour") or {}
    if not isinstance(gpus, dict):
        raise ConfigError(path, "kubernetes.pricing.gpu_per_hour",
                          "expected a map of GPU type to dollars per hour")
    return KubernetesPricing(
        cpu_per_hour=_dollars(path, "kubernetes.pricing.cpu_per_hour",
                              raw.get("cpu_per_hour", 0.0)),
        memory_gib_per_hour=_dollars(path, "kubernetes.pricing.memory_gib_per_hour",
                                     raw.get("memory_gib_per_hour", 0.0)),
        gpu_per_hour=tuple(sorted(
            (str(name), _dollars(path, f"kubernetes.pricing.gpu_per_hour.{name}", price))
            for name, price in gpus.items())),
        disk_gb_per_month=_dollars(path, "kubernetes.pricing.disk_gb_per_month",
                                   raw.get("disk_gb_per_month", 0.0)),
    )


def _budgets(path: Path, raw: Any) -> tuple[Budget, ...]:
    """`budget: {monthly, warn_at, action, providers: {NAME: {monthly, warn_at, action}}}`:
    the account's budget (optional) and each provider's; a provider's warn_at and action
    default to the account's."""
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise ConfigError(path, "budget", "expected a map (monthly, warn_at, action, "
                          "providers)")
    account = _budget(path, "budget", raw, BUDGET_KEYS | {"providers"}, None, None)
    found = [account] if account is not None else []
    base = account or Budget(monthly=1.0)  # only its warn_at and action are inherited
    providers = raw.get("providers") or {}
    if not isinstance(providers, dict):
        raise ConfigError(path, "budget.providers", "expected a map of provider name to "
                          "budget")
    for name, each in providers.items():
        key = f"budget.providers.{name}"
        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigError(path, key, "expected a provider name (aws, kubernetes, ...)")
        if not isinstance(each, dict) or "monthly" not in each:
            raise ConfigError(path, key, "expected a map with monthly (dollars)")
        budget = _budget(path, key, each, BUDGET_KEYS, base, name)
        assert budget is not None
        found.append(budget)
    return tuple(found)


def _budget(path: Path, key: str, raw: dict[str, Any], allowed: set[str],
            base: Budget | None, provider: str | None) -> Budget | None:
    for name in raw:
        if name not in allowed:
            raise ConfigError(path, f"{key}.{name}", "unknown key")
    monthly = raw.get("monthly")
    if monthly is None:
        if "warn_at" in raw or "action" in raw:
            raise ConfigError(path, f"{key}.monthly", "expected dollars per month (a budget "
                              "with warn_at or action needs one)")
        return None
    if not isinstance(monthly, int | float) or isinstance(monthly, bool) or monthly <= 0:
        raise ConfigError(path, f"{key}.monthly", f"expected dollars per month above 0, got "
                          f"{monthly!r}")
    warn_at = raw.get("warn_at", base.warn_at if base else 0.8)
    if (not isinstance(warn_at, int | float) or isinstance(warn_at, bool)
            or not 0 < warn_at <= 1):
        raise ConfigError(path, f"{key}.warn_at", f"expected a fraction above 0 and at most "
                          f"1 (0.8 warns at 80 %), got {warn_at!r}")
    action = raw.get("action", str(base.action) if base else "warn")
    if action not in ACTIONS:
        raise ConfigError(path, f"{key}.action", f"expected one of {', '.join(ACTIONS)}, got "
                          f"{action!r}")
    return Budget(float(monthly), float(warn_at), BudgetAction(action), provider)


def _user_name(path: Path, key: str, user: Any) -> str:
    if not isinstance(user, str) or not user or not user.replace("-", "").replace(
            "_", "").isalnum():
        raise ConfigError(path, key, f"not a user name: {user!r}")
    return user


def _kubernetes(path: Path, raw: Any) -> KubernetesConfig:
    if raw is None:
        return KubernetesConfig()
    if not isinstance(raw, dict):
        raise ConfigError(path, "kubernetes", "expected a map")
    for key in raw:
        if key not in KUBERNETES_KEYS | IGNORED_KUBERNETES_KEYS:
            raise ConfigError(path, f"kubernetes.{key}", "unknown key")
    contexts = raw.get("allowed_contexts") or []
    if not isinstance(contexts, list) or not all(isinstance(c, str) and c for c in contexts):
        raise ConfigError(path, "kubernetes.allowed_contexts", "expected a list of context "
                          "names")
    mode = raw.get("networking_mode", "portforward")
    if mode not in ("portforward", "nodeport"):
        raise ConfigError(path, "kubernetes.networking_mode",
                          "expected portforward or nodeport")
    autoscaler = raw.get("autoscaler")
    if autoscaler is not None and autoscaler not in AUTOSCALERS:
        raise ConfigError(path, "kubernetes.autoscaler", f"expected one of "
                          f"{', '.join(AUTOSCALERS)} (the kind of autoscaler that adds nodes)")
    timeout = raw.get("provision_timeout", AUTOSCALER_PROVISION_TIMEOUT_S if autoscaler
                      else PROVISION_TIMEOUT_S)
    if (not isinstance(timeout, int | float) or isinstance(timeout, bool)
            or not 0 <= timeout <= 86400):
        raise ConfigError(path, "kubernetes.provision_timeout",
                          "expected seconds between 0 and 86400")
    image = raw.get("image")
    if image is not None and (not isinstance(image, str) or not image.strip()):
        raise ConfigError(path, "kubernetes.image", "expected an image reference")
    policy = raw.get("image_pull_policy", "IfNotPresent")
    if policy not in ("Always", "IfNotPresent", "Never"):
        raise ConfigError(path, "kubernetes.image_pull_policy",
                          "expected Always, IfNotPresent or Never")
    storage = {key: _quantity(path, f"kubernetes.{key}", raw.get(key, default))
               for key, default in (("ephemeral_storage", DEFAULT_EPHEMERAL_STORAGE),
                                    ("ephemeral_storage_limit", ""))}
    try:
        fragment = parse_pod_config(raw.get("pod_config"), "kubernetes.pod_config")
    except PodConfigError as exc:
        raise ConfigError(path, "kubernetes.pod_config", str(exc)) from None
    return KubernetesConfig(
        autoscaler=autoscaler,
        pod_config=fragment,
        ephemeral_storage=storage["ephemeral_storage"],
        ephemeral_storage_limit=storage["ephemeral_storage_limit"],
        allowed_contexts=tuple(dict.fromkeys(contexts)),
        networking_mode=mode,
        provision_timeout_s=float(timeout),
        image=image,
        ssh_user=_user_name(path, "kubernetes.ssh_user", raw.get("ssh_user", "sky")),
        image_pull_policy=policy,
        pricing=_pricing(path, raw.get("pricing")),
    )


def _quantity(path: Path, key: str, value: Any) -> str:
    """A Kubernetes quantity of bytes ("20Gi"), or "" (none)."""
    if value in ("", None):
        return ""
    text = str(value).strip()
    try:
        if isinstance(value, bool) or parse_quantity(text) <= 0:
            raise ValueError(text)
    except ValueError:
        raise ConfigError(path, key, f"expected a size such as 20Gi, got {value!r}") from None
    return text


class ConfigFile:
    """The configuration, read again when the file changes (by mtime and size)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or config_path()
        self._seen: tuple[float, int] | None = None
        self._config = UserConfig(self.path)

    def get(self) -> UserConfig:
        """The current configuration; raises ConfigError if the file is not valid."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            self._seen, self._config = None, UserConfig(self.path)
            return self._config
        except OSError as exc:
            raise ConfigError(self.path, "(file)", f"cannot read: {exc.strerror}") from None
        seen = (stat.st_mtime, stat.st_size)
        if seen != self._seen:
            try:
                text = read_regular_file(str(self.path), MAX_CONFIG_BYTES).decode("utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(self.path, "(file)", f"cannot read: {exc}") from None
            self._config = parse(self.path, text)
            self._seen = seen
        return self._config
