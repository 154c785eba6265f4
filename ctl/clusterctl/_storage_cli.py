"""`clusterctl storage ...`: the buckets clusterd made for tasks' `file_mounts` (never any
other bucket). Imported only when that verb runs."""

from __future__ import annotations

import sys

from clusterctl import _exit_codes, protocol
from clusterctl._render import age, table
from clusterctl._task_options import print_json
from clusterctl.client import Client

TYPE_CHECKING = False  # typing, for the type checker alone
if TYPE_CHECKING:
    import argparse


def add_options(storage: argparse.ArgumentParser) -> None:
    actions = storage.add_subparsers(dest="storage_action", metavar="ACTION")
    actions.required = True
    ls = actions.add_parser("ls", help="buckets clusterd made, their size and users")
    ls.add_argument("--json", action="store_true")
    delete = actions.add_parser("delete", help="delete a bucket clusterd made, and all in it")
    delete.add_argument("name")


def size(count: int | None) -> str:
    if count is None:
        return "?"
    if count < 1000:
        return f"{count} B"
    value = float(count)
    for unit in ("KB", "MB", "GB", "TB"):
        value /= 1000
        if value < 1000 or unit == "TB":
            break
    return f"{value:.1f} {unit}"


def main(client: Client, args: argparse.Namespace) -> int:
    if args.storage_action == "delete":
        client.call(protocol.StorageDeleteArgs(name=args.name))
        sys.stderr.write(f"Bucket {args.name} deleted.\n")
        return _exit_codes.SUCCEEDED
    result = client.call(protocol.StorageLsArgs())
    buckets = result.get("buckets", [])
    if args.json:
        print_json(buckets)
        return _exit_codes.SUCCEEDED
    if not buckets:
        sys.stderr.write("No buckets made by clusterd.\n")
        return _exit_codes.SUCCEEDED
    rows = [[b["name"], b["region"], "-" if b["objects"] is None else str(b["objects"]),
             size(b["bytes"]), "yes" if b["persistent"] else "no (deleted with its cluster)",
             ", ".join(b["clusters"]) or "-", age(b["created_at"])] for b in buckets]
    sys.stdout.write(table(["NAME", "REGION", "OBJECTS", "SIZE", "PERSISTENT", "USED BY",
                            "CREATED"], rows))
    return _exit_codes.SUCCEEDED
