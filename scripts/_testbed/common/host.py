"""What both beds change on the machine the same way: a network namespace of their own (with
only `lo`), and a registry of their live beds in /run/clusterd-testbed/KIND (several beds may
be up at once, with other --dir/--netns; what they share goes when the last one does). Each
bed knows the other's registry, so neither takes a namespace the other uses. Standard library
only."""

from __future__ import annotations

import contextlib
import json
import os
import re

from _testbed.common import Failure, read_text, run, write_file

# ---------------------------------------------------------------------------- namespace

NETNS_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$")  # a --netns either bed takes


def netns_exists(name: str) -> bool:
    return os.path.exists(os.path.join("/run/netns", name))


def create_netns(name: str) -> None:
    """A network namespace with only `lo`, up (so 127.0.0.0/8 works in it)."""
    if not netns_exists(name):
        run(["ip", "netns", "add", name])
    run(["ip", "-n", name, "link", "set", "lo", "up"])
    links = run(["ip", "-n", name, "-o", "link", "show"]).stdout
    names = [ln.split(":")[1].strip().split("@")[0] for ln in links.splitlines() if ":" in ln]
    if names != ["lo"]:
        raise Failure(f"network namespace {name} has interfaces {names}, not only lo; "
                      f"refusing to use it", hint=f"ip netns del {name}, or use another --netns")


def netns_pids(name: str) -> list[int]:
    if not netns_exists(name):
        return []
    p = run(["ip", "netns", "pids", name], check=False)
    return [int(x) for x in p.stdout.split() if x.isdigit()]


def delete_netns(name: str) -> None:
    if netns_exists(name):
        run(["ip", "netns", "del", name])


def mounts_under(path: str) -> list[str]:
    """Mount points at or below path in this mount namespace (rmtree must not walk into one)."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].encode().decode("unicode_escape")
            if mp == path or mp.startswith(path.rstrip("/") + "/"):
                out.append(mp)
    return out


# ---------------------------------------------------------------------------- registries


class BedRegistry:
    """One NETNS.json ({"dir", "netns"}) per live bed of a kind, in `directory`; files named
    in `others` are that kind's own (not beds)."""

    def __init__(self, directory: str, others: tuple[str, ...] = ()) -> None:
        self.directory = directory
        self._others = others

    def ensure_dir(self) -> str:
        os.makedirs(self.directory, mode=0o755, exist_ok=True)
        return self.directory

    def register(self, bed_dir: str, netns: str) -> None:
        write_file(os.path.join(self.ensure_dir(), f"{netns}.json"),
                   json.dumps({"dir": bed_dir, "netns": netns}) + "\n", 0o644)

    def unregister(self, netns: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.directory, f"{netns}.json"))

    def live_beds(self) -> dict[str, str]:
        """{netns: dir} of the beds whose directory still has a state file naming that
        namespace (entries of beds that went away without `down` are dropped)."""
        out: dict[str, str] = {}
        try:
            names = [n for n in os.listdir(self.directory)
                     if n.endswith(".json") and n not in self._others]
        except FileNotFoundError:
            return out
        for name in names:
            path = os.path.join(self.directory, name)
            try:
                entry = json.loads(read_text(path) or "")
                state = json.loads(read_text(os.path.join(entry["dir"], "state.json")) or "")
                if state.get("netns") == entry["netns"] == name[:-5]:
                    out[entry["netns"]] = entry["dir"]
                    continue
            except (ValueError, KeyError, TypeError, OSError):
                pass
            if not netns_exists(name[:-5]):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        return out

    def registered_netns(self, bed_dir: str) -> str | None:
        """The namespace registered for the bed in bed_dir (even one whose state file is
        gone)."""
        try:
            names = sorted(n for n in os.listdir(self.directory) if n not in self._others)
        except FileNotFoundError:
            return None
        for name in names:
            with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
                entry = json.loads(read_text(os.path.join(self.directory, name)) or "")
                if entry.get("dir") == bed_dir:
                    return str(entry["netns"])
        return None


# The kernel settings the Kubernetes bed saves live beside its registry (k8s/host.py).
K8S_SAVED_SETTINGS = "kernel-settings.json"
EC2_BEDS = BedRegistry("/run/clusterd-testbed/ec2")
K8S_BEDS = BedRegistry("/run/clusterd-testbed/k8s", others=(K8S_SAVED_SETTINGS,))
