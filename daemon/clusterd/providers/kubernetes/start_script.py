"""What a pod's container runs: clusterd's own start script (the image's entrypoint is not
run), so that a plain image works, as SkyPilot's pods do.

The script installs what clusterd needs on a node and the image lacks (sshd, rsync, sudo)
with the image's own package manager (apt-get, apk, dnf or yum; the pod then needs to reach
its package mirror), makes the login user (passwordless sudo, the daemon's public key from
$CLUSTERD_SSH_PUBLIC_KEY authorised), makes host keys, and runs sshd in the foreground (keys
only, stream-local forwarding on: the daemon reaches its agent through one). The container
must run as root; an image with everything already (the test bed's node image) starts in a
second. Where it cannot go on, it says why and exits: the pod fails with that as its
termination message, which the launch shows.
"""

from __future__ import annotations

SSH_USER_ENV = "CLUSTERD_SSH_USER"

SCRIPT = r"""set -eu
say() { echo "clusterd-pod: $*"; }
fail() { say "error: $*"; echo "$*" > /dev/termination-log 2>/dev/null || true; exit 1; }
user=${CLUSTERD_SSH_USER:-sky}
sshd=$(command -v sshd || true)
[ -n "$sshd" ] || [ ! -x /usr/sbin/sshd ] || sshd=/usr/sbin/sshd
missing=""
[ -n "$sshd" ] || missing="$missing sshd"
command -v rsync >/dev/null 2>&1 || missing="$missing rsync"
command -v sudo >/dev/null 2>&1 || missing="$missing sudo"
if [ -n "$missing" ]; then
  [ "$(id -u)" = 0 ] || fail "the image lacks$missing; the container is not root to install it"
  say "the image lacks$missing: installing it"
  pkgs="openssh-server rsync sudo"
  if command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || fail "apt-get update failed: the pod cannot reach its package mirror"
    apt-get install -y -qq --no-install-recommends $pkgs >/dev/null \
      || fail "apt-get install $pkgs failed"
  elif command -v apk >/dev/null 2>&1; then
    apk add --no-cache $pkgs >/dev/null || fail "apk add $pkgs failed"
  elif command -v dnf >/dev/null 2>&1; then
    dnf install -y -q $pkgs || fail "dnf install $pkgs failed"
  elif command -v yum >/dev/null 2>&1; then
    yum install -y -q $pkgs || fail "yum install $pkgs failed"
  else
    fail "the image lacks$missing and has no package manager clusterd knows (apt-get, apk," \
      "dnf, yum)"
  fi
  sshd=$(command -v sshd || echo /usr/sbin/sshd)
  say "installed$missing"
fi
[ "$(id -u)" = 0 ] || fail "the container must run as root (it starts sshd for user $user)"
if ! grep -q "^$user:" /etc/passwd; then
  shell=/bin/sh; [ -x /bin/bash ] && shell=/bin/bash
  if command -v useradd >/dev/null 2>&1; then useradd -m -s "$shell" -U "$user"
  else adduser -D -s "$shell" "$user"; fi
fi
# sshd refuses a locked account ("!") even for key logins: no password, not locked.
sed -i "s/^$user:[!*]*:/$user:*:/" /etc/shadow 2>/dev/null || true
mkdir -p /etc/sudoers.d
echo "$user ALL=(ALL:ALL) NOPASSWD: ALL" > /etc/sudoers.d/clusterd
chmod 440 /etc/sudoers.d/clusterd
home=$(awk -F: -v u="$user" '$1 == u {print $6}' /etc/passwd)
group=$(id -gn "$user")
mkdir -p "$home/.ssh"
keys=$home/.ssh/authorized_keys
printf '%s\n' "${CLUSTERD_SSH_PUBLIC_KEY:-}" | grep -v '^[[:space:]]*$' > "$keys" || true
chown -R "$user:$group" "$home/.ssh"
chmod 700 "$home/.ssh"
chmod 600 "$keys"
[ -s "$keys" ] || say "warning: no public key given; nobody can log in"
mkdir -p /run/sshd /var/empty
ssh-keygen -A >/dev/null
root_login=no
[ "$user" != root ] || root_login=prohibit-password
say "starting sshd for $user"
exec "$sshd" -D -e -p 22 -o PasswordAuthentication=no -o KbdInteractiveAuthentication=no \
  -o PubkeyAuthentication=yes -o PermitRootLogin=$root_login -o "AllowUsers $user" \
  -o AllowTcpForwarding=yes -o AllowStreamLocalForwarding=yes -o X11Forwarding=no \
  -o PrintMotd=no -o UseDNS=no -o MaxSessions=64 -o MaxStartups=100:30:200 \
  -o ClientAliveInterval=30
"""


def command() -> list[str]:
    return ["/bin/sh", "-c", SCRIPT]
