"""A ProxyCommand for tests: relay stdin/stdout to HOST:PORT, and note each use in LOG.

    python relay.py HOST PORT LOG
"""

from __future__ import annotations

import socket
import sys
import threading


def main() -> None:
    host, port, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    assert host.startswith("127."), "tests relay to loopback only"
    with open(log, "a") as f:
        f.write(f"relayed {host}:{port}\n")
    sock = socket.create_connection((host, port))

    def upstream() -> None:
        while data := sys.stdin.buffer.read1(65536):
            sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)

    threading.Thread(target=upstream, daemon=True).start()
    while data := sock.recv(65536):
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()


if __name__ == "__main__":
    main()
