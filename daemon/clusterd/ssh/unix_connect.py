"""A ProxyCommand for nodes the daemon reaches through a Unix socket of its own (a pod, through
the daemon's port-forward over the Kubernetes API server): ssh, the daemon's own connections
and yours alike (`ssh CLUSTER` through clusterd's ssh config), run
`python -m clusterd.ssh.unix_connect SOCKET`, and this relays the connection's bytes.

The socket is in the daemon's private runtime directory (0700): only its user gets through.
Standard library only: it is started once per SSH connection.
"""

from __future__ import annotations

import socket
import sys

from clusterd.ssh.stdio_relay import relay


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: python -m clusterd.ssh.unix_connect SOCKET", file=sys.stderr)
        return 255
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(sys.argv[1])
    except OSError as exc:
        print(f"unix_connect: cannot reach {sys.argv[1]}: {exc} (is clusterd running?)",
              file=sys.stderr)
        return 255
    relay(sock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
