"""Path, query and header parameters as the OpenAPI document states them.

Their bounds are documented (json_schema_extra), and enforced by the domain checks, which answer
with the stable codes clients branch on (400 INVALID_TOPIC, INVALID_GROUP, INVALID_OFFSET...).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Header, Path, Query
from pydantic import Strict

from delta_log.core.group_rules import GROUP_ID_PATTERN, MAX_GROUP_ID_LENGTH
from delta_log.core.topic_config import MAX_PARTITIONS, MAX_TOPIC_NAME_LENGTH, TOPIC_NAME_PATTERN
from delta_log.errors import InvalidOffsetError

#: an integer in a request body: JSON's true/false and "1" are refused (pydantic's lax mode took
#: them for 1/0), as the OpenAPI schema's `integer` says
BodyInt = Annotated[int, Strict()]

FORMATS: dict[str, Any] = {"enum": ["json", "string", "binary"]}

TopicPath = Annotated[
    str,
    Path(
        description="Topic name: 1-249 of [a-zA-Z0-9._-], not '.' or '..'.",
        json_schema_extra={"minLength": 1, "maxLength": MAX_TOPIC_NAME_LENGTH, "pattern": TOPIC_NAME_PATTERN},
    ),
]
TopicQuery = Annotated[
    str | None,
    Query(
        description="Topic name: 1-249 of [a-zA-Z0-9._-], not '.' or '..'.",
        json_schema_extra={"minLength": 1, "maxLength": MAX_TOPIC_NAME_LENGTH, "pattern": TOPIC_NAME_PATTERN},
    ),
]
PartitionPath = Annotated[int, Path(json_schema_extra={"minimum": 0, "maximum": MAX_PARTITIONS - 1})]
GroupPath = Annotated[
    str,
    Path(
        description="Group id: 1-255 characters without '/', '\\\\' or NUL.",
        json_schema_extra={"minLength": 1, "maxLength": MAX_GROUP_ID_LENGTH, "pattern": GROUP_ID_PATTERN},
    ),
]
TransactionalIdPath = Annotated[
    str,
    Path(
        description="Transactional id: 1-249 characters without '/'.",
        json_schema_extra={"minLength": 1, "maxLength": 249, "pattern": r"^[^/]+$"},
    ),
]
MemberPath = Annotated[str, Path(description="The member id a join returned.", json_schema_extra={"maxLength": 300})]
KeyFormat = Annotated[str, Query(description="json | string | binary (base64)", json_schema_extra=FORMATS)]
ValueFormat = KeyFormat
#: A list's page (GET /topics, GET /groups: delta_log.core.paging)
SearchQuery = Annotated[str, Query(max_length=255, description="Only names containing this (any case).")]
AfterQuery = Annotated[str, Query(max_length=255, description="Only names after this one: the `next` of a page.")]
LimitQuery = Annotated[int | None, Query(ge=1, le=10_000, description="At most this many (a page).")]
OffsetQuery = Annotated[
    int, Query(description="First offset to return.", json_schema_extra={"minimum": 0, "maximum": 2**53 - 1})
]


def bounded_int(description: str, minimum: int, maximum: int) -> Any:
    return Query(description=description, json_schema_extra={"minimum": minimum, "maximum": maximum})


#: The largest integer every JSON parser reads exactly (I-JSON, RFC 7493): the HTTP API's bound
#: for offsets and sizes a client sends (Kafka's are int64; no log reaches 2**53 records).
MAX_JSON_INT = 2**53 - 1


def check_json_int(name: str, value: int, minimum: int = 0) -> int:
    """Raises: InvalidOffsetError outside minimum..MAX_JSON_INT."""
    if not minimum <= value <= MAX_JSON_INT:
        raise InvalidOffsetError(f"{name} must be between {minimum} and {MAX_JSON_INT}; got {value}.", value=str(value))
    return value


LastEventId = Annotated[
    str,
    Header(description="SSE resume: the last offset received.", json_schema_extra={"pattern": r"^([0-9]{1,15})?$"}),
]
