"""Plain-text output helpers of clusterctl (clusterctl._render)."""

from __future__ import annotations

import time

import pytest

from clusterctl._render import PhaseClock, Printer, age, table


def test_table_aligns_columns_to_the_widest_cell() -> None:
    text = table(
        ["NAME", "STATUS", "NODES"], [["dev", "UP", "1"], ["my-long-name", "STOPPED", "12"]]
    )
    assert text == (
        "NAME          STATUS   NODES\n"
        "dev           UP       1\n"
        "my-long-name  STOPPED  12\n"
    )


def test_table_strips_trailing_spaces_and_stringifies_cells() -> None:
    text = table(["A", "LONG HEADER"], [[1, ""], [22, "x"]])  # type: ignore[list-item]
    assert text.splitlines() == ["A   LONG HEADER", "1", "22  x"]
    assert text.endswith("\n")


def test_table_with_no_rows_is_just_the_header() -> None:
    assert table(["NAME", "STATUS"], []) == "NAME  STATUS\n"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s ago"),
        (42, "42s ago"),
        (60, "1m ago"),
        (119, "1m ago"),
        (3599, "59m ago"),
        (3600, "1h ago"),
        (86399, "23h ago"),
        (86400, "1d ago"),
        (3 * 86400 + 5, "3d ago"),
    ],
)
def test_age_units(seconds: float, text: str) -> None:
    assert age(1_000_000.0, until=1_000_000.0 + seconds) == text


def test_age_no_timestamp_and_suffix_and_future() -> None:
    assert age(None) == "-"
    assert age(0) == "-"
    assert age(100.0, until=190.0, suffix="") == "1m"
    assert age(200.0, until=100.0) == "0s ago"  # clock skew never shows negative ages


def test_age_defaults_to_now() -> None:
    assert age(time.time() - 7200) == "2h ago"


def test_age_never_shows_sixty_seconds() -> None:
    assert age(1000.0, until=1059.7) in ("59s ago", "1m ago")


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_phase_clock_times_each_phase_until_the_next_and_the_last_until_stop() -> None:
    clock = FakeClock()
    phases = PhaseClock(clock)
    for phase, elapsed in (("placement", 0.0), ("provision", 0.1), ("ssh", 1.2),
                           ("provision", 1.5), ("install", 1.9), ("warning", 2.0),
                           ("ray", 3.0)):
        phases.mark(phase, elapsed)
    clock.now += 0.5  # the job is submitted half a second after the last progress line
    phases.stop()
    clock.now += 60  # the job's own run: not a phase
    phases.mark("agent", 99.0)  # nothing counts after stop
    totals = phases.totals()
    assert list(totals) == ["placement", "provision", "install", "ray"]
    assert [round(s, 2) for s in totals.values()] == [0.1, 1.8, 1.1, 0.5]
    assert phases.summary() == ("phases: placement 0.1s, provision 1.8s, install 1.1s, "
                                "ray 0.5s (total 3.5s)")


def test_phase_clock_sums_a_phase_that_comes_back_and_says_nothing_without_phases() -> None:
    clock = FakeClock()
    phases = PhaseClock(clock)
    assert phases.summary() is None
    for phase, elapsed in (("provision", 0.0), ("retry", 2.0), ("provision", 3.0)):
        phases.mark(phase, elapsed)
    clock.now += 1.0
    assert {k: round(v, 2) for k, v in phases.totals().items()} == {"provision": 3.0,
                                                                   "retry": 1.0}


@pytest.mark.parametrize("verbose", [False, True])
def test_printer_names_phases_and_sums_them_only_when_verbose(
        verbose: bool, capsys: pytest.CaptureFixture[str]) -> None:
    printer = Printer(verbose)
    state: dict[str, object] = {}
    printer.event("progress", {"phase": "ray", "message": "starting Ray", "elapsed": 0.5}, state)
    printer.event("progress", {"phase": "ssh", "message": "first contact", "elapsed": 0.6},
                  state)
    printer.event("job", {"job_id": 3, "cluster": "c"}, state)
    printer.phases()  # said once: at the job, not again at the end
    lines = capsys.readouterr().err.splitlines()
    if verbose:
        assert lines[0] == "[   0.5s] ray        starting Ray"
        assert lines[1] == "[   0.6s]            first contact"
        assert lines[2] == "Job 3 submitted to c."
        assert lines[3].startswith("phases: ray ") and len(lines) == 4
    else:
        assert lines == ["[   0.5s] starting Ray", "[   0.6s] first contact",
                         "Job 3 submitted to c."]
