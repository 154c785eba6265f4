"""The runtime image (`scripts/testbed k8s up --runtime-image`): what users of a real cluster bake
into an image of their own. It is the node image plus one layer: clusterd's runtime for
wheelhouse KEY in /home/sky/.clusterd exactly as clusterd's install_runtime leaves it on a
node (.clusterd/venvs/KEY with its ready marker, and the .clusterd/current link), so clusterd
finds it there and skips the install.

The wheelhouse is the one `up` prepares (common.prepare_wheelhouse, into the directory `exec`
gives daemons as CLUSTERD_WHEELHOUSE_DIR, so their key is the image's). The image is
built once per (node image, wheelhouse) into CACHE/images: the node image's files unpacked,
the install run in them with their own python (in a chroot, in throwaway mount, PID and
network namespaces: offline), every wheel checked against the digests clusterd recorded.
Standard library only.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import time

from _testbed.common import WHEELHOUSE_SUMS, Failure, log, run
from _testbed.k8s.images import oci_archive, read_archive
from _testbed.k8s.layout import IMAGE_REPO, NODE_USER

INSTALL_TIMEOUT_S = 900.0
KEEP = 2  # runtime images kept in the cache (the newest)
READY_MARKER = ".clusterd-ready"  # what clusterd's install_runtime looks for in a venv
HASHED_REQUIREMENTS = "requirements-hashed.txt"  # every wheel pinned to its digest
NODE_HOME = f"/home/{NODE_USER}"

# Run in the image's files (chroot), as root, then the result given to the node's user. The
# steps are install_runtime's; $1 is KEY.
INSTALL = f"""set -eu
key=$1
cd /mnt && sha256sum --check --strict --quiet {WHEELHOUSE_SUMS}
cd {NODE_HOME}
venv=.clusterd/venvs/$key
export PIP_CONFIG_FILE=/dev/null PIP_NO_CACHE_DIR=1 HOME={NODE_HOME}
python3 -m venv --clear "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-index --no-deps \\
    --require-hashes --find-links /mnt -r /mnt/{HASHED_REQUIREMENTS}
touch "$venv/{READY_MARKER}"
ln -sfn "venvs/$key" .clusterd/current
chown -R {NODE_USER}:{NODE_USER} .clusterd
"""


def image_name(node_image: str, key: str) -> str:
    return f"{IMAGE_REPO}/node-runtime:{node_image.rsplit(':', 1)[1]}-{key}"


def ensure_runtime_image(images_dir: str, node_image: str, node_archive: str,
                         house: str) -> tuple[str, str]:
    """The runtime image of the node image and the wheelhouse at house: found, or built
    (about as long as installing the runtime on one node). (name, archive path)."""
    key = os.path.basename(os.path.normpath(house))
    name = image_name(node_image, key)
    archive = os.path.join(images_dir, f"node-runtime-{name.rsplit(':', 1)[1]}.tar")
    if os.path.isfile(archive):
        return name, archive
    work = archive.removesuffix(".tar") + ".build"
    shutil.rmtree(work, ignore_errors=True)
    rootfs = os.path.join(work, "rootfs")
    os.makedirs(rootfs)
    start = time.monotonic()
    log(f"building the runtime image {name} (once per node image and wheelhouse) ...")
    layers, config = read_archive(node_archive, work)
    for layer in layers:
        run(["tar", "--numeric-owner", "--xattrs", "-C", rootfs, "-xf", layer], timeout=600)
    os.makedirs(os.path.join(rootfs, "mnt"), exist_ok=True)
    p = subprocess.run(
        ["unshare", "--mount", "--pid", "--net", "--fork", "--kill-child=SIGKILL", "--",
         "sh", "-c", 'mount --make-rprivate / && mount --bind -o ro "$1" "$2/mnt" && '
                     'mount --rbind /dev "$2/dev" && mount -t proc proc "$2/proc" && '
                     'exec chroot "$2" sh -c "$3" sh "$4"',
         "sh", house, rootfs, INSTALL, key],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S,
        env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
             "LANG": "C.UTF-8"})
    if p.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        raise Failure(f"installing the runtime into the image failed (exit {p.returncode}): "
                      f"{(p.stderr or p.stdout).strip()[-2000:]}")
    layer = os.path.join(work, "runtime-layer.tar")
    run(["tar", "--numeric-owner", "--xattrs", "-C", rootfs, "-cf", layer,
         f".{NODE_HOME}/.clusterd"], timeout=600)
    labels = dict(config.get("config", {}).get("Labels") or {})
    labels["org.clusterd.testbed.runtime"] = key
    oci_archive(archive, name, [*layers, layer], {**config.get("config", {}),
                                                   "Labels": labels})
    shutil.rmtree(work, ignore_errors=True)
    prune(images_dir, keep=os.path.basename(archive))
    log(f"runtime image {name} built in {time.monotonic() - start:.0f}s "
        f"({os.path.getsize(archive) >> 20} MB)")
    return name, archive


def prune(images_dir: str, keep: str) -> None:
    """Keep the KEEP newest runtime images (`keep` among them)."""
    found = sorted(glob.glob(os.path.join(images_dir, "node-runtime-*.tar")),
                   key=os.path.getmtime, reverse=True)
    for path in found[KEEP:]:
        if os.path.basename(path) != keep:
            os.unlink(path)
