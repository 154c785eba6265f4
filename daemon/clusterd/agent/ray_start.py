"""`ray start`, as the node helper runs it: `python -m clusterd.agent.ray_start held|now ARGS`.

It is Ray's own command line (as Ray's `ray` script runs it), with some of its habits changed
for clusters of ours:

- Ray starts a Ray Client server on the head whenever grpc imports, and has no flag to say
  no (it refuses port 0). Nothing of ours speaks Ray Client (the agent is a plain driver), so
  the check it asks is answered "not installed": one Python process fewer on every head
  (0.5 s of CPU at each start, ~70 MB of memory for the cluster's life).
- Once a node's raylet is started, Ray asks the GCS for the node and, while the raylet has
  not registered (a few hundred ms), asks again only a second later. Here it is asked every
  50 ms first, then Ray's own lookup runs as before: 0.5 s off every node's start (on the
  test beds, 1.3 -> 0.75 s for a worker), which is on the launch's path once for the head and
  once more for its workers. A driver's connect (the agent's) has the same habit while its
  node's raylet is not up: the agent waits here first (wait_until_registered).

- With `--include-dashboard=false`, Ray still starts its dashboard process on the head (to
  serve usage stats, which are off) and waits for it to say where it listens, before it
  starts the raylet: 0.45 s of CPU, on the head's start path. It is not started.
- Each raylet starts as many Python workers as the node has CPUs, at once. A job of ours runs
  one task per node (the gang's bundle), and so do the agent's checks on nodes: one worker
  each is ready for the first job; more are started as they are needed. On the test beds'
  2-CPU nodes that is 0.33 s of CPU less per node; on a 64-CPU node, 63 processes fewer.

- A raylet starts its object store on a thread and, at once, connects to it from the main
  thread. When the store's socket is not listening yet (the thread not yet run: a busy
  machine), Ray's connect waits `raylet_client_connect_timeout_milliseconds` (1 s) before it
  tries again. On the test beds' shared cores that second was lost on 3 raylets of 4, once on
  the head and once more on each worker, one after the other on the launch's path. Retried
  every 50 ms here, with as many more tries, so the wait before Ray gives up (10 s) is as
  before. Ray's other clients of a raylet (its workers, drivers) retry the same way.

Should a Ray upgrade move what these touch, its start fails loudly (the tests start real
Ray), rather than quietly running what we meant to leave out.

With "held", Ray's modules are imported at once (0.8-0.9 s of CPU) and the start waits for a
"go" line on stdin: a worker's imports are done while the head still starts. At end of file
(the helper failed, or was killed) it ends without starting anything. After "go" (the head's
GCS port is open) it waits, asking every 50 ms, for the head's node in the GCS
(wait_until_registered): a worker's Ray asks for it first (for the head's directories) and,
when it is not there yet, asks again only 2 s later. Waiting here rather than for the
daemon's word saves a round trip through the daemon on every worker's start.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from ray._private import ray_constants, services, state

NODE_POLL_S = 0.05
NODE_POLL_FOR_S = 10.0  # then Ray's own lookup, with its own retries and timeout
HELD_EXIT = 75  # no "go": nothing was started


def _no_ray_client() -> ImportError:
    return ImportError("Ray Client is not used by clusterd")


_ray_get_node = services.get_node


def _poll_nodes(gcs_address: str, found: Callable[[list[dict[str, Any]]], bool],
                deadline: float) -> bool:
    """Ask the GCS at gcs_address for its node table every NODE_POLL_S until `found` says
    yes (True) or the deadline passes (False)."""
    table = state.GlobalState()
    table._initialize_global_state(services._get_gcs_client_options(gcs_address))
    try:
        while not found(table.node_table()):
            if time.monotonic() > deadline:
                return False
            time.sleep(NODE_POLL_S)
        return True
    finally:
        table.disconnect()


def _get_node(gcs_address: str, node_id: str) -> Any:
    with contextlib.suppress(Exception):  # Ray's own lookup, below, says what is wrong
        _poll_nodes(gcs_address, lambda nodes: any(n.get("NodeID") == node_id for n in nodes),
                    time.monotonic() + NODE_POLL_FOR_S)
    return _ray_get_node(gcs_address, node_id)


_ray_start_api_server = services.start_api_server


def _start_api_server(include_dashboard: bool | None, *args: Any, **kwargs: Any
                      ) -> tuple[str | None, Any]:
    if include_dashboard is False:
        return "", None  # (its URL: "" as Ray has it with no dashboard; no process)
    started: tuple[str | None, Any] = _ray_start_api_server(include_dashboard, *args, **kwargs)
    return started


PRESTARTED_WORKERS = 1
_PRESTART_FLAG = "--num_prestart_python_workers="
_ray_start_ray_process = services.start_ray_process


def _start_ray_process(command: list[str], process_type: str, *args: Any, **kwargs: Any
                       ) -> Any:
    if process_type == ray_constants.PROCESS_TYPE_RAYLET:
        command = [f"{_PRESTART_FLAG}{min(int(arg[len(_PRESTART_FLAG):]), PRESTARTED_WORKERS)}"
                   if arg.startswith(_PRESTART_FLAG) else arg for arg in command]
    return _ray_start_ray_process(command, process_type, *args, **kwargs)


def _gcs_listening(gcs_address: str) -> bool:
    host, port = gcs_address.rsplit(":", 1)
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
            return True
    except OSError:
        return False


def _registered_at(nodes: list[dict[str, Any]], host: str) -> bool:
    return any(node.get("Alive") and node.get("NodeManagerAddress") == host for node in nodes)


def wait_until_registered(gcs_address: str, timeout_s: float) -> bool:
    """Until the head's node (the one at the GCS's host: where the agent, a driver, runs) is
    registered with the GCS at gcs_address, asked every 50 ms (the GCS's port first: a client
    of a GCS not up yet waits long); False when timeout_s passed first. Workers may register
    before the head does (they start beside it)."""
    host = gcs_address.rsplit(":", 1)[0].strip("[]")
    deadline = time.monotonic() + timeout_s
    while not _gcs_listening(gcs_address):
        if time.monotonic() > deadline:
            return False
        time.sleep(NODE_POLL_S)
    return _poll_nodes(gcs_address, lambda nodes: _registered_at(nodes, host), deadline)


# Ray reads its settings from `RAY_<name>` in each process it starts (they inherit this one's
# environment). Ray's defaults: 1000 ms, 10 tries.
CONNECT_RETRY = {"RAY_raylet_client_connect_timeout_milliseconds": "50",
                 "RAY_raylet_client_num_connect_attempts": "200"}


HEAD_WAIT_S = 60.0  # then Ray's own lookup, with its own retries and error


def _address_of(ray_args: list[str]) -> str | None:
    return next((arg.split("=", 1)[1] for arg in ray_args if arg.startswith("--address=")),
                None)


def main(argv: list[str]) -> int:
    from ray.scripts import scripts  # Ray's command line: for `ray start` only

    mode, *ray_args = argv
    for name, value in CONNECT_RETRY.items():
        os.environ.setdefault(name, value)  # a node's own setting wins
    scripts.get_ray_client_dependency_error = _no_ray_client
    services.get_node = _get_node
    services.start_api_server = _start_api_server
    services.start_ray_process = _start_ray_process
    if mode == "held":
        if sys.stdin.readline() != "go\n":
            return HELD_EXIT
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        address = _address_of(ray_args)
        if address is not None:
            wait_until_registered(address, HEAD_WAIT_S)  # not there: Ray's lookup says why
    sys.argv = ["ray", *ray_args]
    result = scripts.main()
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
