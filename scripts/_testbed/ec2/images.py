"""The EC2 bed's machine images: real root filesystems that instances boot in.

A real EC2 instance runs the image it was launched from, not its host's system: Canonical's
Ubuntu 22.04 has Python 3.10 and no venv module, 24.04 has 3.12. The bed's images stand in
for those with Debian roots made by debootstrap from Debian's own archive:

  bullseye  python3 3.9, NO python3-venv: older than the daemon's Python and without the venv
            module, as Ubuntu 22.04 is; registered under 22.04's name, so clusterd's default
            lookup lands on what real EC2 gives it.
  trixie    python3 3.13 with venv: newer than the daemon's; registered under 24.04's name.

Each has what a stock cloud image has: openssh-server, sudo, the user `ubuntu` (uid 1000,
passwordless sudo), iproute2, ca-certificates, curl, tar, gzip, rsync, procps; no rclone, no
zstd. Besides them the bed keeps the host-like image (the machine's own root, as every node
ran before) and the GPU and Neuron stand-ins (the host-like root plus `nvidia-smi` or
`neuron-ls` reporting the instance type's accelerators: the bed has none, so these stand in
for the drivers, and clusterd's driver check is what they exercise).

A root is built once per machine and recipe (its key is the recipe's digest), into
/var/cache/clusterd-testbed/ec2-images/SUITE-KEY, built under a lock in a temporary directory
and renamed into place when complete; instances never write to it (node_init.py lays a
writable layer of the instance's own disk over it). `scripts/testbed ec2 build-images` builds
them ahead of a run (tests/conftest.py does, before the first test). Standard library only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time

from _testbed.common import (
    CACHE_ROOT,
    Failure,
    add_sudo_user,
    debian_mirror,
    debootstrap,
    lock_dir,
    log,
    strip_rootfs,
)
from _testbed.ec2.layout import NODE_USER

CACHE_ENV = "CLUSTERD_TESTBED_EC2_IMAGES"
RECIPE_VERSION = 1
NODE_UID = 1000  # Canonical's images' `ubuntu`
READY = ".clusterd-testbed-root"  # written last into a complete root
# What Ubuntu's server images have that a minbase debootstrap lacks, and clusterd uses.
STOCK_PACKAGES = ("openssh-server", "sudo", "iproute2", "ca-certificates", "curl", "tar",
                  "gzip", "rsync", "procps", "python3")


@dataclasses.dataclass(frozen=True)
class Root:
    """A Debian root an image boots in."""

    suite: str
    packages: tuple[str, ...]
    python: str  # its python3's X.Y, checked after the build

    def key(self, mirror: str) -> str:
        recipe = json.dumps([self.suite, mirror, self.packages, NODE_USER, NODE_UID,
                             RECIPE_VERSION])
        return hashlib.sha256(recipe.encode()).hexdigest()[:12]


ROOTS = {
    "bullseye": Root("bullseye", STOCK_PACKAGES, "3.9"),
    "trixie": Root("trixie", (*STOCK_PACKAGES, "python3-venv"), "3.13"),
}


def cache_dir() -> str:
    return os.path.abspath(os.environ.get(CACHE_ENV) or os.path.join(CACHE_ROOT, "ec2-images"))


def root_ready(path: str) -> bool:
    return os.path.isfile(os.path.join(path, READY))


def ensure_root(suite: str, cache: str | None = None) -> str:
    """The root of suite: found in the cache, or built now (a minute or two; one build at a
    time on the machine). Returns its path."""
    root = ROOTS[suite]
    cache = cache or cache_dir()
    mirror = debian_mirror()
    final = os.path.join(cache, f"{suite}-{root.key(mirror)}")
    if root_ready(final):
        return final
    os.makedirs(cache, mode=0o755, exist_ok=True)
    lock = lock_dir(cache)
    try:
        if root_ready(final):  # built by whoever held the lock
            return final
        part = final + ".build"
        shutil.rmtree(part, ignore_errors=True)  # an interrupted build's
        start = time.monotonic()
        log(f"building the EC2 bed's {suite} root (debootstrap from {mirror}; once) ...")
        debootstrap(suite, part, root.packages, mirror)
        customise(part, root)
        if os.path.exists(final):  # a stale, incomplete one: renamed only when complete
            shutil.rmtree(final)
        os.rename(part, final)
        for other in os.listdir(cache):  # the recipe changed: older roots serve no bed
            if other.startswith(f"{suite}-") and os.path.join(cache, other) != final:
                shutil.rmtree(os.path.join(cache, other), ignore_errors=True)
        log(f"EC2 bed root {suite} built in {time.monotonic() - start:.0f}s: {final}")
        return final
    finally:
        os.close(lock)


def customise(rootfs: str, root: Root) -> None:
    """The login user, no host keys or apt lists; checks the python it got."""
    add_sudo_user(rootfs, NODE_USER, NODE_UID, "90-cloud-init-users")
    strip_rootfs(rootfs)
    found = [n[len("python"):] for n in os.listdir(os.path.join(rootfs, "usr", "bin"))
             if n.startswith("python3.") and n[len("python"):].replace(".", "").isdigit()]
    if root.python not in found:
        raise Failure(f"the {root.suite} root has python {', '.join(found) or 'none'}, "
                      f"not {root.python} as the bed's images promise")
    with open(os.path.join(rootfs, READY), "w") as f:
        f.write(json.dumps({"suite": root.suite, "python": root.python,
                            "built": time.time()}) + "\n")


def ensure_all(cache: str | None = None) -> dict[str, str]:
    """Every root: {suite: path}."""
    return {suite: ensure_root(suite, cache) for suite in ROOTS}


def login_ids(rootfs: str | None) -> tuple[int, int] | None:
    """(uid, gid) of the login user in rootfs's /etc/passwd (None: the host's is used)."""
    if rootfs is None:
        return None
    with open(os.path.join(rootfs, "etc", "passwd")) as f:
        for line in f:
            fields = line.split(":")
            if fields[0] == NODE_USER:
                return int(fields[2]), int(fields[3])
    raise Failure(f"the image root {rootfs} has no user {NODE_USER}")
