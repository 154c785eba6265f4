"""rsync's "remote shell" when clusterd copies files to a node (`rsync -e`).

rsync runs `python -m clusterd.ssh.rsync_shell SOCKET HOST rsync --server ...`; this relays
the remote command and then the bytes, both ways, to the daemon over SOCKET, and the daemon
runs the command on the node through its own SSH connection. So copies reuse the daemon's
connection (and its pinned host key) instead of opening one of their own.

Standard library only: it is started once per copy.
"""

from __future__ import annotations

import json
import socket
import sys

from clusterd.ssh.stdio_relay import relay


def main() -> int:
    if len(sys.argv) < 4:
        print("usage: rsync_shell SOCKET HOST COMMAND...", file=sys.stderr)
        return 255
    path, _host, *command = sys.argv[1:]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as exc:
        print(f"rsync_shell: cannot reach clusterd at {path}: {exc}", file=sys.stderr)
        return 255
    sock.sendall(json.dumps(command).encode() + b"\n")
    relay(sock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
