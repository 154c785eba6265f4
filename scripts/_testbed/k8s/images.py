"""Container images without a registry: an OCI image archive (one layer, config, manifest; no
daemon needed) that `ctr images import` takes, and the node image pods run.

The node image is Debian bookworm made by debootstrap with what clusterd's runtime needs on a
node (python3 3.11 like the host's, python3-venv, openssh-server, rsync, sudo, socat, procps,
iproute2), a user `sky` (uid 1000, passwordless sudo) and an entrypoint that authorises the
public keys it is given and runs sshd (ENTRYPOINT below says how). It is built once per recipe
(its key is the recipe's digest) into CACHE/images. Standard library only.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
import time
from typing import Any

from _testbed.common import debian_mirror, debootstrap, log, run
from _testbed.k8s.layout import NODE_USER, node_image

SUITE = "bookworm"
NODE_PACKAGES = ("python3", "python3-venv", "openssh-server", "rsync", "sudo", "socat",
                 "procps", "iproute2", "ca-certificates", "less")

# The node image's entrypoint (/usr/local/bin/clusterd-node-entrypoint, the image's only
# command). Kept short on purpose: the provider's contract with the image is this text.
ENTRYPOINT = f"""#!/bin/sh
# clusterd test bed node image: authorise the SSH public keys given, then run sshd (PID 1).
#   $CLUSTERD_SSH_PUBLIC_KEY  OpenSSH public key line(s), and/or
#   /etc/clusterd/ssh/*       files of a mounted Secret (or ConfigMap), each of key lines,
# for the user {NODE_USER} (uid 1000, passwordless sudo). sshd listens on $CLUSTERD_SSH_PORT
# (default 22), keys only. Host keys are made at each start; the ed25519 one is printed to
# the container's log ("clusterd-node: host key ...") for clients to pin.
set -eu
home=/home/{NODE_USER}
keys=$home/.ssh/authorized_keys
mkdir -p "$home/.ssh" /run/sshd
: > "$keys.new"
if [ -n "${{CLUSTERD_SSH_PUBLIC_KEY:-}}" ]; then
  printf '%s\\n' "$CLUSTERD_SSH_PUBLIC_KEY" >> "$keys.new"
fi
for f in /etc/clusterd/ssh/*; do
  if [ -f "$f" ]; then cat "$f" >> "$keys.new"; echo >> "$keys.new"; fi
done
grep -v '^[[:space:]]*$' "$keys.new" > "$keys" || true
rm -f "$keys.new"
chown -R {NODE_USER}:{NODE_USER} "$home/.ssh"
chmod 700 "$home/.ssh"
chmod 600 "$keys"
[ -s "$keys" ] || echo "clusterd-node: warning: no public key given; nobody can log in" >&2
ssh-keygen -A >/dev/null
echo "clusterd-node: host key $(cat /etc/ssh/ssh_host_ed25519_key.pub)"
echo "clusterd-node: $(wc -l < "$keys") authorised key(s) for {NODE_USER}; starting sshd"
exec /usr/sbin/sshd -D -e -p "${{CLUSTERD_SSH_PORT:-22}}"
"""

SSHD_CONFIG = f"""# clusterd test bed node image: key logins of {NODE_USER} only, forwarding on
# (clusterd reaches its agent through a stream-local forward).
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin no
AllowUsers {NODE_USER}
UsePAM no
AllowTcpForwarding yes
AllowStreamLocalForwarding yes
X11Forwarding no
PrintMotd no
UseDNS no
MaxSessions 64
MaxStartups 100:30:200
ClientAliveInterval 30
"""

SUDOERS = f"{NODE_USER} ALL=(ALL:ALL) NOPASSWD: ALL\n"


def recipe_key(mirror: str) -> str:
    """The node image's key: a digest of everything that goes into it."""
    recipe = json.dumps([SUITE, mirror, NODE_PACKAGES, ENTRYPOINT, SSHD_CONFIG, SUDOERS, 2])
    return hashlib.sha256(recipe.encode()).hexdigest()[:12]


def _digest(path: str) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    return "sha256:" + h.hexdigest(), size


def oci_archive(path: str, name: str, layers: list[str], config: dict[str, Any]) -> None:
    """Write an OCI image layout archive at path: the uncompressed layer tarballs `layers`
    (bottom first), an image config with `config` as its "config", named `name` (the
    annotation ctr import names it by)."""
    digests = [_digest(layer) for layer in layers]
    image_config = {"architecture": "amd64", "os": "linux", "config": config,
                    "rootfs": {"type": "layers", "diff_ids": [d for d, _ in digests]},
                    "history": [{"created_by": "clusterd test bed"} for _ in layers]}
    config_blob = json.dumps(image_config, sort_keys=True).encode()
    config_digest = "sha256:" + hashlib.sha256(config_blob).hexdigest()
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                           "digest": config_digest, "size": len(config_blob)},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                            "digest": d, "size": size} for d, size in digests]}
    manifest_blob = json.dumps(manifest, sort_keys=True).encode()
    manifest_digest = "sha256:" + hashlib.sha256(manifest_blob).hexdigest()
    index = {"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_digest,
        "size": len(manifest_blob), "platform": {"architecture": "amd64", "os": "linux"},
        "annotations": {"io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}}]}
    tmp = path + ".tmp"
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as t:
        def add(arcname: str, data: bytes) -> None:
            info = tarfile.TarInfo(arcname)
            info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
            t.addfile(info, io.BytesIO(data))

        add("oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
        add("index.json", json.dumps(index).encode())
        add(f"blobs/sha256/{config_digest[7:]}", config_blob)
        add(f"blobs/sha256/{manifest_digest[7:]}", manifest_blob)
        for layer, (digest, _) in zip(layers, digests, strict=True):
            t.add(layer, f"blobs/sha256/{digest[7:]}")
    os.replace(tmp, path)


def read_archive(path: str, into: str) -> tuple[list[str], dict[str, Any]]:
    """The layer tarballs (extracted into `into`, bottom first) and the image config of an
    archive oci_archive wrote."""
    with tarfile.open(path) as t:
        index = json.load(t.extractfile("index.json"))  # type: ignore[arg-type]
        blob = "blobs/sha256/{}".format
        manifest = json.load(t.extractfile(  # type: ignore[arg-type]
            blob(index["manifests"][0]["digest"][7:])))
        config = json.load(t.extractfile(  # type: ignore[arg-type]
            blob(manifest["config"]["digest"][7:])))
        layers = []
        for i, layer in enumerate(manifest["layers"]):
            out = os.path.join(into, f"layer{i}.tar")
            src = t.extractfile(blob(layer["digest"][7:]))
            assert src is not None
            with open(out, "wb") as f:
                shutil.copyfileobj(src, f, 1 << 20)
            layers.append(out)
    return layers, config


def ensure_node_image(images_dir: str) -> tuple[str, str]:
    """The node image archive: found, or built now (about a minute). (name, archive path)."""
    mirror = debian_mirror()
    key = recipe_key(mirror)
    name = node_image(key)
    archive = os.path.join(images_dir, f"node-{key}.tar")
    if os.path.isfile(archive):
        return name, archive
    os.makedirs(images_dir, mode=0o755, exist_ok=True)
    work = os.path.join(images_dir, f"node-{key}.build")
    shutil.rmtree(work, ignore_errors=True)
    rootfs = os.path.join(work, "rootfs")
    os.makedirs(work)
    start = time.monotonic()
    log(f"building the node image {name} (debootstrap {SUITE} from {mirror}; once) ...")
    debootstrap(SUITE, rootfs, NODE_PACKAGES, mirror)
    customise(rootfs)
    layer = os.path.join(work, "layer.tar")
    run(["tar", "--numeric-owner", "--xattrs", "-C", rootfs, "--exclude=./dev/*",
         "--exclude=./proc/*", "--exclude=./sys/*", "-cf", layer, "."], timeout=600)
    oci_archive(archive, name, [layer], {
        "Entrypoint": ["/usr/local/bin/clusterd-node-entrypoint"],
        "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "LANG=C.UTF-8"],
        "ExposedPorts": {"22/tcp": {}}, "WorkingDir": "/",
        "Labels": {"org.clusterd.testbed.user": NODE_USER}})
    shutil.rmtree(work, ignore_errors=True)
    for other in os.listdir(images_dir):  # the recipe changed: older images serve no bed
        if other.startswith("node-") and other.endswith(".tar") and \
                other != os.path.basename(archive):
            os.unlink(os.path.join(images_dir, other))
    log(f"node image {name} built in {time.monotonic() - start:.0f}s "
        f"({os.path.getsize(archive) >> 20} MB): {archive}")
    return name, archive


def customise(rootfs: str) -> None:
    """The user, sudo, sshd's settings and the entrypoint; no host keys, no apt lists."""
    def chroot(*cmd: str) -> None:
        run(["chroot", rootfs, *cmd], timeout=120)

    chroot("useradd", "-m", "-s", "/bin/bash", "-u", "1000", "-U", "-c", "clusterd node",
           NODE_USER)
    chroot("usermod", "-p", "*", NODE_USER)  # not locked: sshd (without PAM) refuses "!"

    def put(rel: str, text: str, mode: int) -> None:
        path = os.path.join(rootfs, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, mode)

    put("etc/sudoers.d/clusterd-node", SUDOERS, 0o440)
    put("etc/ssh/sshd_config.d/clusterd-node.conf", SSHD_CONFIG, 0o644)
    put("usr/local/bin/clusterd-node-entrypoint", ENTRYPOINT, 0o755)
    os.makedirs(os.path.join(rootfs, "etc/clusterd/ssh"), exist_ok=True)
    for name in os.listdir(os.path.join(rootfs, "etc/ssh")):
        if name.startswith("ssh_host_"):
            os.unlink(os.path.join(rootfs, "etc/ssh", name))
    for rel in ("var/lib/apt/lists", "var/cache/apt/archives"):
        d = os.path.join(rootfs, rel)
        for name in os.listdir(d):
            p = os.path.join(d, name)
            if os.path.isfile(p) and name not in ("lock",):
                os.unlink(p)
