"""Kafka message bodies from plain values, and the consumer protocol's bytes, as the clients that
found faults in them send and read them (tests/e2e/test_kafka_go_clients.py runs those clients)."""

from __future__ import annotations

import struct

from kafka_gateway import messages, protocol

JOIN_GROUP = 11


def _body(frame: list[bytes], schema: type) -> object:
    data = b"".join(frame)
    assert struct.unpack_from(">i", data)[0] == len(data) - 4
    body, _size = messages._reader(schema)(data, 8)  # size, then header v0's correlation id
    return body


def test_a_null_before_the_version_that_made_it_nullable_is_written_as_kafka_writes_it():
    """JoinGroup's protocol_name is nullable from v7: an error answer to v2 (kafka-go) says "",
    as Kafka's broker does, instead of failing to encode and dropping the connection."""
    fail = {"error_code": 23, "generation_id": -1, "protocol_name": None, "leader": "", "member_id": "", "members": []}
    v2 = messages.respond(JOIN_GROUP, 2, fail)
    assert v2.protocol_name == ""
    decoded = _body(messages.encode_response(7, False, v2), messages.response_schema(JOIN_GROUP, 2))
    assert decoded.protocol_name == "" and decoded.error_code == 23
    assert messages.respond(JOIN_GROUP, 7, fail).protocol_name is None  # nullable there: kept


def test_an_answer_that_cannot_be_encoded_is_an_error_answer_not_a_dropped_connection():
    request = messages.RequestFrame(JOIN_GROUP, 2, 9, None, None, False)
    frame = protocol._encode(request, {"generation_id": "not a number"})
    assert frame is not None
    decoded = _body(frame, messages.response_schema(JOIN_GROUP, 2))
    assert decoded.error_code == -1  # UNKNOWN_SERVER_ERROR


def _subscription(version: int, topics: list[str], user_data: bytes | None, tail: bytes = b"") -> bytes:
    out = struct.pack(">hi", version, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    out += struct.pack(">i", -1) if user_data is None else struct.pack(">i", len(user_data)) + user_data
    return out + tail


def test_subscriptions_of_every_layout_give_their_topics():
    # Java and librdkafka: version 1+ with owned partitions (an empty array), and a generation id on v2+
    assert messages.decode_subscription(_subscription(1, ["a", "b"], None, struct.pack(">i", 0))) == ["a", "b"]
    # kafka-go: says version 1, writes version 0's fields only (topics, user data)
    assert messages.decode_subscription(_subscription(1, ["orders"], b"")) == ["orders"]
    assert messages.decode_subscription(_subscription(0, ["x"], b"ud")) == ["x"]
    try:
        messages.decode_subscription(struct.pack(">hi", 1, 5))  # 5 topics announced, none there
    except messages.MalformedFrameError as exc:
        assert "does not parse" in str(exc)
    else:
        raise AssertionError("a subscription that parses in no layout must be refused")


def test_an_answer_without_an_error_field_that_cannot_be_encoded_closes_rather_than_lies():
    """Metadata has no top-level error_code: no frame of it can say "failed", so the fault goes up
    (the listener logs it and closes; the client reconnects) instead of an unparsable frame."""
    import pytest

    request = messages.RequestFrame(3, 1, 9, None, None, False)
    with pytest.raises(Exception):  # noqa: B017 (whatever kio raises for the bad field)
        protocol._encode(request, {"brokers": [{"node_id": "not a number", "host": "h", "port": 1}]})


def test_a_null_number_is_not_turned_into_a_plausible_zero():
    import pytest

    with pytest.raises(Exception):  # noqa: B017
        protocol._encode(messages.RequestFrame(3, 1, 9, None, None, False), {"controller_id": None})


def test_log_dirs_need_what_get_cluster_needs():
    """DescribeLogDirs names the storage root: like GET /cluster it needs admin on some topic."""
    import pytest

    from broker import admin
    from delta_log.core.acl import principal_of
    from delta_log.errors import AuthorizationError

    reader = principal_of("reader", {"orders": ["consume", "describe"]}, None)
    with pytest.raises(AuthorizationError):
        admin.partition_sizes(None, reader, None)  # type: ignore[arg-type]  (refused before any lookup)
