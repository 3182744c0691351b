"""One Kafka client connection's protocol state, apart from its socket: what the handlers see
(the services, the listener's settings, the brokers to advertise, who authenticated, the SASL
step). kafka_gateway.listener makes one per accepted connection and reads `close`; the
protocol (kafka_gateway.apis, the handlers) never touches a socket, so it can be driven with
frames alone."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from broker.services import Services
from conf import KafkaSettings
from delta_log.core.acl import Principal
from kafka_gateway.brokers import BrokerView


@dataclass(slots=True)
class Session:
    services: Services
    settings: KafkaSettings
    brokers: BrokerView
    peer: str
    principal: Principal | None  # None until SASL authenticated a key (keys configured)
    client_id: str | None = None
    #: SASL: the mechanism a handshake chose; "raw" after a v0 handshake (the next frame is the token)
    sasl_mechanism: str | None = None
    sasl_raw: bool = False
    #: SASL authentication succeeded on this connection (a second handshake is ILLEGAL_SASL_STATE)
    sasl_authenticated: bool = False
    close: bool = False  # close once the answers owed are written
    #: what answers this connection's latest group membership request (kafka_gateway.protocol's
    #: GROUP_MEMBERSHIP): the next one is handled after it
    group_lane: asyncio.Future[Any] | None = None
