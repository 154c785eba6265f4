"""What a node is, as its runtime needs to know: its CPU, its C library, and its Python.

A node is not the daemon's machine. Ubuntu 22.04 (EC2's default image) ships Python 3.10
without the venv module, Debian 11 ships 3.9, an arm64 instance is aarch64, and a daemon may
run on a Mac. The runtime a node gets is built for what the probe here finds (one SSH round
trip): the node's `uname -m`, its glibc (`getconf GNU_LIBC_VERSION`), and the first Python of
MIN_PYTHON or later among a CPython clusterd installed there before (uv-managed), `python3`,
and `python3.X` on its PATH. A node with none of those gets a uv-managed CPython
(python_install.py).

The runtime's key for a node (RuntimeTarget.tag) names exactly what its wheels depend on:
the Python minor (the ABI), the CPU and the glibc floor; never the daemon's interpreter.
"""

from __future__ import annotations

import dataclasses
import platform
import re
import sys

from clusterctl.protocol import ErrorCode, ProtocolError

# The oldest Python the node code runs on (tests/unit/test_node_python.py keeps it so).
MIN_PYTHON = (3, 10)
# Where a uv-managed CPython goes on a node (relative to its login directory).
MANAGED_PYTHONS = ".clusterd/python"
# Newest first: a node with several takes the newest (python3 first, as most images mean it).
_CANDIDATES = ("python3", "python3.14", "python3.13", "python3.12", "python3.11", "python3.10")
# What each candidate says of itself. Runs on any Python 3 (even one too old to use).
_SAY = ("import sys; v = sys.version_info; "
        f"print('python' if v[:2] >= {MIN_PYTHON} else 'old', "
        "'%d.%d' % v[:2], sys.executable)")


def probe_script() -> str:
    """The node's sh script: `machine M`, `zstd 0|1`, `libc L`, then `python X.Y EXE` for
    the first usable Python (exit 0), or `old X.Y EXE` lines and `python none`."""
    return f"""
echo "machine $(uname -m)"
if command -v zstd >/dev/null 2>&1; then echo "zstd 1"; else echo "zstd 0"; fi
echo "libc $(getconf GNU_LIBC_VERSION 2>/dev/null || echo unknown)"
for p in {MANAGED_PYTHONS}/cpython-*/bin/python3 {" ".join(_CANDIDATES)}; do
  case "$p" in
    */*) [ -x "$p" ] || continue ;;
    *) command -v "$p" >/dev/null 2>&1 || continue ;;
  esac
  said=$("$p" -c "{_SAY}" 2>/dev/null) || continue
  echo "$said"
  case "$said" in python*) exit 0 ;; esac
done
echo "python none"
"""


@dataclasses.dataclass(frozen=True)
class PythonSource:
    """Where a node with no usable Python gets a CPython (uv's `python install`): uv's own
    default (python-build-standalone's releases on GitHub), a `mirror` of them
    (CLUSTERD_PYTHON_MIRROR: uv's --mirror), or a list of downloads with their digests
    (CLUSTERD_PYTHON_DOWNLOADS_JSON_URL: uv's --python-downloads-json-url)."""

    mirror: str = ""
    downloads_json_url: str = ""

    def uv_args(self) -> list[str]:
        args = []
        if self.mirror:
            args += ["--mirror", self.mirror]
        if self.downloads_json_url:
            args += ["--python-downloads-json-url", self.downloads_json_url]
        return args


@dataclasses.dataclass(frozen=True)
class RuntimeTarget:
    """What a runtime's wheels are built for."""

    python: str  # X.Y
    machine: str  # uname -m: x86_64, aarch64
    glibc: tuple[int, int] | None  # None: not glibc (musl), or not known

    @property
    def tag(self) -> str:
        """Names the runtime built for this target (a directory name)."""
        libc = f"glibc{self.glibc[0]}.{self.glibc[1]}" if self.glibc else "nolibc"
        return f"cp{self.python.replace('.', '')}-{self.machine}-{libc}"

    @classmethod
    def from_tag(cls, tag: str) -> RuntimeTarget:
        """The target `tag` names (cp310-x86_64-glibc2.35); ProtocolError if it names none."""
        match = re.fullmatch(r"cp3(\d+)-(\w+)-glibc2\.(\d+)", tag)
        if match is None:
            raise ProtocolError(ErrorCode.INVALID_ARGUMENT,
                                f"{tag!r} names no kind of node",
                                "write cpXY-MACHINE-glibcA.B, e.g. cp310-x86_64-glibc2.35")
        return cls(f"3.{match[1]}", match[2], (2, int(match[3])))

    def platforms(self) -> list[str]:
        """pip's `--platform` tags of the wheels this target runs: manylinux for this glibc
        and every older one (newest first), with their legacy names."""
        if self.glibc is None or self.glibc[0] != 2:
            found = "not glibc" if self.glibc is None else "glibc %d.%d" % self.glibc  # noqa: UP031
            raise ProtocolError(
                ErrorCode.UNSUPPORTED,
                f"clusterd's runtime needs a glibc-based Linux node; this one's C library is "
                f"{found}",
                "use an image based on glibc (Ubuntu, Debian, Amazon Linux, RHEL), not musl "
                "(Alpine)")
        tags = [f"manylinux_2_{minor}_{self.machine}" for minor in range(self.glibc[1], 4, -1)]
        legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
        tags += [f"{name}_{self.machine}" for minor, name in legacy.items()
                 if minor <= self.glibc[1]]
        return tags


# The manylinux floors uv's resolver can target (`--python-platform ARCH-manylinux_2_N`).
_UV_MANYLINUX = (40, 39, 38, 37, 36, 35, 34, 33, 32, 31, 28, 17)


def uv_platform(target: RuntimeTarget) -> str:
    """uv's `--python-platform` for `target`: the newest manylinux floor it knows that the
    node's glibc meets (so markers and wheels are chosen for the node, not this machine)."""
    target.platforms()  # refuses a target with no glibc
    assert target.glibc is not None
    floor = next((n for n in _UV_MANYLINUX if n <= target.glibc[1]), None)
    if floor is None:
        raise ProtocolError(ErrorCode.UNSUPPORTED,
                            f"the node's glibc 2.{target.glibc[1]} is older than any wheel "
                            "of the runtime's supports (2.17)",
                            "use an image from 2014 or later (any current Linux)")
    return f"{target.machine}-manylinux_2_{floor}"


def daemon_target() -> RuntimeTarget | None:
    """The target the daemon's own venv (the runtime's archive) is built for; None where the
    daemon is not on glibc Linux (a Mac's wheels are of no use to any node)."""
    if sys.platform != "linux":
        return None
    name, version = platform.libc_ver()
    return RuntimeTarget(f"{sys.version_info[0]}.{sys.version_info[1]}", platform.machine(),
                         _glibc(version) if name == "glibc" else None)


def _glibc(version: str) -> tuple[int, int] | None:
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return None


@dataclasses.dataclass(frozen=True)
class NodePlatform:
    """A node, as probed. `python` is None when it has no usable Python (`old` says which
    too old ones it has, for the message)."""

    machine: str
    glibc: tuple[int, int] | None
    has_zstd: bool
    python: str | None  # X.Y
    executable: str | None
    old: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> NodePlatform:
        """From probe_script's output; ProtocolError if it is not that."""
        fields: dict[str, str] = {}
        old: list[str] = []
        for line in text.splitlines():
            word, _, rest = line.strip().partition(" ")
            if word == "old":
                old.append(rest)
            elif word in ("machine", "zstd", "libc", "python") and word not in fields:
                fields[word] = rest
        if not {"machine", "zstd", "libc", "python"} <= set(fields):
            raise ProtocolError(ErrorCode.PROVIDER_ERROR,
                                f"cannot tell what the node is from its answer: {text[-300:]!r}")
        libc = fields["libc"].split()
        glibc = _glibc(libc[1]) if len(libc) == 2 and libc[0] == "glibc" else None
        python, executable = None, None
        if fields["python"] != "none":
            python, _, executable = fields["python"].partition(" ")
        return cls(fields["machine"], glibc, fields["zstd"] == "1", python, executable,
                   tuple(old))

    def target(self, python: str | None = None) -> RuntimeTarget:
        """The runtime this node runs (for `python`, X.Y, when it is to get that one)."""
        chosen = python or self.python
        assert chosen is not None
        return RuntimeTarget(chosen, self.machine, self.glibc)


def matches_daemon(target: RuntimeTarget, daemon: RuntimeTarget | None) -> bool:
    """Whether the daemon's own runtime archive runs on `target`: the same Python minor and
    CPU, and a glibc at least as new as the daemon's (its wheels were picked for it)."""
    return (daemon is not None and target.python == daemon.python
            and target.machine == daemon.machine and target.glibc is not None
            and daemon.glibc is not None and target.glibc >= daemon.glibc)
