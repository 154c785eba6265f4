"""The runtime image (`scripts/testbed ec2 up --runtime-image`): what users of real AWS bake into
an AMI of their own. A template home directory, DIR/images/runtime-KEY/home, holds clusterd's
runtime for wheelhouse KEY exactly as clusterd's install_runtime leaves it on a node
(.clusterd/venvs/KEY with its ready marker, and the .clusterd/current link); the controller
registers an AMI for it in every region, and the watcher gives an instance of that AMI, on its
first boot, a copy of the template on its new disk (disk.py). clusterd then finds the runtime
there and skips the install.

The template is built once per KEY, by the command line: `unshare --mount --net --pid --fork --
python -m _testbed.ec2.runtime_image ...` runs `main` as root in throwaway namespaces (an empty
network namespace: the install is offline), with the template on /home/ubuntu and the wheelhouse
read-only on /mnt, and main runs install_runtime's steps there as the node's user with the node's
python, so every absolute path in the venv is a node's. Standard library only.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import stat
import subprocess
import sys
import time

from _testbed.common import Failure, getpw, log, run
from _testbed.ec2.layout import (
    NODE_HOME,
    NODE_USER,
    READY_MARKER,
    RUNTIME_IMAGE_MODULE,
    SCRIPTS,
    BedPaths,
    runtime_venv,
)

NODE_PYTHON = "/usr/bin/python3"  # the node's python: the host's, as a node sees the host's /usr
WHEELHOUSE_MOUNT = "/mnt"  # where the build sees the wheelhouse
BUILD_TIMEOUT_S = 900.0
STEP_TIMEOUT_S = 600.0
# pip runs as the node's user, and the wheelhouse is root's (mode 0700): this capability lets it
# read the wheelhouse (and nothing is written with it but as that user).
READ_CAPS = ("--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search")
# What clusterd writes in a wheelhouse it built (clusterd/runtime/wheelhouse.py): every file's
# digest, last; and every wheel pinned to its digest, for pip's --require-hashes.
SUMS = "SHA256SUMS"
HASHED_REQUIREMENTS = "requirements-hashed.txt"


def check_trusted_dir(path: str) -> None:
    """As clusterd does: a real directory of root (or ours) that nobody else can write to,
    else whoever could decides what the image's nodes run."""
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid not in (0, os.getuid()) or \
            info.st_mode & 0o022:
        raise Failure(f"refusing the wheelhouse {path}: not a directory of root's (or yours) "
                      f"that only its owner can write to (uid {info.st_uid}, mode "
                      f"{stat.S_IMODE(info.st_mode):04o}, symbolic link or other kind: "
                      f"{not stat.S_ISDIR(info.st_mode)})",
                      hint="leave out --no-wheelhouse: `up` then prepares the right one")


def find_wheelhouse(wheelhouse_dir: str) -> str:
    """The one wheelhouse (a KEY directory clusterd built: it has SHA256SUMS) in
    wheelhouse_dir, if it and wheelhouse_dir can be trusted (check_trusted_dir). Its files are
    checked against the digests when the image is built (install)."""
    try:
        names = sorted(os.listdir(wheelhouse_dir))
    except FileNotFoundError:
        names = []
    # KEY-for-TAG: a wheelhouse clusterd built for nodes of another kind (not the daemon's).
    ready = [os.path.join(wheelhouse_dir, n) for n in names
             if os.path.isfile(os.path.join(wheelhouse_dir, n, SUMS)) and "-for-" not in n]
    if len(ready) != 1:
        raise Failure(f"--runtime-image needs exactly one wheelhouse in {wheelhouse_dir}; "
                      f"there are {len(ready)}",
                      hint="leave out --no-wheelhouse: `up` then prepares the right one")
    check_trusted_dir(wheelhouse_dir)
    check_trusted_dir(ready[0])
    return ready[0]


def template_ready(home: str, key: str) -> bool:
    return os.path.isfile(os.path.join(home, runtime_venv(key), READY_MARKER)) and \
        os.path.islink(os.path.join(home, ".clusterd", "current"))


def check_node_python(key: str) -> None:
    """clusterd installs offline only on a node whose python is the daemon's (KEY names it)."""
    m = re.search(r"-py(\d+\.\d+)-", key)
    node = run([NODE_PYTHON, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]).stdout
    if m is None or m.group(1) != node.strip():
        raise Failure(f"the wheelhouse {key} is not for the nodes' python ({NODE_PYTHON} is "
                      f"{node.strip()}): clusterd would not install it offline, so no image "
                      f"can hold it", hint="run the bed without --runtime-image")


def ensure_template(paths: BedPaths, wheelhouse: str) -> str:
    """The runtime image's template for wheelhouse (a KEY directory): found, or built (about as
    long as installing the runtime on one node). Returns its path."""
    key = os.path.basename(os.path.normpath(wheelhouse))
    final = paths.runtime_template(key)
    if template_ready(final, key):
        log(f"runtime image {key}: its template is built already ({final})")
        return final
    check_node_python(key)
    pw = getpw(NODE_USER)
    if pw is None:
        raise Failure(f"there is no user {NODE_USER} to build the runtime image as")
    part = final + ".new"
    shutil.rmtree(part, ignore_errors=True)  # an interrupted build's
    os.makedirs(part)
    os.chown(part, pw.pw_uid, pw.pw_gid)
    os.chmod(part, 0o755)
    log(f"runtime image {key}: building its template (once per wheelhouse) ...")
    start = time.monotonic()
    cmd = ["unshare", "--mount", "--net", "--pid", "--fork", "--mount-proc",
           "--kill-child=SIGKILL", "--", sys.executable, "-m", RUNTIME_IMAGE_MODULE,
           "--home", part, "--wheelhouse", wheelhouse, "--key", key]
    try:
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           cwd="/", timeout=BUILD_TIMEOUT_S,
                           env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONPATH": SCRIPTS,
                                "LANG": "C.UTF-8"})
    except subprocess.TimeoutExpired as e:
        shutil.rmtree(part, ignore_errors=True)
        raise Failure(f"building the runtime image's template took over "
                      f"{BUILD_TIMEOUT_S:.0f}s") from e
    if p.returncode != 0 or not template_ready(part, key):
        shutil.rmtree(part, ignore_errors=True)
        raise Failure(f"building the runtime image's template failed (exit {p.returncode}): "
                      f"{(p.stderr + p.stdout).strip()[-2000:]}")
    for name in os.listdir(part):  # only the runtime: the rest of a home is the instance's own
        if name != ".clusterd":
            shutil.rmtree(os.path.join(part, name))
    os.rename(part, final)
    log(f"runtime image {key}: template built in {time.monotonic() - start:.1f}s ({final})")
    return final


# ---------------------------------------------------------------------------- in the namespace


def as_user(user: str, cmd: list[str]) -> None:
    """Run cmd in the node's home as user (with the node's environment); SystemExit if it
    fails."""
    env = {"HOME": NODE_HOME, "USER": user, "LOGNAME": user, "LANG": "C.UTF-8",
           "PATH": "/usr/local/bin:/usr/bin:/bin",
           # no host pip configuration, and no pip cache left in the template
           "PIP_CONFIG_FILE": os.devnull, "PIP_NO_CACHE_DIR": "1"}
    p = subprocess.run(["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups",
                        *READ_CAPS, "--", *cmd], stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, cwd=NODE_HOME, env=env, timeout=STEP_TIMEOUT_S)
    if p.returncode != 0:
        raise SystemExit(f"runtime_image: {' '.join(cmd)} failed (exit {p.returncode}): "
                         f"{(p.stderr or p.stdout).strip()[-1500:]}")


def install(key: str, house: str, user: str) -> None:
    """clusterd's install_runtime, step by step, from the wheelhouse at house: every file
    checked against the digests recorded when it was built, and pip installing each wheel
    only if it has its recorded digest (--require-hashes)."""
    venv = runtime_venv(key)
    if not glob.glob(os.path.join(house, "clusterd-*.whl")):
        raise SystemExit(f"runtime_image: the wheelhouse {key} has no clusterd wheel")
    as_user(user, ["sh", "-c", f'cd "$1" && sha256sum --check --strict --quiet {SUMS}', "sh",
                   house])
    pip = [f"{venv}/bin/python", "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    as_user(user, [NODE_PYTHON, "-m", "venv", "--clear", venv])
    as_user(user, [*pip, "--no-index", "--no-deps", "--require-hashes", "--find-links", house,
                   "-r", os.path.join(house, HASHED_REQUIREMENTS)])
    as_user(user, ["touch", f"{venv}/{READY_MARKER}"])
    as_user(user, ["ln", "-sfn", f"venvs/{key}", ".clusterd/current"])


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="runtime_image")
    ap.add_argument("--home", required=True, help="the template being built")
    ap.add_argument("--wheelhouse", required=True, help="the wheelhouse KEY directory")
    ap.add_argument("--key", required=True)
    ap.add_argument("--user", default=NODE_USER)
    args = ap.parse_args(argv)
    if os.getpid() != 1:
        raise SystemExit("runtime_image: must be PID 1 of its own namespaces (run by unshare)")
    os.umask(0o022)
    try:  # nothing mounted here shows up outside; the namespaces go when this process does
        run(["mount", "--make-rprivate", "/"])
        run(["mount", "--bind", args.home, NODE_HOME])
        os.makedirs(WHEELHOUSE_MOUNT, exist_ok=True)
        run(["mount", "--bind", args.wheelhouse, WHEELHOUSE_MOUNT])
        run(["mount", "-o", "remount,bind,ro", WHEELHOUSE_MOUNT])
    except Failure as e:
        raise SystemExit(f"runtime_image: {e}") from e
    install(args.key, WHEELHOUSE_MOUNT, args.user)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
