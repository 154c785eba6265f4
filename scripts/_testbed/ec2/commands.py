"""`scripts/testbed ec2 up | down | exec | env`: making and removing the bed (and its runtime
image), and running things in it. Runs outside the bed's namespace; standard library only."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from typing import Any

from _testbed import requirements
from _testbed.common import (
    KILLED,
    SSHD,
    Failure,
    ensure_run_sshd,
    kill_pids,
    lock_dir,
    lock_parent,
    log,
    pid_alive,
    prepare_wheelhouse,
    proc_cmdline,
    read_pid,
    read_text,
    wait_reaped,
    warn,
    write_file,
)
from _testbed.common.control import request
from _testbed.common.host import (
    EC2_BEDS,
    NETNS_RE,
    create_netns,
    delete_netns,
    netns_exists,
    netns_pids,
)
from _testbed.ec2 import disk, host_setup, images, runtime_image
from _testbed.ec2.layout import (
    API_URL,
    CLUSTERD_YAML,
    CONTROLLER_MODULE,
    NODE_INIT_MODULE,
    REMOVED_ENV,
    RUNTIME_IMAGES_ENV,
    SCRIPTS,
    VENV_PYTHON,
    BedPaths,
    aws_config_text,
    aws_credentials_text,
    bed_env,
    default_netns,
    load_state,
    runtime_images,
    save_state,
)

READY_TIMEOUT_S = 90.0
CONTROLLER_STOP_S = 10.0


def controller_pid(paths: BedPaths, state: dict[str, Any] | None) -> int | None:
    """The bed's controller's pid, if that process is alive and is that controller."""
    pid = (state or {}).get("controller_pid")
    if not isinstance(pid, int) or not pid_alive(pid):
        return None
    cmdline = proc_cmdline(pid)
    return pid if CONTROLLER_MODULE in cmdline and paths.dir in cmdline else None


def require_bed(paths: BedPaths) -> dict[str, Any]:
    """The state of a bed whose controller runs; Failure otherwise."""
    state = load_state(paths) if os.path.isdir(paths.dir) else None
    if state is None:
        raise Failure(f"no EC2 test bed in {paths.dir}", hint="scripts/testbed ec2 up")
    if controller_pid(paths, state) is None:
        raise Failure(f"the EC2 test bed in {paths.dir} is broken: its controller "
                      f"(pid {state.get('controller_pid')}) is not running; "
                      f"last log line: {last_line(paths.controller_log)}",
                      hint=f"see {paths.controller_log}; `scripts/testbed ec2 up` makes the "
                           f"bed again")
    return state


def last_line(path: str) -> str:
    lines = (read_text(path) or "").strip().splitlines()
    return lines[-1].strip() if lines else f"({path} is empty)"


# ---------------------------------------------------------------------------- up


def cmd_up(args: argparse.Namespace, regions: list[str]) -> int:
    paths = BedPaths(os.path.abspath(args.dir))
    requirements.ensure_debian_packages(requirements.EC2_PACKAGES)
    tools = ["ip", "unshare", "nft", "useradd", "userdel", "usermod", "visudo", "sudo",
             "ssh-keygen", "mount"]
    for tool in tools + (["setpriv", "cp"] if args.runtime_image else []):
        if shutil.which(tool) is None:
            raise Failure(f"{tool} not found on PATH",
                          hint="apt-get install iproute2 util-linux passwd sudo openssh-client "
                               "mount coreutils nftables")
    if not os.path.exists(SSHD):
        raise Failure(f"{SSHD} not found", hint="apt-get install openssh-server")
    disk.check_host()
    if not os.access(VENV_PYTHON, os.X_OK):
        raise Failure(f"{VENV_PYTHON} not found (the controller needs the project's venv)",
                      hint="scripts/test or scripts/quickstart makes it")
    if args.image_roots:  # before any lock of the bed's: the first build takes minutes
        requirements.ensure_debian_packages(requirements.DEBOOTSTRAP_PACKAGES)
        images.ensure_all()
    wheelhouse = None if args.no_wheelhouse else prepare_wheelhouse(
        VENV_PYTHON, bed_env(paths, os.environ)["CLUSTERD_WHEELHOUSE_DIR"],
        "--no-wheelhouse skips it")

    os.makedirs(os.path.dirname(paths.dir), exist_ok=True)
    reg_lock = lock_dir(EC2_BEDS.ensure_dir())  # users, sudoers, registry
    lock = lock_parent(paths.dir)
    try:
        if os.path.islink(paths.dir):
            raise Failure(f"{paths.dir} is a symlink; refusing to use it as the bed's directory")
        if os.path.exists(paths.dir) and os.stat(paths.dir).st_uid != 0:
            raise Failure(f"{paths.dir} exists and is not owned by root; refusing to use it")
        state = load_state(paths) if os.path.isdir(paths.dir) else None
        kept_image = None
        if state is not None and args.netns and args.netns != state.get("netns"):
            raise Failure(f"the bed in {paths.dir} runs in namespace {state.get('netns')}, "
                          f"not {args.netns}", hint="ec2 down first, or another --dir")
        if state is not None and controller_pid(paths, state) is not None:
            if bool(state.get("iam")) != args.iam:
                raise Failure(f"the bed in {paths.dir} is up "
                              f"{'enforcing' if state.get('iam') else 'not enforcing'} IAM",
                              hint="ec2 down first to change --iam")
            if bool(state.get("image_roots")) != args.image_roots:
                raise Failure(f"the bed in {paths.dir} is up "
                              f"{'with' if state.get('image_roots') else 'without'} image roots",
                              hint="ec2 down first to change --image-roots")
            extend_bed(paths, state, regions)
        else:
            netns = args.netns or (state or {}).get("netns") or default_netns()
            if state is not None:
                warn(f"the bed in {paths.dir} is broken (its controller is not running); "
                     f"making it again")
                kept_image = state.get("runtime_image")
                teardown(paths, state, keep=("wheelhouse", "images"))
            state = create_bed(paths, netns, regions, args.iam, args.image_roots)
            if kept_image:
                state["runtime_image"] = kept_image
        # The bed is registered now, so the node user stays; the image is built without holding
        # every other bed up.
        os.close(reg_lock)
        reg_lock = -1
        if args.runtime_image or state.get("runtime_image"):
            ensure_runtime_image(paths, state, args.runtime_image, wheelhouse)
        print_summary(paths, state)
        return 0
    finally:
        os.close(lock)
        if reg_lock >= 0:
            os.close(reg_lock)


def cmd_build_images(args: argparse.Namespace) -> int:
    """The image roots, built or found (images.py), and how long that took."""
    start = time.monotonic()
    requirements.ensure_debian_packages(requirements.DEBOOTSTRAP_PACKAGES)
    roots = images.ensure_all()
    for suite, path in roots.items():
        log(f"  {suite}: {path}")
    log(f"EC2 bed image roots ready in {time.monotonic() - start:.1f}s")
    return 0


def ensure_runtime_image(paths: BedPaths, state: dict[str, Any], build: bool,
                         wheelhouse: str | None) -> None:
    """With build, the runtime image of the bed's wheelhouse (wheelhouse, or with
    --no-wheelhouse the one in the bed's wheelhouse directory): its template built if it is not
    yet, and registered in every region. Without, the bed's current runtime image registered
    again (in the regions just added). The ids go into state."""
    if build:
        if wheelhouse is None:
            wheelhouse = runtime_image.find_wheelhouse(
                bed_env(paths, os.environ)["CLUSTERD_WHEELHOUSE_DIR"])
        template = runtime_image.ensure_template(paths, wheelhouse)
        key = os.path.basename(os.path.normpath(wheelhouse))
    else:
        key, template = state["runtime_image"]["key"], state["runtime_image"]["template"]
        if not runtime_image.template_ready(template, key):
            warn(f"the bed's runtime image {key} is gone ({template}); "
                 f"`up --runtime-image` builds it again")
            del state["runtime_image"]
            save_state(paths, state)
            return
    images = request(paths.control_sock, "runtime_image", timeout=120, key=key,
                     template=template)["images"]
    state["runtime_image"] = {"key": key, "template": template, "images": images}
    save_state(paths, state)


def create_bed(paths: BedPaths, netns: str, regions: list[str], iam: bool,
               image_roots: bool = False) -> dict[str, Any]:
    if not NETNS_RE.match(netns):
        raise Failure(f"--netns {netns!r} is not a usable namespace name")
    others = EC2_BEDS.live_beds()
    if netns in others and others[netns] != paths.dir:
        raise Failure(f"network namespace {netns} belongs to the EC2 test bed in {others[netns]}",
                      hint="use another --netns")
    if netns_exists(netns) and netns not in others:
        raise Failure(f"network namespace {netns} exists and is not a test bed's",
                      hint="use another --netns")
    # Record what we are about to make before making it, so `down` can always clean up.
    os.makedirs(paths.dir, mode=0o755, exist_ok=True)
    state: dict[str, Any] = {"version": 1, "dir": paths.dir, "netns": netns, "regions": regions,
                             "controller_pid": None, "iam": iam, "image_roots": image_roots}
    save_state(paths, state)
    EC2_BEDS.register(paths.dir, netns)

    host_setup.ensure_node_user()
    ensure_run_sshd()
    host_setup.write_stubs(paths)
    write_client_files(paths, regions[0])
    for sub in ("instances",):
        os.makedirs(os.path.join(paths.dir, sub), mode=0o755, exist_ok=True)
    create_netns(netns)

    with open(paths.controller_log, "ab") as lf:
        lf.write(f"--- testbed: starting the controller at "
                 f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
        lf.flush()
        env = bed_env(paths, os.environ)
        env["PYTHONPATH"] = SCRIPTS
        proc = subprocess.Popen(
            ["ip", "netns", "exec", netns, VENV_PYTHON, "-m", CONTROLLER_MODULE,
             "--dir", paths.dir, "--regions", ",".join(regions), *(["--iam"] if iam else []),
             *(["--image-roots"] if image_roots else [])],
            stdin=subprocess.DEVNULL, stdout=lf, stderr=lf, cwd="/", env=env,
            start_new_session=True, close_fds=True)
    state["controller_pid"] = proc.pid  # `ip netns exec` execs the controller: same pid
    save_state(paths, state)
    wait_ready(paths, proc)
    log(f"EC2 test bed in {paths.dir} is up (namespace {netns}, controller pid {proc.pid})")
    return state


def extend_bed(paths: BedPaths, state: dict[str, Any], regions: list[str]) -> None:
    """Up already: add the regions it does not have yet, keep the rest."""
    new = [r for r in regions if r not in state["regions"]]
    if new:
        request(paths.control_sock, "add_regions", timeout=120, regions=new)
        state["regions"] = state["regions"] + new
        save_state(paths, state)
        log(f"EC2 test bed in {paths.dir}: added region(s) {', '.join(new)}")
    else:
        log(f"EC2 test bed in {paths.dir} is already up")


def write_client_files(paths: BedPaths, default_region: str) -> None:
    os.makedirs(os.path.dirname(paths.aws_config), mode=0o755, exist_ok=True)
    write_file(paths.aws_config, aws_config_text(default_region), 0o644)
    write_file(paths.aws_credentials, aws_credentials_text(), 0o600)
    write_file(paths.clusterd_yaml, CLUSTERD_YAML, 0o644)
    for sub, mode in (("run", 0o700), ("state", 0o755), ("config", 0o755)):
        d = os.path.join(paths.client, sub)
        os.makedirs(d, mode=mode, exist_ok=True)
        os.chmod(d, mode)


def wait_ready(paths: BedPaths, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise Failure(f"the bed's controller exited ({proc.returncode}) while starting: "
                          f"{last_line(paths.controller_log)}",
                          hint=f"see {paths.controller_log}; scripts/testbed ec2 down "
                               f"--dir {paths.dir} cleans up")
        if os.path.exists(paths.control_sock):
            with contextlib.suppress(Failure):
                request(paths.control_sock, "ping", timeout=5)
                return
        if time.monotonic() > deadline:
            raise Failure(f"the bed's controller was not ready after {READY_TIMEOUT_S:.0f}s: "
                          f"{last_line(paths.controller_log)}",
                          hint=f"see {paths.controller_log}; scripts/testbed ec2 down "
                               f"--dir {paths.dir} cleans up")
        time.sleep(0.1)


def print_summary(paths: BedPaths, state: dict[str, Any]) -> None:
    log(f"  regions: {', '.join(state['regions'])}; API {API_URL} inside the namespace")
    images = runtime_images(state)
    if images:
        log(f"  runtime image {state['runtime_image']['key']}: "
            + ", ".join(f"{r} {i}" for r, i in images.items())
            + f" (${RUNTIME_IMAGES_ENV} in `exec`)")
    log("  try: scripts/testbed ec2 exec -- python -c 'import boto3; "
        "print(boto3.client(\"ec2\").describe_vpcs()[\"Vpcs\"])'")
    log(f"  see: scripts/testbed ec2 status; log {paths.controller_log}")


# ---------------------------------------------------------------------------- down


def cmd_down(args: argparse.Namespace) -> int:
    paths = BedPaths(os.path.abspath(args.dir))
    reg_lock = lock_dir(EC2_BEDS.ensure_dir())
    lock = lock_parent(paths.dir) if os.path.isdir(os.path.dirname(paths.dir)) else None
    try:
        state = load_state(paths) if os.path.isdir(paths.dir) else None
        netns = (state or {}).get("netns") or EC2_BEDS.registered_netns(paths.dir)
        if state is None and not os.path.isdir(paths.dir) and netns is None:
            log(f"no EC2 test bed in {paths.dir}; nothing to do")
            return 0
        teardown(paths, state or {"netns": netns})
    finally:
        if lock is not None:
            os.close(lock)
        os.close(reg_lock)
    log(f"EC2 test bed in {paths.dir} is down")
    return 0


def teardown(paths: BedPaths, state: dict[str, Any], keep: tuple[str, ...] = ()) -> None:
    """Stop everything the bed started, by pid, delete its namespace and directory (but the
    entries of it named in keep), and (when it was the last bed) the ubuntu user and its sudoers
    file. Idempotent."""
    errors: list[str] = []
    netns = state.get("netns")
    pid = controller_pid(paths, state)
    if pid is not None:  # SIGTERM first: it kills its nodes itself
        KILLED.append(pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + CONTROLLER_STOP_S
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if pid_alive(pid):
            warn(f"the controller (pid {pid}) did not stop on SIGTERM; killing it")
            kill_pids([pid], wait_s=0)
    if os.path.isdir(paths.instances):
        for iid in os.listdir(paths.instances):
            npid = read_pid(paths.instance(iid).node_pid)
            if npid and pid_alive(npid) and NODE_INIT_MODULE in proc_cmdline(npid) \
                    and paths.instance(iid).root in proc_cmdline(npid):
                KILLED.append(npid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(npid, signal.SIGKILL)  # the node's PID 1 dies, and its namespace
    if netns:
        for _ in range(5):  # whatever else runs in the namespace (daemons started by `exec`)
            pids = netns_pids(netns)
            if not pids:
                break
            kill_pids(pids)
        left = netns_pids(netns)
        if left:
            errors.append(f"processes {left} in namespace {netns} would not die")
        else:
            try:
                delete_netns(netns)
            except Failure as e:
                errors.append(str(e))
        EC2_BEDS.unregister(netns)
    if not EC2_BEDS.live_beds().keys() - {netns}:
        errors += host_setup.remove_node_user()
    if errors:
        raise Failure("down did not finish (kept " + paths.dir + " so it can be retried):\n  "
                      + "\n  ".join(errors))
    if os.path.isdir(paths.dir):
        host_setup.remove_dir(paths, keep)
    wait_reaped()


# ---------------------------------------------------------------------------- exec / env


def cmd_exec(args: argparse.Namespace) -> int:
    paths = BedPaths(os.path.abspath(args.dir))
    state = require_bed(paths)
    cmd = list(args.cmd)
    if cmd[:1] == ["--"]:
        cmd = cmd[1:]
    if not cmd:
        raise Failure("ec2 exec needs a command: scripts/testbed ec2 exec -- CMD ...")
    ip = shutil.which("ip") or "/usr/sbin/ip"
    os.execve(ip, [ip, "netns", "exec", state["netns"], *cmd],
              bed_env(paths, os.environ, state))


def cmd_env(args: argparse.Namespace) -> int:
    paths = BedPaths(os.path.abspath(args.dir))
    env = bed_env(paths, os.environ, require_bed(paths))
    if args.json:
        log(json.dumps(env, indent=2, sort_keys=True))
        return 0
    for k in (*REMOVED_ENV, RUNTIME_IMAGES_ENV):
        if k in os.environ and k not in env:
            log(f"unset {k}")
    for k, v in sorted(env.items()):
        if os.environ.get(k) != v:
            log(f"export {k}={shlex.quote(v)}")
    return 0
