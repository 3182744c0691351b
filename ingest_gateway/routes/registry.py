"""The schema registry API under /registry: the subset of Confluent Schema Registry's REST API that
Confluent's serializers and SchemaRegistryClient call (subjects, versions, schemas by id,
compatibility checks, config), kept in the `_system/schemas` Delta table (delta_log.system.schemas).
Point a client at `http://<gateway>/registry`.

Authorization maps a subject to its topic (`<topic>-value`, `<topic>-key`; any other subject is
authorized as a topic of its name): reading needs describe, registering a version produce (a
producer's serializer registers what it writes; compatibility still guards its consumers), deleting
and changing a subject's level admin, the global level admin on every topic ("*").
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response
from fastapi.concurrency import run_in_threadpool

from broker.admin import RegistryState, SubjectVersion, find_version, version_of
from broker.services import TopicRegistry
from delta_log.core.acl import Principal, authorize
from delta_log.core.paging import page_of
from delta_log.core.value_schemas import (
    MAX_SCHEMA_ID,
    SCHEMA_TYPES,
    ValueSchema,
    compatibility_messages,
    parse_schema,
    topic_of_subject,
    validate_level,
)
from delta_log.errors import (
    SchemaNotFoundError,
    SubjectConfigNotFoundError,
)
from ingest_gateway.kit.dependencies import PrincipalDep, RegistryDep
from ingest_gateway.kit.errors import REGISTRY_PREFIX
from ingest_gateway.kit.params import AfterQuery, SearchQuery
from ingest_gateway.schemas import CompatibilityLevel, RegisterSchema

router = APIRouter(prefix=REGISTRY_PREFIX, tags=["schema registry"])
#: topiclake's own view of the registry (not Confluent's API): pages of subjects with their latest
#: version, for a console with thousands of them
summary_router = APIRouter(tags=["schema registry"])

Subject = Annotated[
    str,
    Path(
        min_length=1,
        max_length=255,
        pattern=r"^[^\x00-\x1f]+$",
        description="A subject: `<topic>-value` holds the topic's value schema (TopicNameStrategy).",
    ),
]
Version = Annotated[
    str,
    Path(pattern=r"^(latest|-1|[1-9][0-9]{0,8})$", description="A version number from 1, or latest (-1)."),
]
SchemaId = Annotated[int, Path(ge=1, le=MAX_SCHEMA_ID, description="A schema id.")]
Flag = Annotated[bool, Query()]


def _answer(payload: Any) -> Response:
    return Response(json.dumps(payload, separators=(",", ":")), media_type="application/json")


def _version_number(raw: str) -> int | None:
    """A version from the path (checked by its pattern): None for latest (and -1)."""
    return None if raw in ("latest", "-1") else int(raw)


async def _schema(body: RegisterSchema) -> ValueSchema:
    """The body's schema, parsed off the event loop (a schema may be 128 Ki characters)."""
    return await run_in_threadpool(parse_schema, body.schema_type, body.schema_text)


def _registered(state: RegistryState, subject: str, v: SubjectVersion) -> dict[str, Any]:
    schema = state.schemas[v.schema_id]
    out: dict[str, Any] = {"subject": subject, "version": v.version, "id": v.schema_id, "schema": schema.text}
    if schema.schema_type != "AVRO":
        out["schemaType"] = schema.schema_type
    return out


def _describe(principal: Principal, subject: str) -> None:
    authorize(principal, "describe", topic_of_subject(subject))


async def _state(registry: TopicRegistry) -> RegistryState:
    """The registry as of now: its API reads the table (clients cache what they read), so a version
    registered through any gateway is seen at once."""
    return await run_in_threadpool(lambda: registry.schemas.state(max_age_s=0))


@router.get("/schemas/types")
def schema_types() -> Response:
    return _answer(list(SCHEMA_TYPES))


@router.get("/schemas/ids/{schema_id}")
async def schema_by_id(schema_id: SchemaId, registry: RegistryDep, principal: PrincipalDep) -> Response:
    """A schema by id (readable while any subject, even soft-deleted, holds it)."""
    state = await _state(registry)
    schema = state.schemas.get(schema_id)
    users = [s for s, vs in state.subjects.items() if any(v.schema_id == schema_id for v in vs)]
    if schema is None or not users:
        raise SchemaNotFoundError(f"Schema {schema_id} not found.", id=schema_id)
    if not any(principal.allows("describe", topic_of_subject(s)) for s in users):
        # as if absent: ids are sequential, and a refusal would name a topic this key may not see
        raise SchemaNotFoundError(f"Schema {schema_id} not found.", id=schema_id)
    out: dict[str, Any] = {"schema": schema.text}
    if schema.schema_type != "AVRO":
        out["schemaType"] = schema.schema_type
    return _answer(out)


@router.get("/schemas/ids/{schema_id}/versions")
async def schema_versions(schema_id: SchemaId, registry: RegistryDep, principal: PrincipalDep) -> Response:
    """The subjects and versions that hold a schema id."""
    state = await _state(registry)
    pairs = [
        {"subject": s, "version": v.version}
        for s, vs in sorted(state.subjects.items())
        for v in vs
        if v.schema_id == schema_id and not v.deleted and principal.allows("describe", topic_of_subject(s))
    ]
    if not pairs:
        raise SchemaNotFoundError(f"Schema {schema_id} not found.", id=schema_id)
    return _answer(pairs)


@router.get("/subjects")
async def subjects(registry: RegistryDep, principal: PrincipalDep, deleted: Flag = False) -> Response:
    """The subjects this key may describe."""
    state = await _state(registry)
    names = [
        s
        for s, vs in sorted(state.subjects.items())
        if (deleted or any(not v.deleted for v in vs)) and principal.allows("describe", topic_of_subject(s))
    ]
    return _answer(names)


@router.get("/subjects/{subject}/versions")
async def subject_versions(
    subject: Subject, registry: RegistryDep, principal: PrincipalDep, deleted: Flag = False
) -> Response:
    _describe(principal, subject)
    state = await _state(registry)
    return _answer([v.version for v in state.versions(subject, deleted=deleted)])


@router.get("/subjects/{subject}/versions/{version}")
async def subject_version(
    subject: Subject, version: Version, registry: RegistryDep, principal: PrincipalDep, deleted: Flag = False
) -> Response:
    _describe(principal, subject)
    state = await _state(registry)
    return _answer(_registered(state, subject, version_of(state, subject, _version_number(version), deleted=deleted)))


@router.get("/subjects/{subject}/versions/{version}/schema")
async def subject_version_schema(
    subject: Subject, version: Version, registry: RegistryDep, principal: PrincipalDep
) -> Response:
    """The schema text alone."""
    _describe(principal, subject)
    state = await _state(registry)
    v = version_of(state, subject, _version_number(version))
    return Response(state.schemas[v.schema_id].text, media_type="application/json")


@router.post("/subjects/{subject}/versions")
async def register(
    subject: Subject, body: RegisterSchema, registry: RegistryDep, principal: PrincipalDep, normalize: Flag = False
) -> Response:
    """Register a schema under a subject: its id (the same schema has the same id everywhere).
    A new version must pass the subject's compatibility level (409 INCOMPATIBLE_SCHEMA says why)."""
    authorize(principal, "produce", topic_of_subject(subject))
    schema = await _schema(body)
    v = await run_in_threadpool(lambda: registry.schemas.register(subject, schema))
    return _answer({"id": v.schema_id, "version": v.version, "subject": subject})


@router.post("/subjects/{subject}")
async def lookup(
    subject: Subject,
    body: RegisterSchema,
    registry: RegistryDep,
    principal: PrincipalDep,
    deleted: Flag = False,
    normalize: Flag = False,
) -> Response:
    """Is this schema registered under the subject? Its version and id if so."""
    _describe(principal, subject)
    schema = await _schema(body)
    state = await _state(registry)
    return _answer(_registered(state, subject, find_version(state, subject, schema, deleted=deleted)))


@router.delete("/subjects/{subject}")
async def delete_subject(
    subject: Subject, registry: RegistryDep, principal: PrincipalDep, permanent: Flag = False
) -> Response:
    """Soft-delete every version (ids stay readable); permanent=true afterwards removes them."""
    authorize(principal, "admin", topic_of_subject(subject))
    return _answer(await run_in_threadpool(lambda: registry.schemas.delete_subject(subject, permanent=permanent)))


@router.delete("/subjects/{subject}/versions/{version}")
async def delete_version(
    subject: Subject, version: Version, registry: RegistryDep, principal: PrincipalDep, permanent: Flag = False
) -> Response:
    authorize(principal, "admin", topic_of_subject(subject))
    number = _version_number(version)
    return _answer(
        await run_in_threadpool(lambda: registry.schemas.delete_version(subject, number, permanent=permanent))
    )


async def _compatibility(
    subject: str, version: str | None, body: RegisterSchema, registry: TopicRegistry, verbose: bool
) -> Response:
    schema = await _schema(body)
    state = await _state(registry)
    level = state.level_of(subject)
    if version is None:
        against = [state.schemas[v.schema_id] for v in state.live(subject)]
    else:
        against = [state.schemas[version_of(state, subject, _version_number(version)).schema_id]]
        level = level.removesuffix("_TRANSITIVE")
    messages = await run_in_threadpool(compatibility_messages, level, schema, against)
    out: dict[str, Any] = {"is_compatible": not messages}
    if verbose:
        out["messages"] = messages[:50]
    return _answer(out)


@router.post("/compatibility/subjects/{subject}/versions/{version}")
async def compatibility_with_version(
    subject: Subject,
    version: Version,
    body: RegisterSchema,
    registry: RegistryDep,
    principal: PrincipalDep,
    verbose: Flag = False,
    normalize: Flag = False,
) -> Response:
    """Would this schema pass the subject's level against one version?"""
    _describe(principal, subject)
    return await _compatibility(subject, version, body, registry, verbose)


@router.post("/compatibility/subjects/{subject}/versions")
async def compatibility_with_subject(
    subject: Subject,
    body: RegisterSchema,
    registry: RegistryDep,
    principal: PrincipalDep,
    verbose: Flag = False,
    normalize: Flag = False,
) -> Response:
    """Would this schema pass the subject's level (against every live version for _TRANSITIVE)?"""
    _describe(principal, subject)
    return await _compatibility(subject, None, body, registry, verbose)


@router.get("/config")
async def global_config(registry: RegistryDep, principal: PrincipalDep) -> Response:
    authorize(principal, "describe", None)
    state = await _state(registry)
    return _answer({"compatibilityLevel": state.global_level})


@router.put("/config")
async def set_global_config(body: CompatibilityLevel, registry: RegistryDep, principal: PrincipalDep) -> Response:
    """The level of subjects without one of their own (BACKWARD unless set)."""
    authorize(principal, "admin", "*")
    level = validate_level(body.compatibility)
    await run_in_threadpool(lambda: registry.schemas.set_level("", level))
    return _answer({"compatibility": level})


@router.get("/config/{subject}")
async def subject_config(
    subject: Subject, registry: RegistryDep, principal: PrincipalDep, defaultToGlobal: Flag = False
) -> Response:
    _describe(principal, subject)
    state = await _state(registry)
    if subject not in state.levels and not defaultToGlobal:
        raise SubjectConfigNotFoundError(f"Subject {subject!r} has no compatibility level of its own.")
    return _answer({"compatibilityLevel": state.level_of(subject)})


@router.put("/config/{subject}")
async def set_subject_config(
    subject: Subject, body: CompatibilityLevel, registry: RegistryDep, principal: PrincipalDep
) -> Response:
    authorize(principal, "admin", topic_of_subject(subject))
    level = validate_level(body.compatibility)
    await run_in_threadpool(lambda: registry.schemas.set_level(subject, level))
    return _answer({"compatibility": level})


@router.delete("/config/{subject}")
async def delete_subject_config(subject: Subject, registry: RegistryDep, principal: PrincipalDep) -> Response:
    """Back to the global level."""
    authorize(principal, "admin", topic_of_subject(subject))
    was = await run_in_threadpool(lambda: registry.schemas.set_level(subject, None))
    return _answer({"compatibilityLevel": was})


@summary_router.get("/schemas")
async def subject_summaries(
    registry: RegistryDep,
    principal: PrincipalDep,
    search: SearchQuery = "",
    after: AfterQuery = "",
    limit: Annotated[int, Query(ge=1, le=1000, description="Subjects in a page.")] = 50,
) -> Response:
    """A page of the subjects this key may describe (names containing `search`, after `after`;
    `next` asks for the next page), each with its latest version, schema id and type, its
    compatibility level (its own, else the global one), its number of versions, and the topic that
    uses it (TopicNameStrategy: `<topic>-value`, `<topic>-key`; null when no such topic exists)."""
    state = await _state(registry)
    live = (s for s in state.subjects if state.live(s))
    page, last = page_of(
        live,
        str,
        search=search,
        after=after,
        limit=limit,
        keep=lambda subject: principal.allows("describe", topic_of_subject(subject)),
    )

    def summary(subject: str) -> dict[str, Any]:
        kept = state.live(subject)
        latest = kept[-1]
        topic = topic_of_subject(subject)
        return {
            "subject": subject,
            "version": latest.version,
            "versions": len(kept),
            "id": latest.schema_id,
            "schemaType": state.schemas[latest.schema_id].schema_type,
            "compatibility": state.level_of(subject),
            "topic": topic if registry.catalog.is_topic(topic) else None,
        }

    subjects = await run_in_threadpool(lambda: [summary(s) for s in page])
    return _answer({"subjects": subjects, "next": last})
