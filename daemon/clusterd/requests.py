"""Long-running requests (launch, exec, stop, start, down) owned by the daemon, not by a client.

A request runs in the daemon's root task group, so a client that disconnects only detaches: the
work goes on and its record says how it ended. Clients follow a request's progress events
(replayed from the start, then live) for as long as they stay connected.
"""

from __future__ import annotations

import contextvars
import itertools
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import structlog

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd import log
from clusterd.redact import public_args, redact_urls
from clusterd.state.requests import RequestRecord, RequestState, RequestStore

logger = log.get("clusterd.requests")

MAX_BUFFERED_EVENTS = 2000
# What a finished request keeps of its events (see StepLog): its first and its last steps.
KEPT_STEPS_EACH_END = 200
KEPT_EVENTS = frozenset({"progress", "blocked", "job"})


class StepLog:
    """The events a request keeps once it is over (steps, waits, the job it submitted): the
    first and the last `each_end` of them, with a step in between saying how many were left
    out; a retry loop of days still leaves a record of bounded size."""

    def __init__(self, each_end: int = KEPT_STEPS_EACH_END) -> None:
        self._each_end = each_end
        self._first: list[list[Any]] = []
        self._last: deque[list[Any]] = deque(maxlen=each_end)
        self._left_out = 0

    def add(self, name: str, data: dict[str, Any]) -> None:
        if name not in KEPT_EVENTS:
            return
        if len(self._first) < self._each_end:
            self._first.append([name, data])
            return
        if len(self._last) == self._each_end:
            self._left_out += 1
        self._last.append([name, data])

    def steps(self) -> list[list[Any]]:
        middle: list[list[Any]] = []
        if self._left_out:
            elapsed = self._last[0][1].get("elapsed", 0) if self._last else 0
            middle = [["progress", {"phase": "", "elapsed": elapsed, "message":
                                    f"({self._left_out} steps left out)"}]]
        return [*self._first, *middle, *self._last]



class RunningRequest:
    def __init__(self, record: RequestRecord) -> None:
        self.record = record
        self.id = record.id
        self.op = record.op
        self.cluster = record.cluster
        self.started = time.monotonic()
        # The latest step and wait, for listings of what is in flight (`requests`).
        self.last_progress: dict[str, Any] | None = None
        self.last_blocked: str | None = None
        self._events: deque[tuple[str, dict[str, Any]]] = deque()
        self._base = 0  # absolute index of _events[0]; older events were dropped
        self._changed = anyio.Event()
        self.done = anyio.Event()
        self.result: dict[str, Any] | None = None
        self.error: ProtocolError | None = None
        self.cancel_scope = anyio.CancelScope()
        self._warned: set[str] = set()
        self.steps = StepLog()

    # -- used by the work -----------------------------------------------------------------

    def emit(self, name: str, data: dict[str, Any]) -> None:
        if name == "progress":
            self.last_progress, self.last_blocked = data, None
        elif name == "blocked":
            self.last_blocked = data.get("message")
        self._events.append((name, data))
        self.steps.add(name, data)
        if len(self._events) > MAX_BUFFERED_EVENTS:
            self._events.popleft()
            self._base += 1
        self._wake()

    async def progress(self, message: str, phase: str = "") -> None:
        """A human-readable step, with the time since the request started."""
        elapsed = time.monotonic() - self.started
        message = redact_urls(message)
        self.emit("progress", {"phase": phase, "message": message, "elapsed": round(elapsed, 2)})
        logger.info("progress", phase=phase, message=message)

    async def warn_once(self, message: str) -> bool:
        """A warning step, unless this request said it already (a finding met at every
        listing of one operation); True if it was said now."""
        if message in self._warned:
            return False
        self._warned.add(message)
        await self.progress(f"warning: {message}", "warning")
        return True

    async def blocked(self, message: str) -> None:
        self.emit("blocked", {"message": message})
        logger.info("blocked", message=message)

    def _wake(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    # -- used by clients ------------------------------------------------------------------

    async def follow(self) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Every event so far, then new ones, until the request ends."""
        seen = 0
        while True:
            changed = self._changed
            start = max(seen, self._base)
            pending = list(itertools.islice(self._events, start - self._base, None))
            for item in pending:
                yield item
            seen = start + len(pending)
            end = self._base + len(self._events)
            if seen < end:
                continue
            if self.done.is_set():
                return
            await changed.wait()

    def outcome(self) -> dict[str, Any]:
        if self.error is not None:
            raise self.error
        return self.result or {}

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "op": self.op,
            "cluster": self.cluster,
            "running_for": round(time.monotonic() - self.started, 1),
            "started_at": self.record.created_at,
            "progress": self.last_progress,
            "blocked": self.last_blocked,
        }


Work = Callable[[RunningRequest], Awaitable[dict[str, Any]]]
# The request whose work is running in this task (and the tasks it starts): lets layers far
# below (an SSH connection meeting a new host key) tell the user through its progress.
current_request: contextvars.ContextVar[RunningRequest | None] = contextvars.ContextVar(
    "current_request", default=None)


class RequestManager:
    def __init__(self, store: RequestStore) -> None:
        self._store = store
        self._running: dict[int, RunningRequest] = {}
        self._task_group: anyio.abc.TaskGroup | None = None
        self._accepting = True

    def attach(self, task_group: anyio.abc.TaskGroup) -> None:
        self._task_group = task_group

    def running(self) -> list[RunningRequest]:
        return list(self._running.values())

    def get(self, request_id: int) -> RunningRequest | None:
        return self._running.get(request_id)

    async def start(
        self, op: str, cluster: str | None, args: dict[str, Any], work: Work
    ) -> RunningRequest:
        if not self._accepting or self._task_group is None:
            raise ProtocolError(
                ErrorCode.SHUTTING_DOWN, "clusterd is shutting down", "retry in a moment"
            )
        record = await self._store.create(op, cluster, public_args(args))
        request = RunningRequest(record)
        self._running[request.id] = request
        self._task_group.start_soon(self._run, request, work, name=f"request-{request.id}-{op}")
        return request

    async def _run(self, request: RunningRequest, work: Work) -> None:
        structlog.contextvars.bind_contextvars(request_id=request.id, cluster=request.cluster)
        current_request.set(request)
        logger.info("request started", op=request.op)
        status = RequestState.CANCELLED  # unless the work ends below, it was cancelled
        try:
            with request.cancel_scope:
                request.result = await work(request)
                status = RequestState.SUCCEEDED
        except ProtocolError as exc:
            status = RequestState.FAILED
            request.error = exc
        except Exception as exc:  # the request fails; the daemon keeps serving
            logger.exception("request crashed", op=request.op)
            status = RequestState.FAILED
            request.error = ProtocolError(
                ErrorCode.INTERNAL, f"{request.op} failed unexpectedly: {exc}",
                "this is a bug in clusterd; the daemon log has the traceback",
            )
        finally:
            if status == RequestState.CANCELLED and request.error is None:
                request.error = ProtocolError(
                    ErrorCode.SHUTTING_DOWN, f"request {request.id} was cancelled",
                    "clusterd is shutting down; run the command again",
                )
            with anyio.CancelScope(shield=True):
                error = request.error
                await self._store.finish(
                    request.id,
                    status,
                    error_code=str(error.code) if error else None,
                    error_message=redact_urls(error.message) if error else None,
                    result=request.result,
                    steps=request.steps.steps(),
                )
                del self._running[request.id]
                request.done.set()
                request._wake()
                logger.info("request finished", op=request.op, status=status)

    async def shutdown(self, grace_s: float) -> None:
        """Stop taking requests; give running ones `grace_s` to finish, then cancel them."""
        self._accepting = False
        with anyio.move_on_after(grace_s):
            for request in list(self._running.values()):
                await request.done.wait()
        for request in list(self._running.values()):
            request.cancel_scope.cancel()
        with anyio.move_on_after(grace_s):
            for request in list(self._running.values()):
                await request.done.wait()
