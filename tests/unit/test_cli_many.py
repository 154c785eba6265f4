"""What a SkyPilot user types beyond launch/exec (issue 38): several clusters, globs and
--all; queue of every cluster; logs --status and --sync-down; jobs logs/cancel/queue options;
status --ip/--endpoints; show-gpus NAME:COUNT; check PROVIDER. Parsing and the pure helpers
here; each command against a real daemon in tests/e2e/test_cli_many_e2e.py."""

from __future__ import annotations

from typing import Any

import pytest

from clusterctl import _exit_codes, _lifecycle_cli, protocol
from clusterctl._endpoints import expand, head_ip
from clusterctl._fail import worse
from clusterctl._targets import resolve
from clusterctl._times import TimeError, parse_when, submitted_within
from clusterctl.cli import parse


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        parse(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


# -- several clusters -------------------------------------------------------------------------

@pytest.mark.parametrize("verb", ["stop", "start", "down", "autostop"])
def test_lifecycle_verbs_take_names_patterns_all_and_yes(verb: str) -> None:
    args = parse([verb, "a", "dev-*", "-y"])
    assert args.clusters == ["a", "dev-*"] and args.yes and not args.all
    assert parse([verb, "-a"]).all


@pytest.mark.parametrize("verb", ["stop", "start", "down", "autostop"])
def test_lifecycle_verbs_need_a_cluster_or_all(verb: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert "--all" in usage_error([verb], capsys)


def test_orphans_are_named_not_matched(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse(["down", "--orphan", "cd-x-1"]).orphan
    for words in (["-a"], ["cd-*"]):
        assert "name the orphans" in usage_error(["down", "--orphan", *words], capsys)


def view(name: str, status: str, managed: int | None = None) -> dict[str, Any]:
    found: dict[str, Any] = {"name": name, "status": status}
    if managed is not None:
        found["managed_job"] = managed
    return found


CLUSTERS = [view("dev-1", "UP"), view("dev-2", "STOPPED"), view("dev-3", "INIT"),
            view("prod", "UP"), view("mj-4-train", "UP", managed=4)]


def test_a_pattern_picks_what_the_verb_can_change() -> None:
    assert resolve("stop", ["dev-*"], False, CLUSTERS).names == ["dev-1", "dev-3"]
    assert resolve("start", ["dev-*"], False, CLUSTERS).names == ["dev-2", "dev-3"]
    assert resolve("down", ["dev-?"], False, CLUSTERS).names == ["dev-1", "dev-2", "dev-3"]
    assert resolve("autostop", ["*"], False, CLUSTERS).names == ["dev-1", "prod"]


def test_all_never_picks_a_managed_jobs_cluster_and_says_so() -> None:
    targets = resolve("down", [], True, CLUSTERS)
    assert targets.names == ["dev-1", "dev-2", "dev-3", "prod"]
    assert targets.skipped == ["mj-4-train"]


def test_names_pass_as_given_once_and_unmatched_patterns_are_kept() -> None:
    targets = resolve("stop", ["prod", "gone", "prod", "x-*", "dev-[12]"], False, CLUSTERS)
    assert targets.names == ["prod", "gone", "dev-1"]  # dev-2 is STOPPED already
    assert targets.unmatched == ["x-*"]


def test_the_worst_outcome_is_the_exit_code() -> None:
    ok, error, missing = _exit_codes.SUCCEEDED, _exit_codes.ERROR, _exit_codes.NOT_FOUND
    assert worse(ok, missing) == missing and worse(missing, ok) == missing
    assert worse(missing, error) == error and worse(error, missing) == error
    assert worse(ok, ok) == ok


def test_autostop_without_minutes_is_skypilots_five() -> None:
    args = parse(["autostop", "a", "b", "--down"])
    requests = _lifecycle_cli.requests_for(args, ["a", "b"])
    assert requests == [protocol.AutostopArgs(cluster=n, idle_minutes=5.0, down=True)
                        for n in ("a", "b")]
    cancel = _lifecycle_cli.requests_for(parse(["autostop", "a", "--cancel"]), ["a"])
    assert cancel == [protocol.AutostopArgs(cluster="a", cancel=True)]
    given = _lifecycle_cli.requests_for(parse(["autostop", "a", "-i", "30"]), ["a"])
    assert given[0].idle_minutes == 30  # type: ignore[attr-defined]


def test_several_clusters_are_listed_and_asked_for(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    asked: list[str] = []
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda q: asked.append(q) or "n")
    with pytest.raises(SystemExit) as exit_:
        _lifecycle_cli.ask(parse(["start", "dev-*"]), ["dev-2", "dev-3"], True)
    assert exit_.value.code == _exit_codes.ERROR and "aborted" in capsys.readouterr().err
    assert asked == ["Starting 2 clusters:\n  dev-2\n  dev-3\nProceed? [Y/n] "]
    asked.clear()
    _lifecycle_cli.ask(parse(["start", "one"]), ["one"], False)  # one start: not asked
    _lifecycle_cli.ask(parse(["start", "-y", "a", "b"]), ["a", "b"], False)  # -y
    assert asked == []
    with pytest.raises(SystemExit):
        _lifecycle_cli.ask(parse(["stop", "one"]), ["one"], False)  # stop asks, as it did
    assert asked == ["Stopping 1 cluster:\n  one\nProceed? [Y/n] "]


# -- queue, logs ------------------------------------------------------------------------------

def test_queue_takes_no_cluster_or_several() -> None:
    assert parse(["queue"]).clusters == []
    assert parse(["queue", "a", "b", "-s"]).clusters == ["a", "b"]


def test_logs_status_and_sync_down(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(["logs", "--status", "dev", "3"])
    assert args.status and args.job_id == 3 and args.job_ids == [3]
    args = parse(["logs", "-s", "dev", "3", "4", "out/logs"])
    assert args.sync_down and args.job_ids == [3, 4] and args.sync_dir == "out/logs"
    args = parse(["logs", "--sync-down", "dev"])
    assert args.job_ids == [] and args.job_id is None and args.sync_dir is None
    assert parse(["logs", "dev"]).job_id is None
    assert "one job at a time" in usage_error(["logs", "dev", "3", "4"], capsys)
    assert "not 'x'" in usage_error(["logs", "dev", "x"], capsys)
    assert "not both" in usage_error(["logs", "--status", "-s", "dev"], capsys)


def test_logs_status_picks_the_job_or_the_latest(capsys: pytest.CaptureFixture[str]) -> None:
    from clusterctl._logs_cli import pick_job

    jobs = [{"job_id": 2, "status": "FAILED"}, {"job_id": 10, "status": "RUNNING"}]
    assert pick_job(jobs, None, "dev")["job_id"] == 10
    assert pick_job(jobs, 2, "dev")["status"] == "FAILED"
    with pytest.raises(SystemExit) as exit_:
        pick_job(jobs, 3, "dev")
    assert exit_.value.code == _exit_codes.NOT_FOUND
    assert "no job 3" in capsys.readouterr().err


# -- status --ip / --endpoints ----------------------------------------------------------------

def test_status_ip_and_endpoints_take_one_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse(["status", "--ip", "dev"]).ip
    assert parse(["status", "--endpoint", "8080", "dev"]).endpoint == 8080
    assert "takes one cluster" in usage_error(["status", "--endpoints"], capsys)
    assert "takes one cluster" in usage_error(["status", "--ip", "a", "b"], capsys)
    assert "not allowed with" in usage_error(["status", "--ip", "--endpoints", "a"], capsys)
    assert "65535" in usage_error(["status", "--endpoint", "0", "a"], capsys)


def test_ports_expand_and_the_head_is_reached_from_outside() -> None:
    assert expand(["8080", 9000, "7000-7002", "8080"]) == [8080, 9000, 7000, 7001, 7002]
    nodes = [{"role": "worker", "internal_ip": "10.0.0.2"},
             {"role": "head", "internal_ip": "10.0.0.1", "external_ip": None}]
    assert head_ip(nodes, "dev") == "10.0.0.1"
    nodes[1]["external_ip"] = "3.4.5.6"
    assert head_ip(nodes, "dev") == "3.4.5.6"


# -- managed jobs -----------------------------------------------------------------------------

def test_jobs_logs_without_an_id_is_the_newest() -> None:
    from clusterctl._jobs_cli import logs_request

    assert logs_request(parse(["jobs", "logs"])) == protocol.JobsLogsArgs(job_id=None)
    assert protocol.parse_args(protocol.JobsLogsArgs, {}).job_id is None


def test_jobs_cancel_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse(["jobs", "cancel", "-n", "train"]).cancel_name == "train"
    assert "without ids" in usage_error(["jobs", "cancel", "-n", "x", "3"], capsys)
    assert "without ids" in usage_error(["jobs", "cancel", "--name", "x", "-a"], capsys)


def test_jobs_queue_skip_finished_and_windows(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(["jobs", "queue", "-s", "--since", "2h", "--until", "2026-12-06 10:00"])
    assert args.skip_finished and args.since == "2h"
    assert "not allowed with" in usage_error(["jobs", "queue", "-s", "--all"], capsys)
    assert "neither a time ago" in usage_error(["jobs", "queue", "--since", "lately"], capsys)


def test_times_ago_and_dates() -> None:
    now = 1_000_000.0
    assert parse_when("90s", now) == now - 90
    assert parse_when("1h30m", now) == now - 5400
    assert parse_when("2d", now) == now - 2 * 86400 and parse_when("1W", now) == now - 604800
    import datetime

    assert parse_when("2026-12-06 10:00", now) == datetime.datetime(2026, 12, 6, 10).timestamp()
    with pytest.raises(TimeError):
        parse_when("3 hours", now)
    jobs = [{"job_id": i, "submitted_at": now - i * 3600} for i in (1, 2, 3)]
    assert [j["job_id"] for j in submitted_within(jobs, "2h30m", None, now)] == [1, 2]
    assert [j["job_id"] for j in submitted_within(jobs, "2h30m", "1h30m", now)] == [2]
    assert [j["job_id"] for j in submitted_within(jobs, None, "1h30m", now)] == [2, 3]


# -- show-gpus, check -------------------------------------------------------------------------

def test_show_gpus_name_and_count(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(["show-gpus", "A100:8"])
    assert (args.name, args.count) == ("A100", 8.0)
    args = parse(["show-gpus", "A100"])
    assert (args.name, args.count) == ("A100", None)
    assert "a number" in usage_error(["show-gpus", "A100:x"], capsys)
    assert "above 0" in usage_error(["show-gpus", "A100:0"], capsys)
    assert "NAME:COUNT" in usage_error(["show-gpus", ":8"], capsys)


def test_check_takes_providers() -> None:
    assert parse(["check", "local", "ssh"]).providers == ["local", "ssh"]
    assert parse(["check"]).providers == []
