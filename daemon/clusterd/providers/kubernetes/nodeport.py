"""`networking_mode: nodeport`: the address the daemon reaches a pod's SSH node port on.

A NodePort answers on every address of every node, but not every address routes from where
the daemon runs: on EKS and GKE a node's InternalIP is in the cloud's private network, and
only an ExternalIP (where nodes have one) is reachable from a laptop. So each of the pod's
node's addresses is tried, ExternalIP first, by connecting to the port; the first that
answers is used (each is tried again for a while: the port answers once kube-proxy has the
pod as its endpoint), and when none does the launch is refused, saying what was tried and why.
"""

from __future__ import annotations

import errno
import os
import socket
import time
from collections.abc import Iterable
from typing import Any

import anyio

CONNECT_TIMEOUT_S = 3.0
WAIT_S = 30.0  # how long the node port may take to answer at all
RETRY_S = 1.0
# The order in which a node's addresses are tried: the one meant for outsiders first.
ADDRESS_ORDER = ("ExternalIP", "InternalIP")


def node_addresses(node: Any, host_ip: str = "") -> list[tuple[str, str]]:
    """(type, address) of a V1Node's IP addresses, ExternalIP first; the pod's hostIP is an
    InternalIP where the node lists none."""
    listed = [(a.type, a.address) for a in (node.status.addresses or [])
              if a.type in ADDRESS_ORDER and a.address] if node is not None else []
    if host_ip and not any(address == host_ip for _, address in listed):
        listed.append(("InternalIP", host_ip))
    return sorted(listed, key=lambda pair: ADDRESS_ORDER.index(pair[0]))


async def _answers(address: str, port: int) -> str | None:
    """None if address:port accepts a TCP connection now, else why not."""
    try:
        with anyio.fail_after(CONNECT_TIMEOUT_S):
            stream = await anyio.connect_tcp(address, port)
    except TimeoutError:
        return f"no answer within {CONNECT_TIMEOUT_S:.0f} s"
    except OSError as exc:
        # anyio says "All connection attempts failed"; the attempt's own error says why.
        inner = exc.__cause__ if isinstance(exc.__cause__, OSError) else exc
        if inner.errno:
            return f"{os.strerror(inner.errno)} ({errno.errorcode.get(inner.errno, '')})"
        return str(inner)
    await stream.aclose()
    return None


# Answers that waiting cannot change: no route to the address. (A refusal, or no answer, may
# be kube-proxy still setting the port up.)
_NO_ROUTE = (f"({errno.errorcode[errno.EHOSTUNREACH]})",
             f"({errno.errorcode[errno.ENETUNREACH]})", ": not an IP address")


def _final(why: str) -> bool:
    return why.endswith(_NO_ROUTE)


async def reachable(addresses: Iterable[tuple[str, str]], port: int,
                    wait_s: float = WAIT_S) -> tuple[str | None, list[str]]:
    """The first address on which the port answers, and what each one tried said last.
    Tried again for up to wait_s: a Service's port answers only once kube-proxy has its
    endpoint (a moment after the pod is ready)."""
    listed = list(addresses)
    deadline = time.monotonic() + wait_s
    while True:
        tried = []
        for kind, address in listed:
            try:
                socket.inet_pton(socket.AF_INET6 if ":" in address else socket.AF_INET,
                                 address)
            except OSError:
                tried.append(f"{kind} {address}: not an IP address")
                continue
            why = await _answers(address, port)
            if why is None:
                return address, tried
            tried.append(f"{kind} {address}:{port}: {why}")
        if not listed or time.monotonic() >= deadline or all(_final(t) for t in tried):
            return None, tried
        await anyio.sleep(RETRY_S)
