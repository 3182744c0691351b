"""Kafka's protocol without a socket (kafka_gateway.protocol): frames in, answers out, and the
session's state; the listener only moves these frames."""

from __future__ import annotations

import asyncio
import struct
from typing import Any, cast

from kio.schema.errors import ErrorCode

from broker.services import Services
from conf import KafkaSettings
from delta_log.core.acl import ANONYMOUS, Principal
from kafka_gateway import protocol
from kafka_gateway.apis import APIS
from kafka_gateway.brokers import BrokerView
from kafka_gateway.session import Session
from tests.e2e import kafka_wire

API_VERSIONS, METADATA = 18, 3


def _session(principal: Principal | None = ANONYMOUS) -> Session:
    # ApiVersions and the checks before a handler need no services: none are given
    return Session(
        services=cast(Services, None),
        settings=KafkaSettings(),
        brokers=cast(BrokerView, None),
        peer="127.0.0.1:1",
        principal=principal,
    )


def _answer(session: Session, frame: bytes) -> bytes | None:
    async def run() -> bytes | None:
        pending = await protocol.dispatch(session, frame)
        parts = await pending.answer
        return None if parts is None else b"".join(bytes(p) for p in parts)[4:]  # without its size

    return asyncio.run(run())


def test_api_versions_lists_every_api_the_table_serves():
    answer = _answer(_session(), kafka_wire.request_frame(API_VERSIONS, 3, 7, client_software_name="t",
                                                          client_software_version="1"))  # fmt: skip
    assert answer is not None and struct.unpack(">i", answer[:4])[0] == 7  # the correlation id
    body: Any = kafka_wire.response_body(answer, API_VERSIONS, 3)
    assert body.error_code == ErrorCode.none
    served = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in body.api_keys}
    assert served == {a.key: (a.min_version, a.max_version) for a in APIS.values()}
    assert {0, 1, 3, 68, 69} <= set(served)  # Produce, Fetch, Metadata, the consumer protocol's two


def test_a_version_not_served_is_answered_unsupported_version():
    frame = bytearray(kafka_wire.request_frame(METADATA, 12, 9, topics=None, allow_auto_topic_creation=False,
                                               include_topic_authorized_operations=False))  # fmt: skip
    frame[2:4] = struct.pack(">h", 99)  # Metadata v99
    answer = _answer(_session(), bytes(frame))
    assert answer == struct.pack(">ih", 9, ErrorCode.unsupported_version)


def test_before_authenticating_only_api_versions_and_sasl_are_served():
    session = _session(principal=None)  # keys configured, nobody logged in yet
    assert _answer(session, kafka_wire.request_frame(API_VERSIONS, 0)) is not None and not session.close
    frame = kafka_wire.request_frame(METADATA, 12, topics=None, allow_auto_topic_creation=False,
                                     include_topic_authorized_operations=False)  # fmt: skip
    assert _answer(session, frame) is None and session.close  # no answer; the listener closes


def test_a_frame_that_does_not_parse_is_answered_invalid_request():
    frame = kafka_wire.request_frame(API_VERSIONS, 3, 5, client_software_name="t", client_software_version="1")
    answer = _answer(_session(), frame[:-3])  # cut inside its body
    assert answer is not None
    assert kafka_wire.response_body(answer, API_VERSIONS, 3).error_code == ErrorCode.invalid_request
