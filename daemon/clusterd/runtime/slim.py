"""Ray's wheel without the libraries a node of ours never runs, made once per wheelhouse.

The runtime's Ray runs the cluster (GCS, raylets, their agents) and the agent's gang
scheduling, nothing else: jobs are shell commands in the user's own environment, never
Python in the runtime's venv. Yet 90 of the 240 MB Ray unpacks to are its Java jars, its
libraries (Data, Train, Tune, Serve, RLlib, LLM) and the dashboard's web client, which is
off (`--include-dashboard=false`). Each node got them all: sent over SSH, unzipped, and their
modules compiled into the bytecode archive. Ray core imports none of them (its dashboard
modules for them import them only when asked, its scripts only for their own verbs, and it
looks for the jars before starting Java workers), so the wheelhouse carries a Ray wheel
without them.

The wheel keeps its name and version; its RECORD lists what it holds. Like every wheel in the
wheelhouse, it is pinned by the digest recorded when the wheelhouse was built (not PyPI's),
and nodes check it against that.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import zipfile
from pathlib import Path, PurePosixPath

# Top-level parts of the `ray` package no node of ours imports.
UNUSED = ("jars", "data", "train", "tune", "serve", "rllib", "llm", "dashboard/client")
# Their command lines (Ray's own `ray` stays).
UNUSED_SCRIPTS = ("serve", "tune")


def is_ray_wheel(name: str) -> bool:
    return name.startswith("ray-") and name.endswith(".whl")


def _unused(name: str) -> bool:
    return any(name == f"ray/{part}" or name.startswith(f"ray/{part}/") for part in UNUSED)


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


def _entry_points(text: str) -> str:
    """entry_points.txt without the scripts of the libraries left out."""
    kept, section = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("["):
            section = stripped
        elif section == "[console_scripts]" and stripped.split("=")[0].strip() in UNUSED_SCRIPTS:
            continue
        kept.append(line)
    return "\n".join(kept) + "\n"


def slim_ray_wheel(wheel: Path) -> tuple[int, int]:
    """Rewrite Ray's `wheel` in place without the UNUSED parts. Returns its size before and
    after. Blocking, and a few seconds of CPU (zipfile decompresses and compresses each kept
    member again), once per wheelhouse."""
    before = wheel.stat().st_size
    partial = wheel.with_name(wheel.name + ".part")
    changed: dict[str, bytes] = {}
    with zipfile.ZipFile(wheel) as source:
        members = source.infolist()
        record_name = next(m.filename for m in members
                           if PurePosixPath(m.filename).parts[0].endswith(".dist-info")
                           and m.filename.endswith("/RECORD"))
        dist_info = record_name.rsplit("/", 1)[0]
        entry_points = f"{dist_info}/entry_points.txt"
        if entry_points in source.namelist():
            changed[entry_points] = _entry_points(source.read(entry_points).decode()).encode()
        kept = [m for m in members if not _unused(m.filename) and m.filename != record_name]
        rows = []
        for row in csv.reader(io.StringIO(source.read(record_name).decode())):
            if not row or _unused(row[0]):
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
