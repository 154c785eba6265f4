"""Wheels without what a node of ours never runs, made once per wheelhouse.

The runtime's Ray runs the cluster (GCS, raylets, their agents) and the agent's gang
scheduling, nothing else: jobs are shell commands in the user's own environment, never
Python in the runtime's venv. Yet 90 of the 240 MB Ray unpacks to are its Java jars, its
libraries (Data, Train, Tune, Serve, RLlib, LLM) and the dashboard's web client, which is
off (`--include-dashboard=false`). Ray core imports none of them (its dashboard modules for
them import them only when asked, its scripts only for their own verbs, and it looks for the
jars before starting Java workers). botocore, which a node uses only to copy buckets (S3) and
to find its credentials (STS, SSO, sign-in), carries the API models of all 400-odd AWS
services: 27 of its 31 MB. Each node got them all: sent over SSH, unzipped, and their modules
compiled into the bytecode archive. So the wheelhouse carries these two wheels without them.

A slimmed wheel keeps its name and version; its RECORD lists what it holds. Like every wheel
in the wheelhouse, it is pinned by the digest recorded when the wheelhouse was built (not
PyPI's), and nodes check it against that.
"""

from __future__ import annotations

import base64
import csv
import dataclasses
import hashlib
import io
import os
import zipfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

# Top-level parts of the `ray` package no node of ours imports.
RAY_UNUSED = ("jars", "data", "train", "tune", "serve", "rllib", "llm", "dashboard/client")
# The AWS services whose models a node's botocore loads: S3 for bucket copies, and those its
# credential providers call (assume-role and web identity: STS; SSO: SSO and SSO-OIDC; the
# console sign-in provider: signin).
BOTOCORE_SERVICES = ("s3", "sts", "sso", "sso-oidc", "signin")


def _ray_unused(name: str) -> bool:
    return any(name == f"ray/{part}" or name.startswith(f"ray/{part}/") for part in RAY_UNUSED)


def _botocore_unused(name: str) -> bool:
    # botocore/data/SERVICE/...: a service's models; files right under data/ (endpoints,
    # partitions, retry rules, defaults) are for every service, and stay.
    parts = name.split("/")
    return len(parts) > 3 and parts[:2] == ["botocore", "data"] and (
        parts[2] not in BOTOCORE_SERVICES)


@dataclasses.dataclass(frozen=True)
class Slimming:
    unused: Callable[[str], bool]  # a member's path in the wheel: left out?
    unused_scripts: tuple[str, ...] = ()  # console scripts of what is left out


SLIMMINGS = {
    "ray": Slimming(_ray_unused, ("serve", "tune")),  # Ray's own `ray` stays
    "botocore": Slimming(_botocore_unused),
}


def slimming_for(wheel_name: str) -> Slimming | None:
    """How the wheel named so is slimmed; None: it is shipped whole."""
    if not wheel_name.endswith(".whl"):
        return None
    return SLIMMINGS.get(wheel_name.split("-", 1)[0].lower())


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


def _entry_points(text: str, unused_scripts: tuple[str, ...]) -> str:
    """entry_points.txt without the scripts of the parts left out."""
    kept, section = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("["):
            section = stripped
        elif section == "[console_scripts]" and stripped.split("=")[0].strip() in unused_scripts:
            continue
        kept.append(line)
    return "\n".join(kept) + "\n"


def slim_wheel(wheel: Path, slimming: Slimming) -> tuple[int, int]:
    """Rewrite `wheel` in place without what `slimming` leaves out. Returns its size before
    and after. Blocking, and a few seconds of CPU (zipfile decompresses and compresses each
    kept member again), once per wheelhouse."""
    before = wheel.stat().st_size
    partial = wheel.with_name(wheel.name + ".part")
    changed: dict[str, bytes] = {}
    with zipfile.ZipFile(wheel) as source:
        members = source.infolist()
        record_name = next(m.filename for m in members
                           if PurePosixPath(m.filename).parts[0].endswith(".dist-info")
                           and m.filename.endswith("/RECORD") and m.filename.count("/") == 1)
        dist_info = record_name.rsplit("/", 1)[0]
        entry_points = f"{dist_info}/entry_points.txt"
        if slimming.unused_scripts and entry_points in source.namelist():
            changed[entry_points] = _entry_points(source.read(entry_points).decode(),
                                                  slimming.unused_scripts).encode()
        kept = [m for m in members
                if not slimming.unused(m.filename) and m.filename != record_name]
        rows = []
        for row in csv.reader(io.StringIO(source.read(record_name).decode())):
            if not row or slimming.unused(row[0]):
                continue
            if row[0] in changed:
                row = [row[0], _record_hash(changed[row[0]]), str(len(changed[row[0]]))]
            rows.append(row)
        record = io.StringIO()
        csv.writer(record, lineterminator="\n").writerows(rows)
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as target:
            for member in kept:
                if member.filename in changed:
                    target.writestr(member, changed[member.filename])
                else:
                    with source.open(member) as raw, target.open(member, "w") as out:
                        while block := raw.read(1 << 20):
                            out.write(block)
            target.writestr(record_name, record.getvalue())
    os.replace(partial, wheel)
    return before, wheel.stat().st_size
