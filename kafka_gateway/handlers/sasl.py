"""SaslHandshake and SaslAuthenticate with PLAIN: the user is the API key's principal, the
password is the key (the same keys, ACLs and checks as HTTP, delta_log.core.acl).

v1 handshakes carry the token in SaslAuthenticate requests; after a v0 handshake the next frame
is the bare token, answered with a bare (empty) frame. As Kafka's SASL listeners answer:
- a failed authentication is answered SASL_AUTHENTICATION_FAILED after
  `kafka.failed_authentication_delay_ms` (Kafka's connection.failed.authentication.delay.ms: a
  password guesser gets ten tries a second per connection, not thousands), then the connection
  closes;
- a mechanism other than PLAIN is answered UNSUPPORTED_SASL_MECHANISM with the ones served, then the
  connection closes;
- a SaslHandshake or SaslAuthenticate on a connection that has authenticated is answered
  ILLEGAL_SASL_STATE (the connection stays: it is authenticated).
The token is never logged.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import Any

from kio.schema.errors import ErrorCode

from delta_log.core.acl import Principal, authenticate
from delta_log.errors import AuthenticationError
from kafka_gateway.apis import api
from kafka_gateway.session import Session

log = logging.getLogger(__name__)

MECHANISMS = ["PLAIN"]


def check_plain(conn: Session, token: bytes) -> Principal:
    """RFC 4616: [authzid] NUL authcid NUL passwd. Raises: AuthenticationError."""
    parts = token.split(b"\0")
    if len(parts) != 3:
        raise AuthenticationError("A SASL/PLAIN token is [authzid] NUL user NUL password.")
    authzid, user, password = (p.decode("utf-8", "replace") for p in parts)
    principal = authenticate(conn.services.settings.auth, f"Bearer {password}")
    if user != principal.name or (authzid and authzid != user):
        raise AuthenticationError(
            "The SASL/PLAIN user must be the API key's principal (sasl.username), the password the key."
        )
    return principal


def _authenticate(conn: Session, token: bytes) -> str | None:
    """Authenticate the connection; the error message on failure (the connection then closes
    once answered)."""
    if conn.sasl_mechanism is None:
        conn.close = True
        return "Send SaslHandshake first."
    if conn.services.settings.auth.enabled:
        try:
            conn.principal = check_plain(conn, token)
        except AuthenticationError as exc:
            log.warning("Kafka client %s failed SASL/PLAIN authentication", conn.peer)
            conn.close = True
            return exc.message
    conn.sasl_authenticated = True
    return None


async def _failed_login_delay(conn: Session) -> None:
    """Kafka's connection.failed.authentication.delay.ms: the refusal waits (the connection's
    reader has stopped: nothing more is read from it meanwhile)."""
    await asyncio.sleep(conn.settings.failed_authentication_delay_ms / 1000)


@api(17, "SaslHandshake", 0, 1, before_auth=True)
async def sasl_handshake(conn: Session, request: Any, version: int) -> dict[str, Any]:
    if conn.sasl_authenticated:
        return {"error_code": ErrorCode.illegal_sasl_state, "mechanisms": MECHANISMS}
    if request.mechanism not in MECHANISMS:
        conn.close = True
        return {"error_code": ErrorCode.unsupported_sasl_mechanism, "mechanisms": MECHANISMS}
    conn.sasl_mechanism = request.mechanism
    conn.sasl_raw = version == 0
    return {"error_code": 0, "mechanisms": MECHANISMS}


@api(36, "SaslAuthenticate", 0, 2, before_auth=True)
async def sasl_authenticate(conn: Session, request: Any, version: int) -> Any:
    if conn.sasl_authenticated:
        return {
            "error_code": ErrorCode.illegal_sasl_state,
            "error_message": "This connection has authenticated already.",
            "auth_bytes": b"",
            "session_lifetime": 0,
        }
    error = _authenticate(conn, bytes(request.auth_bytes))
    answer = {
        "error_code": ErrorCode.sasl_authentication_failed if error else 0,
        "error_message": error,
        "auth_bytes": b"",
        "session_lifetime": 0,
    }
    if error is None:
        return answer

    async def refused() -> dict[str, Any]:
        await _failed_login_delay(conn)
        return answer

    return refused()


async def raw_authenticate(conn: Session, frame: bytes | memoryview) -> list[bytes] | None:
    """The bare token after a v0 handshake: an empty frame on success; on failure the connection
    closes after the failed-login delay (Kafka's v0 flow has no way to answer an error)."""
    conn.sasl_raw = False
    if _authenticate(conn, bytes(frame)) is not None:
        await _failed_login_delay(conn)
        return None
    return [struct.pack(">i", 0)]
