"""API keys (bearer tokens) with Kafka's ACL model for topics and groups. Pure: settings + header
in, a decision out.

Off while no keys are configured (the embedded default). With keys configured, every request but
/healthz, /readyz needs `Authorization: Bearer <key>` (or HTTP Basic with the key as password, as
Confluent's schema registry clients send it; one gate for the whole app), and each
operation needs its permission on each resource it touches:

- topics: `produce` (Kafka's WRITE), `consume` (READ), `admin` (CREATE, ALTER, DELETE; implies the
  others). DESCRIBE is implied by any of them, as in Kafka.
- groups: `read` (join, heartbeat, leave, commit; with admin on the topic, reset offsets),
  `describe` (describe, fetch offsets; implied by read), `admin` (every group operation).

Patterns are names or globs (`*`, `orders-*`). A key file written before groups had ACLs has no
`groups` table; it keeps working as before: a key that may consume or administer some topic gets
`read` on every group (`legacy_group_acls`).
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from conf import AuthSettings
from delta_log.errors import AuthenticationError, AuthorizationError, TransactionalIdAuthorizationError

TopicOperation = Literal["produce", "consume", "admin", "describe"]
GroupOperation = Literal["read", "describe", "admin"]
TransactionalIdOperation = Literal["write", "describe"]

#: what each granted permission implies (Kafka: READ/WRITE/ALTER... imply DESCRIBE; admin all)
_TOPIC_IMPLIED: dict[str, frozenset[str]] = {
    "describe": frozenset({"describe"}),
    "produce": frozenset({"produce", "describe"}),
    "consume": frozenset({"consume", "describe"}),
    "admin": frozenset({"produce", "consume", "admin", "describe"}),
}
_GROUP_IMPLIED: dict[str, frozenset[str]] = {
    "describe": frozenset({"describe"}),
    "read": frozenset({"read", "describe"}),
    "admin": frozenset({"read", "describe", "admin"}),
}
_TRANSACTIONAL_ID_IMPLIED: dict[str, frozenset[str]] = {
    "describe": frozenset({"describe"}),
    "write": frozenset({"write", "describe"}),
}

Rules = tuple[tuple[str, frozenset[str]], ...]


def _rules(acls: Mapping[str, Sequence[str]], implied: Mapping[str, frozenset[str]]) -> Rules:
    return tuple((pattern, frozenset().union(*(implied[op] for op in ops))) for pattern, ops in acls.items())


def _allowed(rules: Rules, operation: str, name: str) -> bool:
    return any(operation in ops and fnmatch.fnmatchcase(name, pattern) for pattern, ops in rules)


def legacy_transactional_id_acls(topic_acls: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """Transactional-id permissions of a key file without a `transactional_ids` table: a key that
    may produce to some topic may use any transactional id (its records still need produce)."""
    if any(op in ("produce", "admin") for granted in topic_acls.values() for op in granted):
        return {"*": ["write"]}
    return {}


def legacy_group_acls(topic_acls: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """Group permissions of a key file without a `groups` table: what it could do before."""
    ops = {op for granted in topic_acls.values() for op in granted}
    if ops & {"consume", "admin"}:
        return {"*": ["read"]}
    return {}


@dataclass(frozen=True, slots=True, kw_only=True)
class Principal:
    name: str
    topics: Rules = ()
    groups: Rules = ()
    transactional_ids: Rules = ()
    anonymous: bool = False

    def allows(self, operation: TopicOperation, topic: str | None) -> bool:
        """`topic=None`: the operation on some topic (e.g. may this key administer anything)."""
        if self.anonymous:
            return True
        if topic is None:
            return any(operation in ops for _, ops in self.topics)
        return _allowed(self.topics, operation, topic)

    def allows_group(self, operation: GroupOperation, group: str) -> bool:
        return self.anonymous or _allowed(self.groups, operation, group)

    def allows_transactional_id(self, operation: TransactionalIdOperation, transactional_id: str) -> bool:
        return self.anonymous or _allowed(self.transactional_ids, operation, transactional_id)

    def administers_all(self) -> bool:
        """Admin on every topic and every group (`*` rules): what acts on the whole root, as the
        maintenance jobs do (Kafka: ALTER on the cluster)."""
        return self.anonymous or (
            any(p == "*" and "admin" in ops for p, ops in self.topics)
            and any(p == "*" and "admin" in ops for p, ops in self.groups)
        )


ANONYMOUS = Principal(name="anonymous", anonymous=True)

#: Kafka's "authorized operations" when not asked for, or for a resource refused
NO_OPERATIONS = -(2**31)
#: Kafka's AclOperation codes (bits of an "authorized operations" field)
READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE = (
    3,
    4,
    5,
    6,
    7,
    8,
    9,
    10,
    11,
    12,
)
#: (`describe` reads a resource's configs too: Kafka's DESCRIBE and DESCRIBE_CONFIGS)
_KAFKA_TOPIC_OPERATIONS = {
    "describe": {DESCRIBE, DESCRIBE_CONFIGS},
    "consume": {READ},
    "produce": {WRITE},
    "admin": {CREATE, DELETE, ALTER, ALTER_CONFIGS},
}
_KAFKA_GROUP_OPERATIONS = {
    "describe": {DESCRIBE, DESCRIBE_CONFIGS},
    "read": {READ},
    "admin": {DELETE, ALTER_CONFIGS},
}
_KAFKA_CLUSTER_OPERATIONS = {CREATE, ALTER, DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE}


def kafka_operations(principal: Principal, resource: Literal["topic", "group", "cluster"], name: str = "") -> int:
    """What `principal` may do with a resource, as the bit set of Kafka's operations that Metadata,
    DescribeGroups, ConsumerGroupDescribe and DescribeCluster report when asked. The cluster:
    `admin` on every topic and group is all of Kafka's cluster rights; `admin` on some topic is
    DESCRIBE (the cluster's brokers, log dirs and reassignments)."""
    if resource == "cluster":
        if principal.administers_all():
            granted = _KAFKA_CLUSTER_OPERATIONS
        else:
            granted = {DESCRIBE} if principal.allows("admin", None) else set()
    elif resource == "topic":
        granted = {op for p, ops in _KAFKA_TOPIC_OPERATIONS.items() if principal.allows(p, name) for op in ops}  # type: ignore[arg-type]
    else:
        granted = {op for p, ops in _KAFKA_GROUP_OPERATIONS.items() if principal.allows_group(p, name) for op in ops}  # type: ignore[arg-type]
    return sum(1 << op for op in granted)


def principal_of(
    name: str,
    topics: Mapping[str, Sequence[str]],
    groups: Mapping[str, Sequence[str]] | None,
    transactional_ids: Mapping[str, Sequence[str]] | None = None,
) -> Principal:
    if transactional_ids is None:
        transactional_ids = legacy_transactional_id_acls(topics)
    return Principal(
        name=name,
        topics=_rules(topics, _TOPIC_IMPLIED),
        groups=_rules(legacy_group_acls(topics) if groups is None else groups, _GROUP_IMPLIED),
        transactional_ids=_rules(transactional_ids, _TRANSACTIONAL_ID_IMPLIED),
    )


def _presented_key(authorization: str | None) -> bytes | None:
    """The API key in an Authorization header: `Bearer <key>`, or HTTP Basic with the key as the
    password (what Confluent's clients send with basic.auth.user.info = "<name>:<key>")."""
    if not authorization:
        return None
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() == "bearer":
        return credentials.strip().encode()
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(credentials.strip(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None
        _user, colon, password = decoded.partition(":")
        return password.encode() if colon else None
    return None


def authenticate(settings: AuthSettings, authorization: str | None) -> Principal:
    """Raises: AuthenticationError (missing or unknown key)."""
    if not settings.enabled:
        return ANONYMOUS
    token = _presented_key(authorization)
    if not token:
        raise AuthenticationError("This server requires an API key.")
    for key in settings.api_keys:
        if hmac.compare_digest(key.key.get_secret_value().encode(), token):
            return principal_of(key.principal, key.acls, key.groups, key.transactional_ids)
    raise AuthenticationError("Unknown API key: check the key, or ask an operator for one.")


def key_of(settings: AuthSettings, principal: Principal) -> str | None:
    """A configured API key that authenticates as `principal` with the same ACLs (None: keys are
    not configured, or none does): what a gateway presents to another gateway to act for a client
    it authenticated (a transactional write's partitions added at the id's coordinator)."""
    for key in settings.api_keys:
        if principal_of(key.principal, key.acls, key.groups, key.transactional_ids) == principal:
            return key.key.get_secret_value()
    return None


def authorize(principal: Principal, operation: TopicOperation, topic: str | None) -> None:
    """Raises: AuthorizationError."""
    if not principal.allows(operation, topic):
        where = f"topic {topic!r}" if topic else "this server"
        raise AuthorizationError(
            f"{principal.name!r} may not {operation} on {where}; ask an operator for an ACL.",
            principal=principal.name,
            operation=operation,
            topic=topic,
        )


def refusal(principal: Principal, operation: TopicOperation, topic: str) -> AuthorizationError | None:
    """`authorize`'s error, returned instead of raised (None: allowed): for a request whose topics
    are each answered on their own."""
    try:
        authorize(principal, operation, topic)
    except AuthorizationError as exc:
        return exc
    return None


def authorize_all(principal: Principal, operation: str) -> None:
    """Raises: AuthorizationError unless `principal` administers every topic and group."""
    if not principal.administers_all():
        raise AuthorizationError(
            f"{principal.name!r} may not {operation}: it acts on every topic and group; it needs admin on "
            "'*' topics and '*' groups. Ask an operator for an ACL.",
            principal=principal.name,
            operation=operation,
        )


def authorize_group(principal: Principal, operation: GroupOperation, group: str) -> None:
    """Raises: AuthorizationError."""
    if not principal.allows_group(operation, group):
        raise AuthorizationError(
            f"{principal.name!r} may not {operation} group {group!r}; ask an operator for a group ACL.",
            principal=principal.name,
            operation=operation,
            group=group,
        )


def authorize_transactional_id(
    principal: Principal, operation: TransactionalIdOperation, transactional_id: str
) -> None:
    """Raises: TransactionalIdAuthorizationError (Kafka's TRANSACTIONAL_ID_AUTHORIZATION_FAILED)."""
    if not principal.allows_transactional_id(operation, transactional_id):
        raise TransactionalIdAuthorizationError(
            f"{principal.name!r} may not {operation} transactional id {transactional_id!r}; ask an operator "
            "for a transactional_ids ACL.",
            principal=principal.name,
            operation=operation,
            transactional_id=transactional_id,
        )
