"""Helpers both test beds use: messages, commands, files, locks, processes (from /proc), Linux
users, sshd configuration, keys and loopback port checks. Standard library only.

What else the EC2 and the Kubernetes beds share is in this package too, so that neither
imports the other's internals: `control` (a bed controller's control socket) and `host` (the
network namespace, mount checks and the registries of live beds)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

SSHD = "/usr/sbin/sshd"
SSH_KEYGEN = "ssh-keygen"
SSH = "ssh"
STOP_WAIT_S = 5.0


class Failure(Exception):
    """A failure to report on stderr (exit 1). `hint`, when given, is printed on a second line."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


def log(msg: str) -> None:
    try:
        print(msg, flush=True)
    except BrokenPipeError:  # e.g. `testbed up 3 | head -1`: the work is done, keep quiet
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def progress(msg: str) -> None:
    """A step of long work, on stderr: for commands whose stdout is their answer (--json)."""
    print(msg, file=sys.stderr, flush=True)


def warn(msg: str) -> None:
    print(f"testbed: warning: {msg}", file=sys.stderr, flush=True)


def assert_loopback(ip: str) -> str:
    """Every address a test bed uses is a loopback one; anything else is a bug."""
    assert ip.startswith("127."), f"not a loopback address: {ip}"
    return ip


# ---------------------------------------------------------------------------- commands / files


def run(cmd: list[str], check: bool = True,
        timeout: float | None = 60) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=timeout)
    if check and p.returncode != 0:
        out = (p.stderr or p.stdout).strip()
        raise Failure(f"{' '.join(cmd)} failed (exit {p.returncode}): {out}")
    return p


def write_file(path: str, content: str, mode: int = 0o644) -> None:
    """Atomically replace path with content (a symlink is followed, not replaced)."""
    path = os.path.realpath(path)
    d = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=".testbed-", dir=d)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(content)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return None


def tail(path: str, n: int = 20) -> str:
    text = read_text(path)
    if text is None:
        return f"    ({path} does not exist)"
    lines = text.rstrip("\n").splitlines()[-n:]
    if not lines:
        return f"    ({path} is empty)"
    return "\n".join("    " + line for line in lines)


def lock_dir(path: str) -> int:
    """An exclusive flock on a directory (no lock file to leave behind). Close the fd to release."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def lock_parent(d: str) -> int:
    """Serialise testbed invocations: an exclusive flock on DIR's parent directory (no lock file
    to leave behind; DIR itself is deleted by `down`). The parent must exist."""
    return lock_dir(os.path.dirname(d.rstrip("/")) or "/")


# ---------------------------------------------------------------------------- processes


def proc_state(pid: int) -> str | None:
    """One-letter state of pid from /proc, None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # "pid (comm) S ..." - comm may contain spaces and parentheses
    return stat[stat.rindex(")") + 2 :].split(" ", 1)[0]


def pid_alive(pid: int) -> bool:
    st = proc_state(pid)
    return st is not None and st not in ("Z", "X")


def proc_cmdline(pid: int) -> str:
    """pid's command line, arguments joined by spaces ("" if it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def is_our_sshd(pid: int | None, config: str) -> bool:
    """pid is alive, is an sshd, and was started with our config file."""
    if not pid or pid <= 0 or not pid_alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/comm") as f:
            comm = f.read().strip()
    except OSError:
        return False
    # sshd rewrites its argv ("sshd: /usr/sbin/sshd -D -f CONFIG ... [listener] ..."), so look
    # for the config path anywhere in it.
    return comm == "sshd" and config in proc_cmdline(pid)


def children_of(pid: int) -> list[int]:
    """All descendants of pid (by ppid, scanned from /proc)."""
    parent: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            parent[int(name)] = int(stat[stat.rindex(")") + 2 :].split(" ")[1])
        except (OSError, ValueError, IndexError):
            continue
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p and c not in out]
        out.extend(kids)
        todo.extend(kids)
    return out


KILLED: list[int] = []  # every pid we signalled, for wait_reaped()


def wait_reaped(timeout: float = 3.0) -> None:
    """Wait (bounded) until the processes we killed are not even zombies any more. They are not
    our children, so their reaping is up to init, which may do it lazily; without this, `ps`
    right after `down` can still show "[sshd] <defunct>" entries."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(os.path.exists(f"/proc/{p}") for p in KILLED):
            return
        time.sleep(0.1)


def kill_pids(pids: list[int], wait_s: float = STOP_WAIT_S) -> list[int]:
    """SIGTERM pids, wait up to wait_s for them to go, SIGKILL the rest. Returns survivors."""
    pids = [p for p in pids if p > 1 and p != os.getpid() and pid_alive(p)]
    KILLED.extend(pids)
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        pids = [p for p in pids if pid_alive(p)]
        if not pids:
            return []
        time.sleep(0.1)
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        pids = [p for p in pids if pid_alive(p)]
        if not pids:
            return []
        time.sleep(0.05)
    return pids


def user_pids(user: str) -> list[int]:
    p = run(["ps", "-o", "pid=", "-u", user], check=False)
    if p.returncode != 0:  # no processes (exit 1), or no such user
        return []
    return [int(x) for x in p.stdout.split() if x.isdigit() and pid_alive(int(x))]


def kill_user_processes(user: str) -> list[int]:
    """Kill by pid every process owned by user (repeatedly: some may spawn more while dying)."""
    survivors: list[int] = []
    for _ in range(5):
        pids = user_pids(user)
        if not pids:
            return []
        survivors = kill_pids(pids)
    return user_pids(user) or survivors


def read_pid(path: str) -> int | None:
    text = read_text(path)
    try:
        return int(text.strip()) if text else None
    except ValueError:
        return None


# ---------------------------------------------------------------------------- users


def getpw(user: str) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(user)
    except KeyError:
        return None


def unlocked_password_field(user: str) -> None:
    """useradd leaves the password field as "!" (locked); without PAM, OpenSSH refuses even key
    logins to locked accounts. "*" means: no password can match, but the account is usable."""
    try:
        with open("/etc/shadow") as f:
            for line in f:
                fields = line.split(":")
                if fields[0] == user:
                    if fields[1].startswith("!") or fields[1] == "":
                        run(["usermod", "-p", "*", user])
                    return
    except FileNotFoundError:
        return


def chown_tree(path: str, uid: int, gid: int) -> None:
    os.lchown(path, uid, gid)
    for root, dirs, files in os.walk(path):
        for n in dirs + files:
            os.lchown(os.path.join(root, n), uid, gid)


def delete_user(user: str) -> list[str]:
    """Kill the user's processes, then `userdel -r`. Returns errors."""
    if getpw(user) is None:
        return []
    errors: list[str] = []
    left = kill_user_processes(user)
    if left:
        errors.append(f"{user}: processes {left} would not die")
    p = None
    for _ in range(3):
        p = run(["userdel", "-r", user], check=False)
        if getpw(user) is None:
            break
        kill_user_processes(user)  # e.g. "user is currently used by process N"
        time.sleep(0.5)
    if getpw(user) is not None:
        assert p is not None
        errors.append(f"userdel -r {user} failed (exit {p.returncode}): {p.stderr.strip()}")
    return errors


# ---------------------------------------------------------------------------- sshd


def sshd_config(comment: str, listen: str, host_key: str, user: str) -> str:
    """An sshd_config for one test host: key logins of `user` only, forwarding allowed."""

    def q(path: str) -> str:
        return f'"{path}"' if re.search(r"\s", path) else path

    return "\n".join([
        f"# {comment}",
        f"ListenAddress {listen}",
        f"HostKey {q(host_key)}",
        "PidFile none",
        "AuthorizedKeysFile .ssh/authorized_keys",
        "StrictModes yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PubkeyAuthentication yes",
        "UsePAM no",
        "PermitRootLogin no",
        f"AllowUsers {user}",
        "MaxSessions 64",
        "MaxStartups 100:30:200",
        "AllowTcpForwarding yes",
        "AllowStreamLocalForwarding yes",
        "PermitTTY yes",
        "X11Forwarding no",
        "Subsystem sftp internal-sftp",
        "ClientAliveInterval 30",
        "LogLevel INFO",
        "PermitUserEnvironment no",
        "UseDNS no",
        "PrintMotd no",
        "",
    ])


def ensure_run_sshd() -> None:
    """sshd's privilege separation directory."""
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    os.chmod("/run/sshd", 0o755)


def ensure_keygen(path: str, comment: str) -> None:
    if os.path.exists(path) and os.path.exists(path + ".pub"):
        return
    for p in (path, path + ".pub"):
        if os.path.exists(p):
            os.unlink(p)
    run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path])
    os.chmod(path, 0o600)


def port_open(ip: str, port: int, timeout: float = 0.5) -> bool:
    assert_loopback(ip)
    try:
        with socket.create_connection((ip, port), timeout=timeout):
            return True
    except OSError:
        return False


def ssh_banner(ip: str, port: int, timeout: float = 1.0) -> bool:
    """Something on ip:port accepts connections and greets like an SSH server."""
    assert_loopback(ip)
    try:
        with socket.create_connection((ip, port), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(256).startswith(b"SSH-")
    except OSError:
        return False


WHEELHOUSE_TIMEOUT_S = 900.0
WHEELHOUSE_SUMS = "SHA256SUMS"  # clusterd/runtime/wheelhouse.py: every file's digest


def prepare_wheelhouse(python: str, wheelhouse_dir: str, skip: str) -> str:
    """clusterd's runtime wheelhouse in wheelhouse_dir, as a daemon given it as
    CLUSTERD_WHEELHOUSE_DIR finds it (`clusterd --prepare-runtime` with python; it needs the
    package index once per version of clusterd, and is instant after). A bed makes it before
    anything enters its namespace, which has no way out. skip: how to do without. Returns its
    KEY directory."""
    if not os.access(python, os.X_OK):
        raise Failure(f"{python} not found (the runtime wheelhouse needs the project's venv)",
                      hint="scripts/quickstart or scripts/test makes it")
    log(f"preparing the runtime wheelhouse in {wheelhouse_dir} ...")
    try:
        p = subprocess.run([python, "-m", "clusterd", "--prepare-runtime"],
                           env={**os.environ, "CLUSTERD_WHEELHOUSE_DIR": wheelhouse_dir},
                           stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=WHEELHOUSE_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        raise Failure("clusterd --prepare-runtime timed out", hint=skip) from e
    lines = p.stdout.strip().splitlines()
    house = lines[-1].strip() if lines else ""
    if p.returncode != 0 or not os.path.isfile(os.path.join(house, WHEELHOUSE_SUMS)):
        raise Failure(f"clusterd --prepare-runtime failed (exit {p.returncode}): "
                      f"{(p.stderr or p.stdout).strip()[-2000:]}",
                      hint=f"it needs the package index once per version of clusterd; {skip}")
    return house


# ---------------------------------------------------------------------------- Debian roots

CACHE_ROOT = "/var/cache/clusterd-testbed"  # what the beds build once per machine
DEBOOTSTRAP_TIMEOUT_S = 1200.0


def debian_mirror() -> str:
    """The machine's Debian mirror (not its security one): debootstrap takes any suite of
    Debian's archive from it."""
    from _testbed.common.apt_sources import machine_sources

    for stanza in machine_sources():
        uris = stanza.get("URIs", "")
        if "security" not in uris:
            return uris.split()[0]
    raise Failure("the machine's apt sources have no Debian mirror for debootstrap")


def debootstrap(suite: str, rootfs: str, packages: tuple[str, ...], mirror: str) -> None:
    """A minimal Debian `suite` at rootfs with packages (from mirror, as root). Run in
    throwaway mount and PID namespaces: debootstrap's mounts of proc and sys in the target,
    and anything a package's scripts start, go when it ends."""
    p = subprocess.run(["unshare", "--mount", "--pid", "--fork", "--kill-child=SIGKILL", "--",
                        "debootstrap", "--variant=minbase", f"--include={','.join(packages)}",
                        suite, rootfs, mirror], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=DEBOOTSTRAP_TIMEOUT_S,
                       env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"})
    if p.returncode != 0:
        out = (p.stderr or p.stdout).strip()[-2000:]
        log_file = os.path.join(rootfs, "debootstrap", "debootstrap.log")
        if os.path.exists(log_file):
            with open(log_file, errors="replace") as f:
                out += "\n" + f.read()[-2000:]
        raise Failure(f"debootstrap {suite} failed (exit {p.returncode}): {out}",
                      hint="the bed needs Debian's archive (deb.debian.org or the machine's "
                           "mirror) and the debootstrap package")


def add_sudo_user(rootfs: str, user: str, uid: int, sudoers_name: str) -> None:
    """user (uid, its own group, bash, a home) in rootfs, with passwordless sudo, as cloud
    images have their login user. Its password field is "*": not locked, since sshd without
    PAM refuses accounts whose field is "!"."""
    for cmd in (["useradd", "-m", "-s", "/bin/bash", "-u", str(uid), "-U", user],
                ["usermod", "-p", "*", user]):
        run(["chroot", rootfs, *cmd], timeout=120)
    path = os.path.join(rootfs, "etc", "sudoers.d", sudoers_name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(f"{user} ALL=(ALL:ALL) NOPASSWD: ALL\n")
    os.chmod(path, 0o440)


def strip_rootfs(rootfs: str) -> None:
    """No host keys (each machine makes its own) and no apt lists or downloaded packages (as
    an image is published)."""
    ssh = os.path.join(rootfs, "etc", "ssh")
    for name in os.listdir(ssh) if os.path.isdir(ssh) else []:
        if name.startswith("ssh_host_"):
            os.unlink(os.path.join(ssh, name))
    for rel in ("var/lib/apt/lists", "var/cache/apt/archives"):
        d = os.path.join(rootfs, rel)
        for name in os.listdir(d) if os.path.isdir(d) else []:
            p = os.path.join(d, name)
            if os.path.isfile(p) and name != "lock":
                os.unlink(p)
