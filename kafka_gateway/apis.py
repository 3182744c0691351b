"""The APIs the Kafka listener serves, at which versions (the table handlers register into, and
ApiVersions, which reads it); kafka_gateway.protocol dispatches a frame to them.

A handler is `async def handler(conn, request, version) -> dict | Awaitable[dict] | None`: its
body runs before the connection's next frame is read (the ordered part); it returns the response
as plain values (see kafka_gateway.messages.build), or an awaitable of them for what may wait
(commits, long-polls, rebalances), or None for no response (Produce with acks=0).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kafka_gateway import messages
from kafka_gateway.session import Session

log = logging.getLogger(__name__)

Handler = Callable[[Session, Any, int], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Api:
    key: int
    name: str
    min_version: int
    max_version: int
    handler: Handler
    #: served before a connection authenticated (ApiVersions, SASL)
    before_auth: bool = False


APIS: dict[int, Api] = {}


def api(
    key: int, name: str, min_version: int, max_version: int, *, before_auth: bool = False
) -> Callable[[Handler], Handler]:
    """Register a handler for API `key` at versions min..max (every one must exist in kio)."""

    def register(handler: Handler) -> Handler:
        for v in range(min_version, max_version + 1):
            messages.request_schema(key, v)  # fails at import if a version is not generated
        APIS[key] = Api(key, name, min_version, max_version, handler, before_auth)
        return handler

    return register


def name_of(api_key: int) -> str:
    a = APIS.get(api_key)
    return a.name if a else f"api key {api_key}"


# -- ApiVersions ----------------------------------------------------------------------------------
API_VERSIONS = messages.API_VERSIONS_KEY


def api_versions_body(error: int = 0) -> dict[str, Any]:
    return {
        "error_code": error,
        "api_keys": [
            {"api_key": a.key, "min_version": a.min_version, "max_version": a.max_version}
            for a in sorted(APIS.values(), key=lambda a: a.key)
        ],
        "throttle_time": 0,
    }


#: Kafka's `transaction.version` feature, finalized at 2 (KIP-890 part 2): a Kafka 4.x client
#: then lets its writes and offsets join their transaction (Produce v12, TxnOffsetCommit v5; a
#: gateway that does not coordinate the id asks the one that does) and takes the epoch EndTxn v5
#: bumps for its next transaction. Clients that do not read features use the TV1 flow, also served.
TRANSACTION_VERSION = "transaction.version"
#: the epoch of the finalized features (constant: a gateway's features never change while it runs)
FEATURES_EPOCH = 1
FEATURES = {
    "supported_features": [{"name": TRANSACTION_VERSION, "min_version": 0, "max_version": 2}],
    "finalized_features_epoch": FEATURES_EPOCH,
    "finalized_features": [{"name": TRANSACTION_VERSION, "min_version_level": 2, "max_version_level": 2}],
}


@api(API_VERSIONS, "ApiVersions", 0, 4, before_auth=True)
async def api_versions(conn: Session, request: Any, version: int) -> dict[str, Any]:
    return api_versions_body() | FEATURES
