"""Debian packages the Kubernetes bed takes without installing them: the `kubernetes` source
package, Go 1.19, etcd, containerd. An apt configuration of the bed's own (in the cache) adds
the deb-src index the machine's sources lack, with the same mirrors and keyrings; the machine's
/etc/apt is only read, never written. Standard library only.

Why not install containerd: Debian's package enables a system containerd.service and ships
/etc/containerd/config.toml; the bed runs its own containerd per node, from the cache, and
leaves the machine's services alone.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess

from _testbed.common import Failure, log, run, write_file
from _testbed.common.apt_sources import machine_sources

SOURCE_PACKAGE = "kubernetes"
BINARY_OF_SOURCE = "kubernetes-client"  # built from it: the machine's index knows its version
TOOL_PACKAGES = ("golang-1.19-go", "golang-1.19-src", "golang-github-modern-go-reflect2-dev")
RUNTIME_PACKAGES = ("etcd-server", "containerd")
APT_TIMEOUT_S = 600.0


def sources_text(stanzas: list[dict[str, str]]) -> str:
    """deb822 text: each stanza with both deb and deb-src."""
    out = []
    for s in stanzas:
        fields = {**s, "Types": "deb deb-src"}
        fields.pop("Enabled", None)
        out.append("".join(f"{k}: {v}\n" for k, v in fields.items()))
    return "# the clusterd Kubernetes test bed's own apt sources (from the machine's)\n" + \
        "\n".join(out)


class Apt:
    """apt-get and apt-cache with the bed's configuration, rooted at `root`."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.parts = os.path.join(root, "sources.list.d")

    def options(self) -> list[str]:
        return ["-o", "Dir::Etc::SourceList=/dev/null",
                "-o", f"Dir::Etc::SourceParts={self.parts}",
                "-o", f"Dir::State::Lists={os.path.join(self.root, 'lists')}",
                "-o", f"Dir::Cache={os.path.join(self.root, 'cache')}",
                "-o", "APT::Sandbox::User=root", "-q"]

    def update(self) -> None:
        for d in (self.parts, os.path.join(self.root, "lists", "partial"),
                  os.path.join(self.root, "cache", "archives", "partial")):
            os.makedirs(d, exist_ok=True)
        write_file(os.path.join(self.parts, "debian.sources"), sources_text(machine_sources()))
        log("  apt: updating the bed's own package index (deb and deb-src) ...")
        run(["apt-get", *self.options(), "update"], timeout=APT_TIMEOUT_S)

    def has_lists(self) -> bool:
        return bool(glob.glob(os.path.join(self.root, "lists", "*Sources*")))

    def source_version(self) -> str | None:
        p = run(["apt-cache", *self.options(), "showsrc", SOURCE_PACKAGE], check=False)
        versions = re.findall(r"^Version: (\S+)", p.stdout, re.M)
        return max(versions, key=_version_key) if versions else None

    def download_source(self, version: str, into: str) -> None:
        os.makedirs(into, exist_ok=True)
        p = subprocess.run(["apt-get", *self.options(), "source", "--download-only",
                            f"{SOURCE_PACKAGE}={version}"], cwd=into, capture_output=True,
                           text=True, timeout=APT_TIMEOUT_S, stdin=subprocess.DEVNULL)
        if p.returncode != 0:
            raise Failure(f"apt-get source {SOURCE_PACKAGE}={version} failed: "
                          f"{(p.stderr or p.stdout).strip()[-1500:]}")

    def download(self, packages: tuple[str, ...], into: str) -> dict[str, str]:
        """Download the packages' .deb files into `into`; {package: version}."""
        os.makedirs(into, exist_ok=True)
        p = subprocess.run(["apt-get", *self.options(), "download", *packages], cwd=into,
                           capture_output=True, text=True, timeout=APT_TIMEOUT_S,
                           stdin=subprocess.DEVNULL)
        if p.returncode != 0:
            raise Failure(f"apt-get download {' '.join(packages)} failed: "
                          f"{(p.stderr or p.stdout).strip()[-1500:]}")
        out = {}
        for package in packages:
            debs = glob.glob(os.path.join(into, f"{package}_*.deb"))
            if len(debs) != 1:
                raise Failure(f"apt-get download left {len(debs)} files for {package}")
            out[package] = os.path.basename(debs[0]).split("_")[1].replace("%3a", ":")
        return out


def machine_version() -> str | None:
    """The version of the `kubernetes` source as the machine's own index knows it (through
    the binary package built from it), with no network: what `up` keys its cache by."""
    p = run(["apt-cache", "show", "--no-all-versions", BINARY_OF_SOURCE], check=False)
    m = re.search(r"^Version: (\S+)", p.stdout, re.M)
    return m.group(1) if m else None


def _version_key(v: str) -> list[tuple[int, str]]:
    """Good enough for picking the newest of a few versions of one package."""
    return [(int(x), "") if x.isdigit() else (0, x) for x in re.split(r"[.+~-]", v)]


def extract(deb: str, into: str) -> None:
    os.makedirs(into, exist_ok=True)
    run(["dpkg-deb", "-x", deb, into], timeout=300)


def find_deb(d: str, package: str) -> str:
    debs = glob.glob(os.path.join(d, f"{package}_*.deb"))
    if len(debs) != 1:
        raise Failure(f"expected one {package} .deb in {d}, found {len(debs)}")
    return debs[0]
