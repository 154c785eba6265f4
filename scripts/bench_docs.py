"""docs/benchmarks.md, written by `scripts/bench --write-docs` from what a run measured.

Rows are kept in docs/benchmarks.json, each with the run that measured it (date, machine), so
a run of a few benchmarks (`--only`) updates those rows and keeps the others; the page is
made again from all of them. Charts a run drew (PNG files in its output directory) are copied
beside the page and shown under the table.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import time
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGE = "benchmarks.md"
RECORDS = "benchmarks.json"
CHARTS = "benchmarks"  # the charts' directory, beside the page


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    memory_gib = 0.0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    memory_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), "")
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu_model": model, "memory_gib": memory_gib,
            "kernel": platform.release(), "python": platform.python_version(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def write(rows: list[dict[str, Any]], charts: list[Path], docs: Path = DOCS,
          notes: dict[str, str] | None = None) -> Path:
    """Merge this run's rows (and its notes: how the rows named PREFIX* were measured) into
    the records, copy its charts, and write the page again."""
    docs.mkdir(parents=True, exist_ok=True)
    records_path = docs / RECORDS
    records: dict[str, Any] = {"runs": {}, "rows": {}}
    if records_path.exists():
        records = json.loads(records_path.read_text())
    run = machine()
    run_id = run["time"]
    records["runs"][run_id] = run
    for row in rows:
        records["rows"][row["name"]] = {**row, "run": run_id}
    records.setdefault("notes", {}).update(notes or {})
    chart_dir = docs / CHARTS
    for chart in charts:
        chart_dir.mkdir(exist_ok=True)
        shutil.copyfile(chart, chart_dir / chart.name)
    used = {row["run"] for row in records["rows"].values()}
    records["runs"] = {k: v for k, v in records["runs"].items() if k in used}
    records_path.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
    page = docs / PAGE
    page.write_text(render(records, sorted(chart_dir.glob("*.png")) if chart_dir.is_dir()
                           else [], docs))
    return page


def render(records: dict[str, Any], charts: list[Path], docs: Path) -> str:
    runs = records["runs"]
    lines = [
        "# Benchmarks",
        "",
        "Written by `scripts/bench --write-docs` (do not edit by hand). Every number is "
        "measured beside a baseline in the same run, on a shared and noisy machine: compare "
        "the ratios, not the absolute times. Each row names the run that measured it.",
        "",
        "## Runs",
        "",
        "| run | CPUs | CPU | memory | kernel | Python |",
        "|---|---|---|---|---|---|",
    ]
    for run_id, run in sorted(runs.items()):
        lines.append(f"| {run_id} | {run['cpus']} | {run['cpu_model'] or '-'} | "
                     f"{run['memory_gib']} GiB | {run['kernel']} | {run['python']} |")
    lines += ["", "## Results", "",
              "| benchmark | value | baseline | ratio | target | run | details |",
              "|---|---|---|---|---|---|---|"]
    for name, row in sorted(records["rows"].items()):
        base = "-" if row.get("baseline") is None else \
            f"{row['baseline']:g} {row['unit']} ({row.get('baseline_name') or 'baseline'})"
        ratio = "-" if row.get("ratio") is None else f"{row['ratio']:.2f}"
        target = row.get("target") or "-"
        if row.get("ok") is not None:
            target += " ✓" if row["ok"] else " ✗ missed"
        skip = {"name", "value", "unit", "baseline", "baseline_name", "ratio", "target",
                "ok", "run"}
        details = ", ".join(f"{k}={v}" for k, v in row.items() if k not in skip)
        lines.append(f"| {name} | {row['value']:g} {row['unit']} | {base} | {ratio} | "
                     f"{target} | {row['run']} | {details.replace('|', '/')} |")
    if records.get("notes"):
        lines += ["", "## How measured", ""]
        for prefix, text in sorted(records["notes"].items()):
            lines += [f"`{prefix}*`: {text}", ""]
    if charts:
        lines += ["", "## Cost curves", ""]
        for chart in charts:
            lines += [f"![{chart.stem}]({chart.relative_to(docs).as_posix()})", ""]
    return "\n".join(lines) + "\n"
