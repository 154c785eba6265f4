"""Replies made of views encoded ahead of time (clusterd/packing.py) are the very bytes msgpack
writes for the same message, whatever mix of encoded and plain maps the lists hold."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterctl import protocol
from clusterctl.protocol import ProtocolError
from clusterd.packing import Columns, Packed, encode_frame

values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=False)
    | st.text(max_size=20) | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=6,
)
views = st.dictionaries(st.text(max_size=10), values, max_size=6)


# Derandomized, as the fuzz tests: the same inputs every run.
@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(views, st.booleans()), max_size=8),
       st.dictionaries(st.sampled_from(["orphans", "note", "count"]), values, max_size=3),
       st.integers(1, 2**31))
def test_the_bytes_are_msgpacks_own(items: list[tuple[dict[str, Any], bool]],
                                    others: dict[str, Any], request_id: int) -> None:
    mixed = [Packed(view) if packed else view for view, packed in items]
    result = {"clusters": mixed, **others}
    message = protocol.reply_ok(request_id, result)
    plain = protocol.reply_ok(request_id, {"clusters": [dict(v) for v in mixed], **others})
    assert encode_frame(message) == protocol.encode_frame(plain)
    decoder = protocol.FrameDecoder()  # and a client reads it back whole
    decoder.feed(encode_frame(message))
    assert decoder.next_message() == msgpack.unpackb(protocol.encode_frame(plain)[4:],
                                                      raw=False)


def test_a_copy_with_more_fields_is_encoded_as_it_is_now() -> None:
    view = Packed({"name": "a", "status": "UP"})
    busy = {**view, "busy": ["launch by request 3"]}
    frame = encode_frame(protocol.reply_ok(1, {"clusters": [view, busy]}))
    decoder = protocol.FrameDecoder()
    decoder.feed(frame)
    assert decoder.next_message()["result"]["clusters"] == [
        {"name": "a", "status": "UP"}, {"name": "a", "status": "UP",
                                        "busy": ["launch by request 3"]}]


def test_a_reply_too_big_for_a_frame_is_refused_as_before() -> None:
    big = Packed({"blob": "x" * 1024 * 1024})
    with pytest.raises(ProtocolError) as refused:
        encode_frame(protocol.reply_ok(1, {"clusters": [big] * 9}))
    assert refused.value.code == protocol.ErrorCode.FRAME_TOO_LARGE


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(views.filter(bool), st.lists(values, min_size=1, max_size=3), st.booleans())
def test_a_copy_with_a_new_last_field_encodes_as_msgpack_would(
        view: dict[str, Any], stamps: list[Any], packed_first: bool) -> None:
    current = Packed(view)
    if packed_first:
        assert current.packed == msgpack.packb(view, use_bin_type=True)
    last = list(view)[-1]
    for stamp in stamps:  # stamped again and again, as a refresh does
        current = current.with_last(stamp)
        assert current == {**view, last: stamp}
        assert current.packed == msgpack.packb({**view, last: stamp}, use_bin_type=True)
    assert Packed(view) == view  # the first is left as it was


field_names = st.sampled_from(["name", "status", "cpus", "busy", "refreshed_at"])


@settings(max_examples=80, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(field_names, values, min_size=1, max_size=5),
       st.lists(st.tuples(st.sampled_from(["packed", "stamped", "busy", "owned"]), values),
                max_size=8))
def test_columns_read_back_as_the_views_they_were_made_of(
        fields: dict[str, Any], kinds: list[tuple[str, Any]]) -> None:
    """Views as status sends them: Packed (some stamped since), copies with fields changed
    (busy) and copies with a field more (a managed job's own cluster): in columns, then back
    to maps with views_of, they are what maps would have said."""
    made: list[dict[str, Any]] = []
    for index, (kind, value) in enumerate(kinds):
        view = Packed({**fields, "name": f"c{index}"})
        if kind == "stamped":
            view = view.with_last(value)
        elif kind == "busy":
            view = {**view, "busy": [value]}
        elif kind == "owned":  # never null: a null optional field reads back as absent
            view = {**view, "managed_job": index + 1}
        made.append(view)
    frame = encode_frame(protocol.reply_ok(7, {"clusters": Columns(made), "orphans": []}))
    decoder = protocol.FrameDecoder()
    decoder.feed(frame)
    result = decoder.next_message()["result"]
    assert result["orphans"] == []
    expected = msgpack.unpackb(msgpack.packb([dict(v) for v in made], use_bin_type=True))
    assert protocol.views_of(result["clusters"]) == expected
    assert protocol.views_of(expected) is expected  # maps pass through as they are
