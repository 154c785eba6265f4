"""A blocking client for the clusterd control socket (standard library + msgpack).

    with Client() as client:
        print(client.call(StatusArgs()))
        stream = client.stream(LogsArgs(cluster="dev", job_id=3))
        for name, data in stream:
            ...
        print(stream.result)

Several requests may be in flight on one connection (`call_many`); frames for each are matched
by request id.
"""

from __future__ import annotations

# The C module, not `socket`: importing socket.py builds its enums and imports selectors,
# ~3 ms of every clusterctl run, and a connect-send-recv client needs none of that.
import _socket
import errno
import os
import struct
import sys
import time

from clusterctl import paths, protocol
from clusterctl._private import PRIVATE_FILE_MODE, UnsafePath, check_private_dir
from clusterctl._version import __version__

TYPE_CHECKING = False  # typing, for the type checker alone: 2 ms of every clusterctl run
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from types import TracebackType
    from typing import Any

    from clusterctl.protocol import OpArgs

CLIENT_NAME = f"clusterctl/{__version__}"
_PEERCRED = struct.Struct("3i")
AUTOSTART_ENV = "CLUSTERD_NO_AUTOSTART"
AUTOSTART_TIMEOUT_S = 30.0


class ClusterdError(Exception):
    """An error reply from the daemon: a stable code, a message and a hint."""

    def __init__(self, code: str, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.hint = hint

    @classmethod
    def from_wire(cls, error: Any) -> ClusterdError:
        if not isinstance(error, dict):
            return cls(protocol.ErrorCode.INTERNAL, f"malformed error from daemon: {error!r}")
        return cls(
            str(error.get("code", protocol.ErrorCode.INTERNAL)),
            str(error.get("message", "")),
            str(error.get("hint", "")),
        )

    def __str__(self) -> str:
        return f"{self.message} [{self.code}]"


def result_of(reply: dict[str, Any]) -> dict[str, Any]:
    """A final reply's result, or its error raised."""
    if reply.get("ok"):
        result: dict[str, Any] = reply.get("result") or {}
        return result
    raise ClusterdError.from_wire(reply.get("error"))


class DaemonUnavailable(ClusterdError):
    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__("DAEMON_UNAVAILABLE", message, hint)


class Stream:
    """The event frames of one streaming request; `result` holds the final reply's result."""

    def __init__(self, client: Client, request_id: int) -> None:
        self._client = client
        self.request_id = request_id
        self.result: dict[str, Any] | None = None
        self.error: ClusterdError | None = None

    def __iter__(self) -> Iterator[tuple[str, dict[str, Any]]]:
        while True:
            message = self._client._read_for(self.request_id)
            if message["type"] == protocol.EVENT:
                yield str(message.get("event")), message.get("data") or {}
                continue
            if message.get("ok"):
                self.result = message.get("result") or {}
                return
            self.error = ClusterdError.from_wire(message.get("error"))
            raise self.error

    def detach(self) -> None:
        """Tell the daemon we no longer want this stream (the job keeps running)."""
        try:
            self._client._send({"type": protocol.CANCEL, "id": self.request_id})
        except OSError:
            pass


class Client:
    def __init__(
        self,
        socket_path: str | os.PathLike[str] | None = None,
        *,
        autostart: bool | None = None,
        connect_timeout: float = 5.0,
        on_autostart: Callable[[str], None] | None = None,
    ) -> None:
        self.socket_path = os.fspath(socket_path) if socket_path else paths.socket_path()
        if autostart is None:
            autostart = not os.environ.get(AUTOSTART_ENV)
        self._autostart = autostart
        self._connect_timeout = connect_timeout
        self._on_autostart = on_autostart
        self._sock: _socket.socket | None = None
        self._decoder = protocol.FrameDecoder()
        self._pending: dict[int, list[dict[str, Any]]] = {}
        self._next_id = 1
        self.server_hello: dict[str, Any] = {}

    # -- connection ---------------------------------------------------------------------------

    def __enter__(self) -> Client:
        self.connect()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def open_socket(self) -> _socket.socket:
        """A checked connection to our own daemon (see `_open`), starting it first if nobody
        listens and autostart is on; DaemonUnavailable otherwise. The asyncio client opens
        its connections here too."""
        try:
            return self._open()
        except UnsafePath as exc:
            raise DaemonUnavailable(f"refusing to use clusterd's socket: {exc.message}",
                                    exc.fix) from None
        except OSError as exc:
            if not self._autostart or exc.errno not in (errno.ENOENT, errno.ECONNREFUSED):
                raise DaemonUnavailable(
                    f"cannot reach clusterd at {self.socket_path}: {exc.strerror}",
                    "start it with `clusterd` or `systemctl --user start clusterd.socket`",
                ) from None
            # Race-safe (a lock file): many callers at once still start one daemon.
            return self._start_daemon_and_connect()

    def connect(self) -> None:
        if self._sock is not None:
            return
        self._sock = self.open_socket()
        self._send(protocol.hello(CLIENT_NAME))
        reply = self._read_frame()
        if reply.get("type") == protocol.ERROR:
            raise ClusterdError.from_wire(reply.get("error"))
        if reply.get("type") != protocol.HELLO:
            raise ClusterdError(protocol.ErrorCode.BAD_FRAME,
                                f"expected hello, got {reply.get('type')}")
        self.server_hello = reply

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _open(self) -> _socket.socket:
        """A connection to the daemon, made only once we know it is our own: the socket's
        directory is ours and private, and the process listening runs as us (SO_PEERCRED).
        Nothing is sent before both hold, so a socket planted by another user never sees a
        request (or a secret)."""
        directory = os.path.dirname(os.path.abspath(self.socket_path))
        try:
            check_private_dir(directory)
        except FileNotFoundError:
            pass  # then connect fails with ENOENT
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            sock.settimeout(self._connect_timeout)
            sock.connect(self.socket_path)
            sock.settimeout(None)
            _pid, uid, _gid = _PEERCRED.unpack(
                sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, _PEERCRED.size))
        except OSError:
            sock.close()
            raise
        if uid != os.getuid():
            sock.close()
            raise UnsafePath(self.socket_path, f"is served by a process of uid {uid}, not by "
                             f"your own clusterd (uid {os.getuid()})",
                             "remove that socket and start your own clusterd")
        return sock

    def _start_daemon_and_connect(self) -> _socket.socket:
        import subprocess  # only here: every other run of clusterctl is spared the import

        from clusterctl._private import ensure_private_dir

        log_dir = paths.state_dir()
        try:
            ensure_private_dir(log_dir)
        except UnsafePath as exc:
            raise DaemonUnavailable(f"cannot start clusterd: {exc.message}", exc.fix) from None
        self._refuse_if_served_elsewhere(log_dir)
        log_path = os.path.join(log_dir, "clusterd.log")
        if self._on_autostart is not None:
            self._on_autostart(log_path)
        env = dict(os.environ)
        if self.socket_path != paths.socket_path():
            env["CLUSTERD_SOCKET"] = os.path.abspath(self.socket_path)  # it runs in /
        fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW,
                     PRIVATE_FILE_MODE)
        os.fchmod(fd, PRIVATE_FILE_MODE)  # one written by an older clusterd may be 0644
        with os.fdopen(fd, "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "clusterd"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # outlives this client and its terminal
                # Not the user's directory: `-m` puts it first on sys.path, where whatever
                # lies there (a checkout, an egg-info) would shadow the installed package.
                cwd="/",
                env=env,
            )
        deadline = time.monotonic() + AUTOSTART_TIMEOUT_S
        delay = 0.01
        while True:
            try:
                return self._open()
            except UnsafePath as exc:
                raise DaemonUnavailable(f"refusing to use clusterd's socket: {exc.message}",
                                        exc.fix) from None
            except OSError as exc:
                exited = process.poll()
                if exited is not None:
                    self._refuse_if_served_elsewhere(log_dir)
                if exited is not None and exited != 0:
                    raise DaemonUnavailable(
                        f"clusterd exited with code {exited} while starting",
                        f"see {log_path}",
                    ) from None
                if time.monotonic() > deadline:
                    raise DaemonUnavailable(
                        f"clusterd did not answer within {AUTOSTART_TIMEOUT_S:.0f} s: {exc}",
                        f"see {log_path}",
                    ) from None
            time.sleep(delay)
            delay = min(delay * 2, 0.2)

    def _refuse_if_served_elsewhere(self, state_dir: str) -> None:
        """One daemon serves a state directory (see _state_owner): if it listens on another
        socket than ours, starting a second one would only be refused; say which socket."""
        from clusterctl._state_owner import read_owner

        owner = read_owner(state_dir)
        if owner is not None and owner.socket != os.path.abspath(self.socket_path):
            raise DaemonUnavailable(
                f"clusterd (pid {owner.pid}) already serves the state in {state_dir} on "
                f"socket {owner.socket}, not on {self.socket_path}",
                f"talk to it with `clusterctl --socket {owner.socket}` (or "
                "CLUSTERD_SOCKET), or give another daemon a state of its own "
                "(XDG_STATE_HOME)")

    # -- frames -------------------------------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> None:
        if self._sock is None:
            raise DaemonUnavailable("not connected")
        self._sock.sendall(protocol.encode_frame(message))

    def _read_frame(self) -> dict[str, Any]:
        assert self._sock is not None
        while (message := self._decoder.next_message()) is None:
            chunk = self._sock.recv(256 * 1024)
            if not chunk:
                raise DaemonUnavailable(
                    "clusterd closed the connection", "check `journalctl --user -u clusterd`"
                )
            self._decoder.feed(chunk)
        return message

    def _read_for(self, request_id: int) -> dict[str, Any]:
        queued = self._pending.get(request_id)
        if queued:
            return queued.pop(0)
        while True:
            message = self._read_frame()
            if message.get("type") == protocol.ERROR:
                raise ClusterdError.from_wire(message.get("error"))
            got = message.get("id")
            if got == request_id:
                return message
            if isinstance(got, int) and got in self._pending:
                self._pending[got].append(message)

    def _submit(self, args: OpArgs) -> int:
        if self._sock is None:
            self.connect()
        request_id = self._next_id
        self._next_id += 1
        self._pending[request_id] = []
        self._send(protocol.request(request_id, args.op, protocol.to_wire(args)))
        return request_id

    def _finish(self, request_id: int, message: dict[str, Any]) -> dict[str, Any]:
        self._pending.pop(request_id, None)
        return result_of(message)

    # -- requests -----------------------------------------------------------------------------

    def call(self, args: OpArgs) -> dict[str, Any]:
        """Send one request and return its result, skipping any events."""
        request_id = self._submit(args)
        while True:
            message = self._read_for(request_id)
            if message.get("type") == protocol.REPLY:
                return self._finish(request_id, message)

    def stream(self, args: OpArgs) -> Stream:
        return Stream(self, self._submit(args))

    def call_many(
        self,
        requests: Sequence[OpArgs],
        on_event: Callable[[int, str, dict[str, Any]], None] | None = None,
    ) -> list[dict[str, Any] | ClusterdError]:
        """Send all requests at once; return each one's result or error, in order."""
        ids = [self._submit(args) for args in requests]
        results: dict[int, dict[str, Any] | ClusterdError] = {}
        while len(results) < len(ids):
            message = self._read_frame()
            if message.get("type") == protocol.ERROR:
                raise ClusterdError.from_wire(message.get("error"))
            request_id = message.get("id")
            if request_id not in ids:
                continue
            assert isinstance(request_id, int)
            if message["type"] == protocol.EVENT:
                if on_event is not None:
                    on_event(ids.index(request_id), str(message["event"]), message["data"])
                continue
            try:
                results[request_id] = self._finish(request_id, message)
            except ClusterdError as exc:
                results[request_id] = exc
        return [results[i] for i in ids]
