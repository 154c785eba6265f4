"""The hosts test bed: N local sshd "hosts" on 127.0.0.2.. for clusterd's SSH node pools
(`scripts/testbed up N | down | status`; the command line is described in scripts/testbed).

Host i (1-based) is a real sshd listening on 127.0.0.(i+1):PORT that lets in only the Linux
user PREFIXi (created if missing) with the test bed's key DIR/id_ed25519. Standard library only.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pwd
import re
import shlex
import shutil
import subprocess
import time
from typing import Any

from _testbed import requirements
from _testbed.common import (
    SSH,
    SSH_KEYGEN,
    SSHD,
    Failure,
    children_of,
    chown_tree,
    delete_user,
    ensure_keygen,
    ensure_run_sshd,
    getpw,
    is_our_sshd,
    kill_pids,
    lock_parent,
    log,
    pid_alive,
    port_open,
    read_pid,
    read_text,
    run,
    ssh_banner,
    sshd_config,
    tail,
    unlocked_password_field,
    wait_reaped,
    warn,
    write_file,
)

MAX_HOSTS = 20
STATE_FILE = "state.json"  # everything `down` needs, written before anything is created
HOSTS_FILE = "hosts.json"  # for machines: [{"ip", "port", "user", "home", "pid"}]
PORT_WAIT_S = 15.0
SSH_CHECK_TIMEOUT_S = 30.0
GECOS_TAG = "clusterd testbed"  # users' comment field: "clusterd testbed DIR"

USER_RE = re.compile(r"^[a-z_][a-z0-9_-]*$")
POOL_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
YAML_PLAIN_RE = re.compile(r"^[A-Za-z0-9_./+-]+$")


# ---------------------------------------------------------------------------- defaults / paths


def default_dir() -> str:
    return os.environ.get("CLUSTERD_TESTBED_DIR") or "/tmp/clusterd-testbed"


def default_pools_file() -> str:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "clusterd", "ssh_node_pools.yaml")


def host_ip(i: int) -> str:
    return f"127.0.0.{i + 1}"


def host_dir(d: str, i: int) -> str:
    return os.path.join(d, f"host{i}")


def stop_sshd(d: str, i: int) -> list[str]:
    """Stop host i's sshd (and the per-connection sshd processes it forked). Returns errors."""
    hd = host_dir(d, i)
    pid = read_pid(os.path.join(hd, "sshd.pid"))
    config = os.path.join(hd, "sshd_config")
    if not is_our_sshd(pid, config):
        return []
    assert pid is not None
    pids = [pid] + [c for c in children_of(pid) if pid_alive(c)]
    left = kill_pids(pids)
    if pid in left:
        return [f"host{i}: sshd pid {pid} did not stop"]
    return []


# ---------------------------------------------------------------------------- users


def gecos_for(d: str) -> str:
    return f"{GECOS_TAG} {d}"


def owning_testbed(user: str, d: str) -> str | None:
    """Another live test bed that user belongs to (by the comment `up` gives its users)."""
    pw = getpw(user)
    if pw is None or not pw.pw_gecos.startswith(GECOS_TAG + " "):
        return None
    other = pw.pw_gecos[len(GECOS_TAG) + 1 :]
    if other != d and os.path.exists(os.path.join(other, STATE_FILE)):
        return other
    return None


def ensure_user(user: str, pubkey: str, d: str) -> pwd.struct_passwd:
    pw = getpw(user)
    if pw is None:
        p = run(["useradd", "-m", "-s", "/bin/bash", "-c", gecos_for(d), user], check=False)
        pw = getpw(user)
        if pw is None:
            raise Failure(f"useradd {user} failed (exit {p.returncode}): {p.stderr.strip()}")
    elif pw.pw_gecos != gecos_for(d):
        run(["usermod", "-c", gecos_for(d), user])
    unlocked_password_field(user)
    home = pw.pw_dir
    if not os.path.isdir(home):
        os.makedirs(home, mode=0o755)
        for n in os.listdir("/etc/skel") if os.path.isdir("/etc/skel") else ():
            src = os.path.join("/etc/skel", n)
            if os.path.isfile(src) and not os.path.islink(src):
                shutil.copy2(src, os.path.join(home, n))
        chown_tree(home, pw.pw_uid, pw.pw_gid)
    st = os.stat(home)
    if st.st_uid != pw.pw_uid:  # a home left over from an earlier user of that name
        chown_tree(home, pw.pw_uid, pw.pw_gid)
    if st.st_mode & 0o022:  # sshd's StrictModes: no group/other write on the home
        os.chmod(home, st.st_mode & 0o755 & ~0o022)
    ssh_dir = os.path.join(home, ".ssh")
    if os.path.islink(ssh_dir):
        os.unlink(ssh_dir)
    os.makedirs(ssh_dir, exist_ok=True)
    os.chown(ssh_dir, pw.pw_uid, pw.pw_gid)
    os.chmod(ssh_dir, 0o700)
    ak = os.path.join(ssh_dir, "authorized_keys")
    want = pubkey.strip() + "\n"
    if os.path.islink(ak) or read_text(ak) != want:
        if os.path.islink(ak):
            os.unlink(ak)
        write_file(ak, want, 0o600)
    os.chown(ak, pw.pw_uid, pw.pw_gid)
    os.chmod(ak, 0o600)
    return pw



# ---------------------------------------------------------------------------- pool file


def block_markers(pool: str) -> tuple[str, str]:
    return f"# >>> testbed {pool}", f"# <<< testbed {pool}"


def split_pool_file(text: str, pool: str, path: str) -> tuple[list[str], list[str], bool]:
    """(lines before our block, lines after it, whether the block was there)."""
    begin, end = block_markers(pool)
    lines = text.splitlines(keepends=True)
    starts = [n for n, ln in enumerate(lines) if ln.rstrip() == begin]
    if not starts:
        if any(ln.rstrip() == end for ln in lines):
            raise Failure(f"{path}: found '{end}' without '{begin}'; fix the file by hand")
        return lines, [], False
    if len(starts) > 1:
        raise Failure(f"{path}: '{begin}' appears {len(starts)} times; fix the file by hand")
    s = starts[0]
    ends = [n for n in range(s + 1, len(lines)) if lines[n].rstrip() == end]
    if not ends:
        raise Failure(f"{path}: '{begin}' has no matching '{end}'; fix the file by hand")
    return lines[:s], lines[ends[0] + 1 :], True


def yaml_str(s: str) -> str:
    return s if YAML_PLAIN_RE.match(s) else json.dumps(s)


def pool_block(pool: str, identity_file: str, hosts: list[dict[str, Any]]) -> str:
    begin, end = block_markers(pool)
    out = [begin, f"{pool}:", f"  identity_file: {yaml_str(identity_file)}", "  hosts:"]
    for h in hosts:
        out += [f"    - ip: {h['ip']}", f"      user: {h['user']}", f"      port: {h['port']}"]
    out.append(end)
    return "\n".join(out) + "\n"


def check_pool_file(path: str, pool: str) -> tuple[list[str], list[str]]:
    """The file's lines around our block; fails if the file is not ours to edit that way."""
    if os.path.isdir(path):
        raise Failure(f"{path} is a directory")
    before, after, _ = split_pool_file(read_text(path) or "", pool, path)
    key = re.compile(rf"^{re.escape(pool)}\s*:")
    if any(key.match(ln) for ln in before + after):
        raise Failure(f"{path} already defines a pool '{pool}' outside the testbed block; "
                      f"use --pool with another name")
    return before, after


def write_pool(path: str, pool: str, identity_file: str, hosts: list[dict[str, Any]]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    before, after = check_pool_file(path, pool)
    if before and not before[-1].endswith("\n"):
        before[-1] += "\n"
    new = "".join(before) + pool_block(pool, identity_file, hosts) + "".join(after)
    mode = os.stat(path).st_mode & 0o777 if os.path.exists(path) else 0o644
    write_file(path, new, mode)


def remove_pool(path: str, pool: str) -> bool:
    """Remove our block; delete the file if nothing else is left. True if something changed."""
    text = read_text(path)
    if text is None:
        return False
    before, after, found = split_pool_file(text, pool, path)
    if not found:
        return False
    rest = "".join(before) + "".join(after)
    if rest.strip() == "":
        os.unlink(path)
    else:
        write_file(path, rest, os.stat(path).st_mode & 0o777)
    return True


# ---------------------------------------------------------------------------- state


def load_state(d: str) -> dict[str, Any] | None:
    text = read_text(os.path.join(d, STATE_FILE))
    if text is None:
        return None
    try:
        state = json.loads(text)
    except ValueError as e:
        raise Failure(f"{os.path.join(d, STATE_FILE)} is not valid JSON: {e}") from e
    if not isinstance(state, dict) or not isinstance(state.get("hosts"), list):
        raise Failure(f"{os.path.join(d, STATE_FILE)} is not a testbed state file")
    return state


def save_state(d: str, state: dict[str, Any]) -> None:
    write_file(os.path.join(d, STATE_FILE), json.dumps(state, indent=2) + "\n", 0o644)


def scan_hosts(d: str) -> list[dict[str, Any]]:
    """Hosts found in DIR/hostI directories (for a DIR whose state file is missing)."""
    out = []
    try:
        names = os.listdir(d)
    except OSError:
        return []
    for n in names:
        m = re.fullmatch(r"host(\d+)", n)
        if not m:
            continue
        i = int(m.group(1))
        cfg = read_text(os.path.join(d, n, "sshd_config")) or ""
        um = re.search(r"^AllowUsers\s+(\S+)", cfg, re.M)
        out.append({"index": i, "ip": host_ip(i), "user": um.group(1) if um else None})
    return sorted(out, key=lambda h: h["index"])


# ---------------------------------------------------------------------------- sshd


def host_sshd_config(d: str, i: int, port: int, user: str) -> str:
    return sshd_config(f"host{i} of the clusterd test bed in {d} (written by scripts/testbed)",
                       f"{host_ip(i)}:{port}",
                       os.path.join(host_dir(d, i), "ssh_host_ed25519_key"), user)


def start_sshd(d: str, i: int) -> int:
    hd = host_dir(d, i)
    config = os.path.join(hd, "sshd_config")
    logf = os.path.join(hd, "sshd.log")
    t = run([SSHD, "-t", "-f", config], check=False)
    if t.returncode != 0:
        raise Failure(f"host{i}: sshd -t -f {config} rejects the config: {t.stderr.strip()}")
    with open(logf, "a") as lf:
        lf.write(f"--- testbed: starting sshd at {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        lf.flush()
        proc = subprocess.Popen(
            [SSHD, "-D", "-f", config, "-E", logf],
            stdin=subprocess.DEVNULL, stdout=lf, stderr=lf,
            start_new_session=True, close_fds=True, cwd="/",
        )
    write_file(os.path.join(hd, "sshd.pid"), f"{proc.pid}\n", 0o644)
    return proc.pid


def ssh_check(d: str, h: dict[str, Any]) -> tuple[bool, str]:
    cmd = [
        SSH, "-F", "/dev/null", "-i", os.path.join(d, "id_ed25519"), "-p", str(h["port"]),
        "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
        "-o", "UserKnownHostsFile=/dev/null", "-o", "IdentitiesOnly=yes",
        "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR",
        f"{h['user']}@{h['ip']}", "true",
    ]
    assert h["ip"].startswith("127.")
    try:
        p = run(cmd, check=False, timeout=SSH_CHECK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return False, f"timed out after {SSH_CHECK_TIMEOUT_S:.0f}s"
    return p.returncode == 0, (p.stderr or p.stdout).strip() or f"exit {p.returncode}"


# ---------------------------------------------------------------------------- commands


def cmd_up(args: argparse.Namespace) -> int:
    d = os.path.abspath(args.dir)
    n, port, prefix, pool = args.n, args.port, args.prefix, args.pool
    pools_file = os.path.abspath(args.pools_file)
    requirements.ensure_debian_packages(requirements.HOSTS_PACKAGES)
    if not os.path.exists(SSHD):
        raise Failure(f"{SSHD} not found (apt-get install openssh-server)")
    for tool in (SSH_KEYGEN, SSH, "useradd", "userdel", "usermod", "ps"):
        if shutil.which(tool) is None:
            raise Failure(f"{tool} not found on PATH")

    os.makedirs(os.path.dirname(d), exist_ok=True)
    lock = lock_parent(d)
    try:
        if os.path.islink(d):
            raise Failure(f"{d} is a symlink; refusing to use it as the test bed directory")
        if os.path.exists(d) and os.stat(d).st_uid != 0:
            raise Failure(f"{d} exists and is not owned by root; refusing to use it")
        state = load_state(d)
        if state is not None:
            if state.get("prefix") != prefix or state.get("port") != port:
                raise Failure(
                    f"the test bed in {d} was made with --prefix {state.get('prefix')} "
                    f"--port {state.get('port')}; run `testbed down --dir {d}` first")
        else:
            state = {"version": 1, "dir": d, "prefix": prefix, "port": port, "hosts": []}
        old_pool, old_pools_file = state.get("pool"), state.get("pools_file")
        old_hosts = {h["index"]: h for h in state["hosts"]}

        # Before touching anything: the pool file must be editable, the users must not belong
        # to another live test bed, and the addresses of hosts not running yet must be free.
        check_pool_file(pools_file, pool)
        for i in range(1, n + 1):
            user, ip = f"{prefix}{i}", host_ip(i)
            other = owning_testbed(user, d)
            if other:
                raise Failure(f"user {user} belongs to the test bed in {other}; take that one "
                              f"down or use another --prefix")
            hd = host_dir(d, i)
            running = is_our_sshd(read_pid(os.path.join(hd, "sshd.pid")),
                                  os.path.join(hd, "sshd_config"))
            if not running and port_open(ip, port):
                raise Failure(f"host{i}: {ip}:{port} is already in use by another process "
                              f"(another test bed? use --port)")

        os.makedirs(d, mode=0o755, exist_ok=True)

        # Record what we are about to create before creating it, so `down` can always clean up.
        for i in range(1, n + 1):
            old_hosts.setdefault(i, {"index": i, "ip": host_ip(i), "port": port,
                                     "user": f"{prefix}{i}", "home": None, "pid": None})
        state["hosts"] = [old_hosts[i] for i in sorted(old_hosts)]
        state["pool"], state["pools_file"] = pool, pools_file
        save_state(d, state)

        # The pool moved (another --pool or --pools-file): take it out of where it was.
        if old_pool and old_pools_file and (old_pool, old_pools_file) != (pool, pools_file):
            remove_pool(old_pools_file, old_pool)

        # Shrinking: hosts above N go away entirely.
        extra = [h for h in state["hosts"] if h["index"] > n]
        if extra:
            errors: list[str] = []
            for h in extra:
                errors += stop_sshd(d, h["index"])
                errors += delete_user(h["user"])
            if errors:
                raise Failure("could not remove hosts above N:\n  " + "\n  ".join(errors))
            for h in extra:
                shutil.rmtree(host_dir(d, h["index"]), ignore_errors=True)
            state["hosts"] = [h for h in state["hosts"] if h["index"] <= n]
            save_state(d, state)
            log(f"removed {len(extra)} host(s) above {n}: " + ", ".join(h["user"] for h in extra))

        ensure_run_sshd()
        key = os.path.join(d, "id_ed25519")
        ensure_keygen(key, "clusterd-testbed")
        pubkey = read_text(key + ".pub") or ""

        started: list[int] = []
        for h in state["hosts"]:
            i, user = h["index"], h["user"]
            pw = ensure_user(user, pubkey, d)
            h["home"] = pw.pw_dir
            hd = host_dir(d, i)
            os.makedirs(hd, mode=0o755, exist_ok=True)
            ensure_keygen(os.path.join(hd, "ssh_host_ed25519_key"), f"testbed-host{i}")
            config = os.path.join(hd, "sshd_config")
            want = host_sshd_config(d, i, port, user)
            changed = read_text(config) != want
            if changed:
                write_file(config, want, 0o644)
            pid = read_pid(os.path.join(hd, "sshd.pid"))
            if is_our_sshd(pid, config) and not changed:
                h["pid"] = pid
                continue
            if is_our_sshd(pid, config):  # running with an outdated config: restart it
                stop_sshd(d, i)
            if port_open(h["ip"], port):
                raise Failure(f"host{i}: {h['ip']}:{port} is already in use by another process")
            h["pid"] = start_sshd(d, i)
            started.append(i)
        save_state(d, state)

        # Wait until every host's port accepts connections (and the sshd we started is still
        # the one listening), then log in to each for real.
        deadline = time.monotonic() + PORT_WAIT_S
        waiting = {h["index"]: h for h in state["hosts"]}
        while waiting:
            for i, h in list(waiting.items()):
                config = os.path.join(host_dir(d, i), "sshd_config")
                if not is_our_sshd(h["pid"], config):
                    raise Failure(f"host{i}: sshd (pid {h['pid']}) exited; its log "
                                  f"{host_dir(d, i)}/sshd.log ends with:\n"
                                  + tail(os.path.join(host_dir(d, i), "sshd.log")))
                if ssh_banner(h["ip"], port):
                    del waiting[i]
            if not waiting:
                break
            if time.monotonic() > deadline:
                i = min(waiting)
                raise Failure(f"host{i}: no SSH server answering on {waiting[i]['ip']}:{port} "
                              f"after {PORT_WAIT_S:.0f}s; its log ends with:\n"
                              + tail(os.path.join(host_dir(d, i), "sshd.log")))
            time.sleep(0.1)

        with concurrent.futures.ThreadPoolExecutor(max_workers=MAX_HOSTS) as ex:
            results = list(ex.map(lambda h: (h, ssh_check(d, h)), state["hosts"]))
        bad = [(h, msg) for h, (ok, msg) in results if not ok]
        if bad:
            parts = []
            for h, msg in bad:
                logf = os.path.join(host_dir(d, h["index"]), "sshd.log")
                config = os.path.join(host_dir(d, h["index"]), "sshd_config")
                if not is_our_sshd(h["pid"], config):
                    msg += f" (and its sshd, pid {h['pid']}, is no longer running)"
                parts.append(f"host{h['index']}: ssh {h['user']}@{h['ip']} -p {port} failed: "
                             f"{msg}\n  {logf} ends with:\n{tail(logf)}")
            raise Failure("\n".join(parts))

        write_pool(pools_file, pool, key, state["hosts"])
        hosts_json = [{"ip": h["ip"], "port": h["port"], "user": h["user"], "home": h["home"],
                       "pid": h["pid"]} for h in state["hosts"]]
        write_file(os.path.join(d, HOSTS_FILE), json.dumps(hosts_json, indent=2) + "\n", 0o644)
        save_state(d, state)
    finally:
        os.close(lock)

    kept = len(state["hosts"]) - len(started)
    log(f"test bed in {d}: {len(state['hosts'])} host(s) up "
        f"({len(started)} started, {kept} already running), all answering over ssh")
    for h in state["hosts"]:
        log(f"  {h['user']}@{h['ip']} -p {h['port']}  (sshd pid {h['pid']}, home {h['home']})")
    log(f"identity file: {key}")
    log(f"pool '{pool}' written to {pools_file}")
    log(f"try: ssh -i {shlex.quote(key)} -p {port} -o StrictHostKeyChecking=no "
        f"-o UserKnownHostsFile=/dev/null {state['hosts'][0]['user']}@{state['hosts'][0]['ip']}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    d = os.path.abspath(args.dir)
    if not os.path.isdir(os.path.dirname(d)):
        log(f"no test bed in {d}; nothing to do")
        return 0
    lock = lock_parent(d)
    try:
        if not os.path.isdir(d):
            log(f"no test bed in {d}; nothing to do")
            return 0
        state = load_state(d)
        if state is None:
            hosts = scan_hosts(d)
            pool = pools_file = None
        else:
            hosts = state["hosts"]
            pool, pools_file = state.get("pool"), state.get("pools_file")
        if args.pools_file:
            pools_file = os.path.abspath(args.pools_file)
        errors: list[str] = []
        for h in hosts:
            errors += stop_sshd(d, h["index"])
        for h in hosts:
            user = h.get("user")
            if not user:
                continue
            other = owning_testbed(user, d)
            if other:
                warn(f"not deleting user {user}: it now belongs to the test bed in {other}")
                continue
            errors += delete_user(user)
        if pool and pools_file:
            try:
                if remove_pool(pools_file, pool):
                    log(f"removed pool '{pool}' from {pools_file}")
            except Failure as e:
                errors.append(str(e))
        if errors:
            raise Failure("down did not finish (kept " + d + " so it can be retried):\n  "
                          + "\n  ".join(errors))
        shutil.rmtree(d)
        wait_reaped()
    finally:
        os.close(lock)
    users = ", ".join(h["user"] for h in hosts if h.get("user")) or "none"
    log(f"test bed in {d} is down: {len(hosts)} host(s) stopped, users removed ({users})")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    d = os.path.abspath(args.dir)
    state = load_state(d) if os.path.isdir(d) else None
    if state is None or not state["hosts"]:
        print(f"no test bed in {d}")
        return 2
    all_alive = True
    print(f"test bed in {d} (pool '{state.get('pool')}' in {state.get('pools_file')})")
    print(f"  {'HOST':<7} {'IP':<11} {'PORT':<6} {'USER':<16} {'PID':<8} SSHD")
    for h in state["hosts"]:
        i = h["index"]
        config = os.path.join(host_dir(d, i), "sshd_config")
        pid = read_pid(os.path.join(host_dir(d, i), "sshd.pid"))
        alive = is_our_sshd(pid, config)
        all_alive &= alive
        print(f"  host{i:<3} {h['ip']:<11} {h['port']:<6} {h['user']:<16} {pid or '-'!s:<8} "
              f"{'alive' if alive else 'DEAD'}")
    return 0 if all_alive else 1
