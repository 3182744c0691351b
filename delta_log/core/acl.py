"""API keys (bearer tokens) with per-topic ACLs. Pure: settings + header in, a decision out.

Off while no keys are configured (the embedded default). With keys configured, every request but
/healthz, /readyz needs `Authorization: Bearer <key>`; each operation needs its ACL on the topic.
ACL patterns are topic names or globs (`*`, `orders-*`); admin implies produce and consume.
"""

from __future__ import annotations

import fnmatch
import hmac
from dataclasses import dataclass
from typing import Literal

from conf import AuthSettings
from delta_log.errors import AuthenticationError, AuthorizationError

Operation = Literal["produce", "consume", "admin"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Principal:
    name: str
    acls: tuple[tuple[str, frozenset[str]], ...]
    anonymous: bool = False

    def allows(self, operation: Operation, topic: str | None) -> bool:
        if self.anonymous:
            return True
        for pattern, ops in self.acls:
            matches = topic is None or fnmatch.fnmatchcase(topic, pattern)
            if matches and (operation in ops or "admin" in ops):
                return True
        return False


ANONYMOUS = Principal(name="anonymous", acls=(), anonymous=True)


def authenticate(settings: AuthSettings, authorization: str | None) -> Principal:
    """Raises: AuthenticationError (missing or unknown key)."""
    if not settings.enabled:
        return ANONYMOUS
    if not authorization or not authorization.lower().startswith("bearer "):
        raise AuthenticationError("This server requires an API key.")
    token = authorization[7:].strip().encode()
    for key in settings.api_keys:
        if hmac.compare_digest(key.key.get_secret_value().encode(), token):
            return Principal(name=key.principal, acls=tuple((p, frozenset(ops)) for p, ops in key.acls.items()))
    raise AuthenticationError("Unknown API key.")


def authorize(principal: Principal, operation: Operation, topic: str | None) -> None:
    """Raises: AuthorizationError."""
    if not principal.allows(operation, topic):
        where = f"topic {topic!r}" if topic else "this server"
        raise AuthorizationError(
            f"{principal.name!r} may not {operation} on {where}.",
            principal=principal.name,
            operation=operation,
            topic=topic,
        )
