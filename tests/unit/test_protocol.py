"""The wire protocol: framing, argument validation and job exit codes."""

from __future__ import annotations

import msgpack
import pytest

from clusterctl import protocol
from clusterctl.protocol import (
    HEADER,
    MAX_FRAME_BYTES,
    CancelArgs,
    ErrorCode,
    ExitCode,
    FrameDecoder,
    JobStatus,
    LaunchArgs,
    LogsArgs,
    PingArgs,
    ProtocolError,
    QueueArgs,
    StatusArgs,
    encode_frame,
    exit_code_for_job,
    parse_args,
)

# --------------------------------------------------------------------------------------------
# Framing


def test_encode_frame_is_big_endian_length_then_msgpack_body() -> None:
    message = {"type": "hello", "protocol": 1, "client": "t"}
    frame = encode_frame(message)
    body = msgpack.packb(message, use_bin_type=True)
    assert frame[:4] == len(body).to_bytes(4, "big")
    assert frame[4:] == body


def test_decoder_waits_for_header_and_body_byte_by_byte() -> None:
    message = {"type": "request", "id": 7, "op": "ping", "args": {"blob": b"\x00\xff"}}
    frame = encode_frame(message)
    decoder = FrameDecoder()
    for byte in frame[:-1]:
        decoder.feed(bytes([byte]))
        assert decoder.next_message() is None
    decoder.feed(frame[-1:])
    assert decoder.next_message() == message
    assert decoder.buffered == 0
    assert decoder.next_message() is None


def test_decoder_returns_several_frames_from_one_feed_in_order() -> None:
    messages = [{"type": "event", "id": i, "event": "log", "data": {"n": i}} for i in range(3)]
    partial = encode_frame({"type": "reply", "id": 9, "ok": True, "result": {}})
    decoder = FrameDecoder()
    decoder.feed(b"".join(encode_frame(m) for m in messages) + partial[:6])
    assert list(decoder.drain()) == messages
    # The partial fourth frame stays buffered until the rest arrives.
    assert decoder.buffered == 6
    decoder.feed(partial[6:])
    assert list(decoder.drain()) == [{"type": "reply", "id": 9, "ok": True, "result": {}}]


def test_decoder_rejects_oversized_frame_from_header_alone() -> None:
    decoder = FrameDecoder()
    decoder.feed(HEADER.pack(MAX_FRAME_BYTES + 1))  # no body bytes at all
    with pytest.raises(ProtocolError) as info:
        decoder.next_message()
    assert info.value.code == ErrorCode.FRAME_TOO_LARGE
    assert str(MAX_FRAME_BYTES + 1) in info.value.message
    assert info.value.hint


def test_decoder_accepts_frame_exactly_at_custom_limit_and_rejects_one_more() -> None:
    body = msgpack.packb({"k": "x" * 20})
    ok = FrameDecoder(max_frame_bytes=len(body))
    ok.feed(HEADER.pack(len(body)) + body)
    assert ok.next_message() == {"k": "x" * 20}

    too_small = FrameDecoder(max_frame_bytes=len(body) - 1)
    too_small.feed(HEADER.pack(len(body)))
    with pytest.raises(ProtocolError) as info:
        too_small.next_message()
    assert info.value.code == ErrorCode.FRAME_TOO_LARGE


def test_encode_frame_refuses_body_over_limit() -> None:
    with pytest.raises(ProtocolError) as info:
        encode_frame({"data": b"x" * (MAX_FRAME_BYTES + 1)})
    assert info.value.code == ErrorCode.FRAME_TOO_LARGE


@pytest.mark.parametrize(
    ("value", "kind"),
    [([1, 2], "list"), ("hello", "str"), (5, "int"), (None, "NoneType")],
)
def test_decoder_rejects_body_that_is_not_a_map(value: object, kind: str) -> None:
    body = msgpack.packb(value)
    decoder = FrameDecoder()
    decoder.feed(HEADER.pack(len(body)) + body)
    with pytest.raises(ProtocolError) as info:
        decoder.next_message()
    assert info.value.code == ErrorCode.BAD_FRAME
    assert info.value.message == f"frame must be a msgpack map, got {kind}"


@pytest.mark.parametrize(
    "body",
    [
        b"\xc1",  # a byte msgpack never uses
        b"\x81\xa1a",  # a map of one entry, cut off before its value
        b"\x80\x80",  # a whole map followed by extra data
        msgpack.packb({1: "int key"}),  # strict_map_key: only str/bytes keys
    ],
)
def test_decoder_rejects_invalid_msgpack(body: bytes) -> None:
    decoder = FrameDecoder()
    decoder.feed(HEADER.pack(len(body)) + body)
    with pytest.raises(ProtocolError) as info:
        decoder.next_message()
    assert info.value.code == ErrorCode.BAD_FRAME
    assert info.value.message.startswith("frame is not valid msgpack: ")


def test_protocol_error_to_wire() -> None:
    error = ProtocolError(ErrorCode.JOB_NOT_FOUND, "job 3 does not exist", "see queue")
    assert error.to_wire() == {
        "code": "JOB_NOT_FOUND", "message": "job 3 does not exist", "hint": "see queue",
    }
    assert protocol.reply_error(4, error) == {
        "type": "reply", "id": 4, "ok": False, "error": error.to_wire(),
    }


# --------------------------------------------------------------------------------------------
# Argument validation


def _invalid(cls: type[protocol.OpArgs], raw: object) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        parse_args(cls, raw)
    assert info.value.code == ErrorCode.INVALID_ARGUMENT
    return info.value


def test_parse_args_none_means_defaults() -> None:
    assert parse_args(PingArgs, None) == PingArgs()
    assert parse_args(StatusArgs, None) == StatusArgs(clusters=[], refresh=False)


def test_parse_args_builds_the_dataclass() -> None:
    args = parse_args(LogsArgs, {"cluster": "dev", "job_id": 3, "follow": False, "tail": 10})
    assert args == LogsArgs(cluster="dev", job_id=3, follow=False, tail=10, offset=None)


def test_parse_args_rejects_non_map() -> None:
    error = _invalid(StatusArgs, ["dev"])
    assert error.message == "status: args must be a map"


def test_parse_args_unknown_field_names_it_and_lists_accepted() -> None:
    error = _invalid(QueueArgs, {"cluster": "dev", "verbose": True, "all": 1})
    assert error.message == "queue: unknown argument all, verbose"
    assert error.hint == "accepted arguments: cluster, skip_finished"


def test_parse_args_missing_required_cluster() -> None:
    error = _invalid(QueueArgs, {"skip_finished": True})
    assert error.message == "queue: missing argument cluster"


def test_parse_args_bool_is_not_an_int() -> None:
    error = _invalid(LogsArgs, {"cluster": "dev", "tail": True})
    assert error.message == "logs: argument 'tail' must be int, got bool"


def test_parse_args_int_is_not_a_bool() -> None:
    error = _invalid(QueueArgs, {"cluster": "dev", "skip_finished": 1})
    assert error.message == "queue: argument 'skip_finished' must be bool, got int"


def test_parse_args_optional_int_names_both_choices() -> None:
    error = _invalid(LogsArgs, {"cluster": "dev", "job_id": "3"})
    assert error.message == "logs: argument 'job_id' must be int or null, got str"


def test_parse_args_int_accepted_for_float_but_bool_is_not() -> None:
    args = parse_args(LaunchArgs, {"idle_minutes": 5})
    assert args.idle_minutes == 5
    assert parse_args(LaunchArgs, {"idle_minutes": 2.5}).idle_minutes == 2.5
    error = _invalid(LaunchArgs, {"idle_minutes": True})
    assert error.message == "launch: argument 'idle_minutes' must be float or null, got bool"


def test_parse_args_list_of_int_checks_every_item() -> None:
    assert parse_args(CancelArgs, {"cluster": "c", "job_ids": [1, 2]}).job_ids == [1, 2]
    error = _invalid(CancelArgs, {"cluster": "c", "job_ids": [1, "2"]})
    assert error.message == "cancel: argument 'job_ids' must be list[int], got list"
    _invalid(CancelArgs, {"cluster": "c", "job_ids": [1, True]})
    _invalid(CancelArgs, {"cluster": "c", "job_ids": (1, 2)})


def test_parse_args_dict_of_str_checks_keys_and_values() -> None:
    args = parse_args(LaunchArgs, {"envs": {"A": "1"}, "secrets": {"TOKEN": "s"}})
    assert args.envs == {"A": "1"}
    assert args.secrets == {"TOKEN": "s"}
    error = _invalid(LaunchArgs, {"envs": {"A": 1}})
    assert error.message == "launch: argument 'envs' must be dict[str, str], got dict"
    _invalid(LaunchArgs, {"secrets": {"A": None}})
    _invalid(LaunchArgs, {"envs": ["A=1"]})


def test_parse_args_list_of_str() -> None:
    assert parse_args(StatusArgs, {"clusters": ["a", "b"]}).clusters == ["a", "b"]
    error = _invalid(StatusArgs, {"clusters": "a"})
    assert error.message == "status: argument 'clusters' must be list[str], got str"


def test_every_op_is_registered_under_its_name() -> None:
    assert set(protocol.OPS) == {
        "ping", "status", "launch", "exec", "queue", "logs", "cancel", "stop", "start",
        "down", "events", "requests", "check", "autostop", "show_gpus", "follow_request",
        "nodes", "node_usage", "ssh", "jobs_launch", "jobs_queue", "jobs_logs",
        "jobs_events", "jobs_cancel", "storage_ls", "storage_delete", "history",
        "cost_report",
    }
    for name, cls in protocol.OPS.items():
        assert cls.op == name


def test_to_wire_round_trips_through_parse_args() -> None:
    args = LaunchArgs(cluster="dev", command="echo hi", envs={"A": "1"}, num_nodes=2,
                      idle_minutes=1.5, down=True)
    assert parse_args(LaunchArgs, protocol.to_wire(args)) == args


# --------------------------------------------------------------------------------------------
# Job statuses and exit codes


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (JobStatus.INIT, ExitCode.NOT_FINISHED),
        (JobStatus.PENDING, ExitCode.NOT_FINISHED),
        (JobStatus.SETTING_UP, ExitCode.NOT_FINISHED),
        (JobStatus.RUNNING, ExitCode.NOT_FINISHED),
        (JobStatus.SUCCEEDED, ExitCode.SUCCEEDED),
        (JobStatus.FAILED, ExitCode.FAILED),
        (JobStatus.FAILED_SETUP, ExitCode.FAILED),
        (JobStatus.FAILED_DRIVER, ExitCode.FAILED),
        (JobStatus.CANCELLED, ExitCode.CANCELLED),
    ],
)
def test_exit_code_for_every_job_status(status: JobStatus, code: ExitCode) -> None:
    assert exit_code_for_job(status) == code
    assert exit_code_for_job(str(status)) == code


def test_exit_code_values_are_the_documented_numbers() -> None:
    assert exit_code_for_job(None) == ExitCode.NOT_FINISHED == 101
    assert [int(c) for c in ExitCode] == [0, 1, 100, 101, 102, 103]
    with pytest.raises(ValueError):
        exit_code_for_job("BOGUS")


def test_job_status_is_terminal() -> None:
    terminal = {s for s in JobStatus if s.is_terminal}
    assert terminal == {
        JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.FAILED_SETUP,
        JobStatus.FAILED_DRIVER, JobStatus.CANCELLED,
    }


def test_clipped_keeps_what_fits_and_cuts_the_rest_to_the_limit() -> None:
    assert protocol.clipped("abc", 3) == "abc"
    assert protocol.clipped("abcd", 3) == "..."
    assert protocol.clipped("x" * 500, 200) == "x" * 197 + "..."
    assert len(protocol.clipped("y" * 1000, 40)) == 40
    assert protocol.shown("z" * 100, 10) == "'zzzzzz..."


def test_request_error_is_the_general_error_by_its_other_name() -> None:
    assert protocol.RequestError is protocol.ProtocolError
    error = protocol.RequestError(protocol.ErrorCode.CLUSTER_NOT_FOUND, "no such cluster", "h")
    assert error.to_wire() == {"code": "CLUSTER_NOT_FOUND", "message": "no such cluster",
                               "hint": "h"}
