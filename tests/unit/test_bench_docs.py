"""docs/benchmarks.md as `scripts/bench --write-docs` writes it (scripts/bench_docs.py): a run
of a few benchmarks updates their rows and keeps the others', each row naming its run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_docs


def row(name: str, value: float, **extra: object) -> dict[str, object]:
    return {"name": name, "value": value, "unit": "ms", "target": "≤ 60 ms", "ok": value <= 60,
            "baseline": 40.0, "baseline_name": "python -c pass", "ratio": value / 40, **extra}


def test_a_partial_run_updates_its_rows_and_keeps_the_others(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    times = iter(["2026-12-01T00:00:00Z", "2026-12-02T00:00:00Z"])
    real = bench_docs.machine
    monkeypatch.setattr(bench_docs, "machine", lambda: {**real(), "time": next(times)})
    chart = tmp_path / "status_latency.png"
    chart.write_bytes(b"\x89PNG fake bytes are fine: the page only links it")
    docs = tmp_path / "docs"
    bench_docs.write([row("status_wall_p50", 70.0), row("queue_200_jobs_p50", 90.0)], [],
                     docs)
    page = bench_docs.write([row("status_wall_p50", 55.0, p90=61.0)], [chart], docs)

    records = json.loads((docs / "benchmarks.json").read_text())
    assert records["rows"]["status_wall_p50"]["value"] == 55.0
    assert records["rows"]["status_wall_p50"]["run"] == "2026-12-02T00:00:00Z"
    assert records["rows"]["queue_200_jobs_p50"]["run"] == "2026-12-01T00:00:00Z"
    assert set(records["runs"]) == {"2026-12-01T00:00:00Z", "2026-12-02T00:00:00Z"}
    text = page.read_text()
    assert "| status_wall_p50 | 55 ms | 40 ms (python -c pass) | 1.38 | ≤ 60 ms ✓ |" in text
    assert "| queue_200_jobs_p50 | 90 ms |" in text and "✗ missed" in text
    assert "p90=61.0" in text
    assert "![status_latency](benchmarks/status_latency.png)" in text
    assert (docs / "benchmarks" / "status_latency.png").read_bytes() == chart.read_bytes()


def test_a_run_no_row_names_any_more_is_dropped(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    times = iter(["2026-12-01T00:00:00Z", "2026-12-02T00:00:00Z"])
    real = bench_docs.machine
    monkeypatch.setattr(bench_docs, "machine", lambda: {**real(), "time": next(times)})
    bench_docs.write([row("status_wall_p50", 70.0)], [], tmp_path)
    bench_docs.write([row("status_wall_p50", 50.0)], [], tmp_path)
    records = json.loads((tmp_path / "benchmarks.json").read_text())
    assert list(records["runs"]) == ["2026-12-02T00:00:00Z"]
    assert "2026-12-01" not in (tmp_path / "benchmarks.md").read_text()


def test_notes_say_how_rows_were_measured_and_outlive_runs(tmp_path: Path) -> None:
    bench_docs.write([row("cost_report_p50", 90.0)], [], tmp_path,
                     notes={"cost_": "a daemon on 10,000 clusters of history"})
    page = bench_docs.write([row("status_wall_p50", 50.0)], [], tmp_path)
    text = page.read_text()
    assert "## How measured" in text
    assert "`cost_*`: a daemon on 10,000 clusters of history" in text
