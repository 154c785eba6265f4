"""The EC2 catalog: instance types, their accelerators and prices per zone.

Kept in SkyPilot's own CSV format (`InstanceType, AcceleratorName, AcceleratorCount, vCPUs,
MemoryGiB, GpuInfo, Price, SpotPrice, Region, AvailabilityZone`, zones as zone IDs), so a user
can point clusterd at SkyPilot's full catalog (`catalog_dir` in the config file, or
CLUSTERD_CATALOG_DIR: DIR/aws/vms.csv). A snapshot of it ships with clusterd.

Requests mean what they mean to SkyPilot: `cpus: 4` is exactly 4 vCPUs and `4+` at least 4,
likewise memory in GiB; `accelerators: A100:8` is an instance with exactly 8 A100s; with
nothing asked, an 8+ vCPU general-purpose instance with 4 GiB per vCPU.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import io
import math
from collections.abc import Iterable
from importlib import resources as package_resources
from pathlib import Path

from clusterd.tasks.spec import Resources

FIELDS = ("InstanceType", "AcceleratorName", "AcceleratorCount", "vCPUs", "MemoryGiB",
          "GpuInfo", "Price", "SpotPrice", "Region", "AvailabilityZone")
# Asked for nothing: SkyPilot's default, an 8+ vCPU general-purpose instance, 4 GiB per vCPU.
DEFAULT_VCPUS = 8.0
DEFAULT_MEMORY_PER_VCPU = 4.0
DEFAULT_FAMILIES = ("m6i", "m5")
# Asked only for CPUs or memory: these families, cheapest first (burstable and
# accelerator families only when named).
CPU_FAMILIES = ("m6i", "c6i", "r6i", "m7i", "c7i", "r7i", "m5", "c5", "r5")
# Where prices tie, regions in this order (then the rest by name): the oldest and largest first.
REGION_ORDER = ("us-east-1", "us-east-2", "us-west-2", "us-west-1", "ca-central-1", "eu-west-1",
                "eu-central-1", "eu-west-2", "eu-west-3", "eu-north-1", "ap-northeast-1",
                "ap-southeast-1", "ap-southeast-2", "ap-northeast-2", "ap-south-1", "sa-east-1")


class CatalogMiss(Exception):
    """Nothing in the catalog meets the request; the message says what was asked and what
    comes nearest."""


@dataclasses.dataclass(frozen=True)
class InstanceSpec:
    instance_type: str
    vcpus: float
    memory_gb: float
    accelerator: str | None
    accelerator_count: float

    @property
    def family(self) -> str:
        return self.instance_type.split(".", 1)[0]

    def describe(self) -> str:
        text = f"{self.instance_type} ({self.vcpus:g} vCPU, {self.memory_gb:g} GiB"
        if self.accelerator:
            text += f", {self.accelerator}:{self.accelerator_count:g}"
        return text + ")"


@dataclasses.dataclass(frozen=True)
class Offer:
    """One instance type in one zone, with its prices per hour (None: not offered so)."""

    spec: InstanceSpec
    region: str
    zone_id: str
    price: float | None
    spot_price: float | None

    def price_for(self, spot: bool) -> float | None:
        return self.spot_price if spot else self.price


@dataclasses.dataclass(frozen=True)
class Choice:
    """The instance type chosen for a request, and every zone offering it, cheapest first."""

    spec: InstanceSpec
    spot: bool
    offers: tuple[Offer, ...]


def _float(text: str) -> float | None:
    text = text.strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


class Catalog:
    def __init__(self, offers: Iterable[Offer]) -> None:
        self.offers: dict[str, list[Offer]] = {}
        self.specs: dict[str, InstanceSpec] = {}
        for offer in offers:
            self.specs.setdefault(offer.spec.instance_type, offer.spec)
            self.offers.setdefault(offer.spec.instance_type, []).append(offer)

    @classmethod
    def parse(cls, text: str, source: str = "vms.csv") -> Catalog:
        reader = csv.DictReader(io.StringIO(text))
        missing = set(FIELDS) - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{source}: not a SkyPilot AWS catalog (no {sorted(missing)[0]})")
        specs: dict[str, InstanceSpec] = {}
        offers = []
        for row in reader:
            vcpus, memory = _float(row["vCPUs"]), _float(row["MemoryGiB"])
            name = (row["InstanceType"] or "").strip()
            if not name or vcpus is None or memory is None:
                continue
            spec = specs.get(name)
            if spec is None:
                accelerator = (row["AcceleratorName"] or "").strip() or None
                spec = InstanceSpec(name, vcpus, memory, accelerator,
                                    _float(row["AcceleratorCount"]) or 0.0)
                specs[name] = spec
            price, spot = _float(row["Price"]), _float(row["SpotPrice"])
            if price is None and spot is None:
                continue
            offers.append(Offer(spec, row["Region"].strip(), row["AvailabilityZone"].strip(),
                                price, spot))
        return cls(offers)

    def regions(self) -> set[str]:
        return {o.region for offers in self.offers.values() for o in offers}

    def accelerator_names(self) -> list[str]:
        return sorted({s.accelerator for s in self.specs.values() if s.accelerator},
                      key=str.lower)

    # -- choosing -------------------------------------------------------------------------

    def choose(self, want: Resources, regions: frozenset[str] | None = None) -> Choice:
        """The cheapest instance type meeting `want` and its offers in the allowed regions
        (the task's region, and `regions` when given); raises CatalogMiss."""
        candidates = self._candidates(want)
        if not candidates:
            raise CatalogMiss(self._nearest(want))
        allowed = regions
        if want.infra.region:
            allowed = frozenset({want.infra.region}) & (allowed or {want.infra.region})
        best: tuple[tuple[float, int, float, str], Choice] | None = None
        for spec in candidates:
            offers = [o for o in self.offers.get(spec.instance_type, [])
                      if (allowed is None or o.region in allowed)
                      and o.price_for(want.use_spot) is not None]
            if not offers:
                continue
            offers.sort(key=lambda o: (o.price_for(want.use_spot), region_rank(o.region),
                                       o.zone_id))
            cheapest = offers[0].price_for(want.use_spot) or 0.0
            rank = (cheapest, _family_rank(spec.family), spec.vcpus, spec.instance_type)
            if best is None or rank < best[0]:
                best = (rank, Choice(spec, want.use_spot, tuple(offers)))
        if best is None:
            where = ", ".join(sorted(allowed or ())) or "any region"
            market = "as spot" if want.use_spot else "on demand"
            offered = sorted({o.region for s in candidates for o in self.offers.get(
                s.instance_type, []) if o.price_for(want.use_spot) is not None})
            raise CatalogMiss(
                f"{_asked(want)}: {', '.join(s.instance_type for s in candidates[:3])} "
                f"{'is' if len(candidates) == 1 else 'are'} not offered {market} in {where}"
                + (f" (offered in: {', '.join(offered)})" if offered else ""))
        return best[1]

    def _candidates(self, want: Resources) -> list[InstanceSpec]:
        specs = list(self.specs.values())
        nothing_asked = not (want.instance_type or want.accelerator or want.cpus
                             or want.memory_gb)
        if want.instance_type:
            specs = [s for s in specs if s.instance_type == want.instance_type]
        elif want.accelerator:
            specs = [s for s in specs
                     if (s.accelerator or "").lower() == want.accelerator.lower()
                     and s.accelerator_count == want.accelerator_count]
        else:
            families = DEFAULT_FAMILIES if nothing_asked else CPU_FAMILIES
            specs = [s for s in specs if not s.accelerator and s.family in families]
        if want.accelerator and want.instance_type:
            specs = [s for s in specs if (s.accelerator or "").lower() == want.accelerator.lower()
                     and s.accelerator_count == want.accelerator_count]
        if nothing_asked:
            return [s for s in specs if s.vcpus >= DEFAULT_VCPUS
                    and s.memory_gb >= s.vcpus * DEFAULT_MEMORY_PER_VCPU]
        return [s for s in specs if _fits(s.vcpus, want.cpus, want.cpus_at_least)
                and _fits(s.memory_gb, want.memory_gb, want.memory_at_least)]

    def _nearest(self, want: Resources) -> str:
        asked = _asked(want)
        if want.instance_type and want.instance_type not in self.specs:
            family = want.instance_type.split(".", 1)[0]
            same = sorted((s for s in self.specs.values() if s.family == family),
                          key=lambda s: s.vcpus)
            near = ", ".join(s.instance_type for s in same[:6])
            return (f"{asked}: no instance type {want.instance_type} in the catalog"
                    + (f"; nearest: {near}" if near else ""))
        if want.accelerator:
            same = [s for s in self.specs.values()
                    if (s.accelerator or "").lower() == want.accelerator.lower()]
            if not same:
                return (f"{asked}: no instance type has {want.accelerator}; accelerators in "
                        f"the catalog: {', '.join(self.accelerator_names())}")
            same.sort(key=lambda s: (abs(s.accelerator_count - want.accelerator_count),
                                     self.cheapest(s.instance_type)))
            near = "; ".join(f"{s.accelerator}:{s.accelerator_count:g} on "
                             f"{s.describe()}{_price_text(self.cheapest(s.instance_type))}"
                             for s in same[:3])
            return f"{asked}: nothing fits; nearest: {near}"
        pool = [s for s in self.specs.values() if not s.accelerator and s.family in CPU_FAMILIES]
        if want.instance_type:
            pool = [self.specs[want.instance_type]]

        def distance(s: InstanceSpec) -> float:
            d = 0.0
            if want.cpus:
                d += abs(math.log(s.vcpus / want.cpus))
            if want.memory_gb:
                d += abs(math.log(s.memory_gb / want.memory_gb))
            return d

        pool.sort(key=lambda s: (distance(s), self.cheapest(s.instance_type)))
        near = "; ".join(f"{s.describe()}{_price_text(self.cheapest(s.instance_type))}"
                         for s in pool[:3])
        return f"{asked}: no instance type fits; nearest: {near}"

    def cheapest(self, instance_type: str, spot: bool = False) -> float:
        prices = [p for o in self.offers.get(instance_type, [])
                  if (p := o.price_for(spot)) is not None]
        return min(prices) if prices else math.inf

    # -- show-gpus ------------------------------------------------------------------------

    def accelerator_rows(self, name: str | None = None) -> list[dict[str, object]]:
        """One row per instance type with an accelerator (of `name`, if given): its count,
        size, cheapest on-demand and spot price per hour, and its regions."""
        rows = []
        for spec in self.specs.values():
            if not spec.accelerator:
                continue
            if name and spec.accelerator.lower() != name.lower():
                continue
            offers = self.offers.get(spec.instance_type, [])
            on_demand = [o for o in offers if o.price is not None]
            spot = [o for o in offers if o.spot_price is not None]
            best = min(on_demand, key=lambda o: o.price or 0.0, default=None)
            best_spot = min(spot, key=lambda o: o.spot_price or 0.0, default=None)
            rows.append({
                "accelerator": spec.accelerator,
                "count": spec.accelerator_count,
                "instance_type": spec.instance_type,
                "vcpus": spec.vcpus,
                "memory_gb": spec.memory_gb,
                "price": best.price if best else None,
                "price_region": best.region if best else None,
                "spot_price": best_spot.spot_price if best_spot else None,
                "spot_region": best_spot.region if best_spot else None,
                "regions": sorted({o.region for o in offers}),
            })
        rows.sort(key=lambda r: (str(r["accelerator"]).lower(), r["count"],
                                 r["price"] if r["price"] is not None else math.inf))
        return rows


def region_rank(region: str) -> tuple[int, str]:
    return (REGION_ORDER.index(region) if region in REGION_ORDER else len(REGION_ORDER), region)


def _fits(have: float, want: float | None, at_least: bool) -> bool:
    if want is None:
        return True
    return have >= want if at_least else math.isclose(have, want)


def _family_rank(family: str) -> int:
    order = DEFAULT_FAMILIES + CPU_FAMILIES
    return order.index(family) if family in order else len(order)


def _price_text(price: float) -> str:
    return f", ${price:.3f}/h" if math.isfinite(price) else ""


def _asked(want: Resources) -> str:
    parts = []
    if want.instance_type:
        parts.append(f"instance_type={want.instance_type}")
    if want.accelerator:
        parts.append(f"accelerators={want.accelerator}:{want.accelerator_count:g}")
    if want.cpus:
        parts.append(f"cpus={want.cpus:g}{'+' if want.cpus_at_least else ''}")
    if want.memory_gb:
        parts.append(f"memory={want.memory_gb:g}{'+' if want.memory_at_least else ''}")
    if want.use_spot:
        parts.append("use_spot")
    if want.infra.region:
        parts.append(f"region={want.infra.region}")
    return "asked for " + (", ".join(parts) if parts else "the default instance")


def catalog_path(catalog_dir: Path | None) -> Path | None:
    """The user's catalog file, if one is configured (Settings.catalog_dir, else the
    config's catalog_dir): DIR/aws/vms.csv as in SkyPilot's catalog layout."""
    directory = catalog_dir
    if not directory:
        return None
    base = Path(directory).expanduser()
    return base / "aws" / "vms.csv" if (base / "aws").is_dir() else base / "vms.csv"


@functools.lru_cache(maxsize=4)
def _load(path: str | None, mtime: float) -> Catalog:
    if path is None:
        text = package_resources.files(__package__).joinpath("data/vms.csv").read_text()
        return Catalog.parse(text, "clusterd's catalog")
    return Catalog.parse(Path(path).read_text(encoding="utf-8"), path)


def load_catalog(catalog_dir: Path | None = None) -> Catalog:
    """The catalog in use (parsed once per file version)."""
    path = catalog_path(catalog_dir)
    if path is None:
        return _load(None, 0.0)
    try:
        mtime = path.stat().st_mtime
    except OSError as exc:
        raise FileNotFoundError(f"the AWS catalog {path} cannot be read: {exc.strerror}") from None
    return _load(str(path), mtime)
