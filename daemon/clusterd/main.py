"""`clusterd`: the per-user daemon. Usually started by systemd or by clusterctl on demand."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import anyio

from clusterctl._private import PRIVATE_UMASK, UnsafePath, ensure_private_dir
from clusterctl._version import __version__
from clusterctl.protocol import ProtocolError
from clusterd import log
from clusterd.app import AlreadyRunning, Daemon, StateInUse
from clusterd.config import Settings
from clusterd.runtime.install import WheelhouseBuilder
from clusterd.runtime.node_platform import RuntimeTarget
from clusterd.server.listener import SocketInUse, UnsafeListener


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="clusterd", description=__doc__)
    parser.add_argument("--socket", type=Path, help="control socket path "
                        "(default: $XDG_RUNTIME_DIR/clusterd/clusterd.sock)")
    parser.add_argument("--log-level", choices=log.LEVELS, help="default: info")
    parser.add_argument("--log-file", type=Path, help="write JSON log lines here, not stderr")
    parser.add_argument("--prepare-runtime", action="store_true",
                        help="build (or find) the wheelhouse that nodes install the runtime "
                             "from and the rclone bucket mounts send them, print their paths "
                             "and exit; needs the package index once")
    parser.add_argument("--prepare-runtime-for", action="append", default=[], metavar="TAG",
                        help="with --prepare-runtime: also the runtime for nodes of another "
                             "kind, e.g. cp310-x86_64-glibc2.35 (Python minor, CPU, glibc), "
                             "and uv for their CPU; repeatable")
    parser.add_argument("--version", action="version", version=f"clusterd {__version__}")
    return parser.parse_args(argv)


async def _prepare_for(builder: WheelhouseBuilder, target: RuntimeTarget) -> Path:
    wheelhouse = await builder.ensure()
    await builder.node_uv(target.machine)
    return (await builder.foreign(wheelhouse, target)).path


def main(argv: list[str] | None = None) -> None:
    # Everything the daemon writes (state, logs, keys, sockets) is for its user alone.
    os.umask(PRIVATE_UMASK)
    args = parse_args(argv)
    overrides: dict[str, object] = {"log_level": args.log_level}
    if args.socket is not None:
        overrides["socket_path"] = args.socket.absolute()
        overrides["runtime_dir"] = args.socket.absolute().parent
    settings = Settings.from_env(**overrides)
    if args.prepare_runtime:
        from clusterd.storage.node_rclone import NodeRclone

        try:
            # The rclone a mount sends to nodes of this machine's kind; the wheelhouse's path
            # stays the last line (the test beds read it).
            print(NodeRclone(settings.wheelhouse_dir).build(os.uname().machine))
            builder = WheelhouseBuilder(settings.wheelhouse_dir)
            for tag in args.prepare_runtime_for:
                # For nodes of another kind, and uv (which also installs a Python on nodes
                # with none) for their CPU; a daemon then needs no index for them either.
                print(anyio.run(_prepare_for, builder, RuntimeTarget.from_tag(tag)))
            print(builder.node_uv_now(os.uname().machine))
            print(builder.build().path)
        except ProtocolError as exc:
            sys.exit(f"clusterd: {exc.message}\nhint: {exc.hint}" if exc.hint else
                     f"clusterd: {exc.message}")
        return
    # A daemon holds no directory of the user's open; paths it gets are absolute.
    os.chdir("/")
    try:
        # Checked before anything is written there: a directory planted or loosened by
        # someone else is refused, with the path and the fix.
        for directory in (settings.runtime_dir, settings.state_dir):
            ensure_private_dir(str(directory))
    except UnsafePath as exc:
        sys.exit(f"clusterd: refusing to start: {exc.message}\nhint: {exc.fix}")
    log.configure(settings.log_level, path=args.log_file)
    try:
        anyio.run(Daemon(settings).run)
    except UnsafeListener as exc:
        sys.exit(f"clusterd: {exc}")
    except StateInUse as exc:
        owner = exc.owner
        if owner is not None and owner.socket != str(settings.socket_path):
            # Two daemons on one state would both act on the same clusters: refused.
            sys.exit(f"clusterd: refusing to start: {exc}\n"
                     f"hint: talk to that one (clusterctl --socket {owner.socket}), or give "
                     "this one a state of its own (XDG_STATE_HOME)")
        # Not an error: a racing autostart found the daemon it wanted already there.
        print(f"clusterd: {exc}", file=sys.stderr)
        sys.exit(0)
    except AlreadyRunning as exc:
        # Not an error: a racing autostart found the daemon it wanted already there.
        print(f"clusterd: {exc}", file=sys.stderr)
        sys.exit(0)
    except SocketInUse as exc:
        print(f"clusterd: {exc}", file=sys.stderr)
        sys.exit(0)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
