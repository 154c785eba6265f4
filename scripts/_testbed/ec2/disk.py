"""An instance's disk: an ext4 filesystem of its own, in one sparse image file
(DIR/instances/ID/disk.ext4), as an EC2 instance has an EBS root volume of its own. It holds
`home/` (the node's /home/ubuntu) and `tmp/` (its /tmp, emptied at each boot). The node's init
mounts it through a loop device in the node's own mount namespace (node_init.py), so no host
mount outlives the node: when the node dies, the kernel unmounts it and frees the loop device.

Why not a directory on the host's filesystem, as before: there, every file a node made cost
the machine's filesystem its own price. On the machines this project runs on (a VM whose root is
ext4), creating a file cost 0.35-0.55 ms of CPU (4,000 empty files: 1.4-2.3 CPU-s), against
0.03 ms on an ext4 of its own on the same machine (0.12 CPU-s); unpacking the runtime (4,400
files) took 1.6-2.9 CPU-s there against 0.26 here. A real instance's disk is its own, and pays
its own filesystem's price, not its host's.

The image is made on an instance's first boot with mke2fs's `-d` (the skeleton and the key
pair's public key) and, for a runtime image, the template's files copied in through a loop
mount of the image in a throwaway mount namespace; it is renamed into place only when
complete. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time

from _testbed.common import Failure, chown_tree, write_file

SIZE = "8G"  # sparse: the host keeps only what is written; EC2's usual root volume size
# Inode tables and the journal are left to read as zeros (a sparse file's do): nothing to
# write at mkfs time, and `noinit_itable` keeps the kernel from zeroing them at mount.
MKFS_OPTIONS = "lazy_itable_init=1,lazy_journal_init=1,nodiscard"
MOUNT_OPTIONS = "loop,noinit_itable"
MKFS = "mkfs.ext4"
RELEASE_WAIT_S = 30.0
FILL_TIMEOUT_S = 300.0


def _run(argv: list[str], what: str, env: dict[str, str] | None = None) -> None:
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=FILL_TIMEOUT_S, env=env)
    if p.returncode != 0:
        raise Failure(f"{what} failed (exit {p.returncode}): "
                      f"{(p.stderr or p.stdout).strip()[-500:]}")


def make(disk: str, *, skeleton: str | None, authorized_key: str | None, uid: int, gid: int,
         template: str | None = None) -> None:
    """A new disk at `disk`: home/ owned by uid:gid with the skeleton's files and the key in
    .ssh/authorized_keys, an empty tmp/, and for a runtime image, template's files in home/."""
    seed, part = disk + ".seed", disk + ".new"
    shutil.rmtree(seed, ignore_errors=True)
    try:
        home = os.path.join(seed, "home")
        os.makedirs(os.path.join(home, ".ssh"), mode=0o700)
        os.chmod(home, 0o755)
        if skeleton is not None and os.path.isdir(skeleton):
            for name in os.listdir(skeleton):
                src = os.path.join(skeleton, name)
                if os.path.isfile(src) and not os.path.islink(src):
                    shutil.copy2(src, os.path.join(home, name))
        if authorized_key is not None:
            write_file(os.path.join(home, ".ssh", "authorized_keys"),
                       authorized_key.strip() + "\n", 0o600)
        chown_tree(home, uid, gid)
        os.makedirs(os.path.join(seed, "tmp"))
        os.chmod(os.path.join(seed, "tmp"), 0o1777)
        _run([MKFS, "-q", "-F", "-d", seed, "-E", MKFS_OPTIONS, part, SIZE], "mkfs.ext4")
        if template is not None:
            _fill_home(part, template)
        os.rename(part, disk)
    finally:
        shutil.rmtree(seed, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(part)


# Mounted in a mount namespace of its own: nothing shows on the host, and if this dies the
# kernel unmounts it. Unmounted before exit so that the copy is on the image when it returns.
_FILL = 'mount -o "$MOUNT_OPTIONS" "$1" "$2" && cp -a "$3/." "$2/home/"; r=$?; umount "$2"; exit $r'


def _fill_home(image: str, template: str) -> None:
    mountpoint = image + ".mnt"
    os.makedirs(mountpoint, exist_ok=True)
    try:
        _run(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", _FILL, "sh",
              image, mountpoint, template],
             f"copying the runtime image {template} onto a new disk",
             env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "MOUNT_OPTIONS": MOUNT_OPTIONS})
    finally:
        os.rmdir(mountpoint)


def attached(disk: str) -> bool:
    """Whether a loop device still holds the image (a node of a boot before is still going)."""
    p = subprocess.run(["losetup", "--noheadings", "--associated", disk],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    return p.returncode == 0 and bool(p.stdout.strip())


def wait_released(disk: str, timeout: float = RELEASE_WAIT_S) -> None:
    """Until no loop device holds the image: the kernel unmounts a dead node's filesystem in
    its own time, and two mounts of one ext4 image would corrupt it."""
    deadline = time.monotonic() + timeout
    while attached(disk):
        if time.monotonic() > deadline:
            raise Failure(f"{disk} is still attached to a loop device after {timeout:.0f}s "
                          "(a node of an earlier boot still has it mounted)",
                          hint=f"losetup --associated {disk}")
        time.sleep(0.02)


def check_host() -> None:
    """That this machine can give instances disks: mkfs.ext4 and a loop device."""
    if shutil.which(MKFS, path="/usr/sbin:/usr/bin:/sbin:/bin") is None:
        raise Failure("mkfs.ext4 is missing: the EC2 test bed makes each instance's disk with it",
                      hint="apt-get install e2fsprogs")
    if not os.path.exists("/dev/loop-control"):
        raise Failure("this machine has no loop devices (/dev/loop-control): the EC2 test bed "
                      "mounts each instance's disk image through one",
                      hint="modprobe loop, or run the bed where /dev/loop-control exists")

