"""Topic value schemas: parsing, compatibility and record validation. Pure: no I/O.

A topic's value schema is the latest live version of the registry subject `<topic>-value`
(Confluent's TopicNameStrategy). Two schema types, the two Kafka users meet most:
- AVRO: Confluent's default, the compact binary format Spark's `from_avro` reads;
- JSON (JSON Schema): for the JSON most producers already send, readable without a decoder.

A value on the wire is either framed as Confluent's serializers write it (magic byte 0, the schema
id as 4 bytes big-endian, then the Avro binary encoding or the JSON text), or, for JSON topics only,
plain JSON text checked against the latest version. A null value (a tombstone) is always valid.

Compatibility uses Confluent's level names. BACKWARD (the default) means the new version can read
data written with the previous one; FORWARD the reverse; FULL both; the _TRANSITIVE levels check
every live version instead of the latest. Avro follows the specification's schema resolution
rules; JSON Schema follows Confluent's structural rules for the keywords Kafka schemas use (types,
properties, required, additionalProperties, items, enum and bounds); any other keyword must not
change.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import fastavro
import jsonschema
from jsonschema.exceptions import SchemaError, best_match
from referencing import Registry

from delta_log.core.json_fast_check import Check, compile_check
from delta_log.errors import InvalidCompatibilityLevelError, InvalidValueSchemaError

AVRO, JSON = "AVRO", "JSON"
SCHEMA_TYPES = (AVRO, JSON)
COMPATIBILITY_LEVELS = (
    "NONE",
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
)
DEFAULT_COMPATIBILITY = "BACKWARD"
MAGIC_BYTE = 0
FRAME_BYTES = 5
#: a schema-valid body of the longest schema (each character escaped, 6 bytes) fits server.max_body_bytes (1 MiB)
MAX_SCHEMA_CHARS = 128 * 1024
MAX_SCHEMA_ID = 2**31 - 1
_MAX_REASON_CHARS = 300


def subject_for(topic: str) -> str:
    """The registry subject that holds `topic`'s value schema (TopicNameStrategy)."""
    return f"{topic}-value"


def topic_of_subject(subject: str) -> str:
    """The topic a subject belongs to, for authorization: `<topic>-value` and `<topic>-key`; any
    other subject (RecordNameStrategy) is authorized as a topic of its own name."""
    for suffix in ("-value", "-key"):
        if subject.endswith(suffix) and len(subject) > len(suffix):
            return subject[: -len(suffix)]
    return subject


def validate_level(level: object) -> str:
    """Raises: InvalidCompatibilityLevelError."""
    if not isinstance(level, str) or level.upper() not in COMPATIBILITY_LEVELS:
        raise InvalidCompatibilityLevelError(f"Invalid compatibility level {str(level)[:64]!r}.")
    return level.upper()


@dataclass(frozen=True, slots=True, eq=False)
class ValueSchema:
    """A parsed schema. `canonical` (its JSON with sorted keys, no spaces) is its identity: the
    same canonical text registered twice gets the same id."""

    schema_type: str
    text: str
    canonical: str
    document: Any  # the schema as JSON
    _check: Callable[[bytes], str | None] = field(repr=False)

    def reason(self, payload: bytes) -> str | None:
        """Why `payload` (unframed) is not a value of this schema, or None."""
        return self._check(payload)


def parse_schema(schema_type: object, text: object) -> ValueSchema:
    """Parse and check a schema as registered (`schema_type` None means AVRO, as in Confluent).

    Raises: InvalidValueSchemaError that says what is wrong.
    """
    kind = AVRO if schema_type in (None, "") else schema_type
    if kind not in SCHEMA_TYPES:
        raise InvalidValueSchemaError(f"schemaType {str(schema_type)[:32]!r} is not supported; use AVRO or JSON.")
    if not isinstance(text, str) or not text.strip():
        raise InvalidValueSchemaError("The schema must be a non-empty string.")
    if len(text) > MAX_SCHEMA_CHARS:
        raise InvalidValueSchemaError(f"The schema is {len(text)} characters; the limit is {MAX_SCHEMA_CHARS}.")
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InvalidValueSchemaError(f"The schema is not JSON: {_short(exc)}.") from exc
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"))
    if kind == AVRO:
        try:
            parsed = fastavro.parse_schema(document)
            AvroNames(document)  # the shapes compatibility checks walk (fastavro lets some pass)
        except Exception as exc:  # fastavro raises SchemaParseException, KeyError, TypeError...
            why = f"{exc.args[0]!r} is missing" if isinstance(exc, KeyError) else _short(exc)
            raise InvalidValueSchemaError(f"Invalid Avro schema: {why}.") from exc
        return ValueSchema(AVRO, text, canonical, document, _avro_checker(parsed))
    if not isinstance(document, dict | bool):
        raise InvalidValueSchemaError("A JSON Schema is an object (or true/false).")
    _refuse_remote_refs(document)
    try:
        validator_cls = jsonschema.validators.validator_for(document)
        validator_cls.check_schema(document)
        # an empty registry: a $ref is resolved inside the schema, never fetched (no URL, no file)
        validator = validator_cls(document, registry=Registry())
    except (SchemaError, RecursionError) as exc:
        raise InvalidValueSchemaError(f"Invalid JSON Schema: {_short(exc)}.") from exc
    except Exception as exc:  # e.g. a $schema that is not a string
        raise InvalidValueSchemaError(f"Invalid JSON Schema: {_short(exc)}.") from exc
    return ValueSchema(JSON, text, canonical, document, _json_checker(validator, compile_check(document)))


def _refuse_remote_refs(document: Any, depth: int = 0) -> None:
    """A schema refers only inside itself (`#...`): the gateway fetches nothing a schema names.

    Raises: InvalidValueSchemaError.
    """
    if depth > 256:
        raise InvalidValueSchemaError("The schema nests too deeply.")
    if isinstance(document, dict):
        for key, value in document.items():
            if key in ("$ref", "$dynamicRef", "$recursiveRef") and not (
                isinstance(value, str) and value.startswith("#")
            ):
                raise InvalidValueSchemaError(
                    f"{key} {str(value)[:80]!r} points outside the schema; only local references (#/...) are "
                    "supported: inline the referenced schema."
                )
            if key == "$schema" and not isinstance(value, str):
                raise InvalidValueSchemaError("$schema must be a string (a JSON Schema dialect URI).")
            _refuse_remote_refs(value, depth + 1)
    elif isinstance(document, list):
        for value in document:
            _refuse_remote_refs(value, depth + 1)


def _short(exc: BaseException | str) -> str:
    text = str(getattr(exc, "message", None) or exc) or type(exc).__name__
    return text if len(text) <= _MAX_REASON_CHARS else text[:_MAX_REASON_CHARS] + "..."


def _avro_checker(parsed: Any) -> Callable[[bytes], str | None]:
    def check(payload: bytes) -> str | None:
        buf = io.BytesIO(payload)
        try:
            fastavro.schemaless_reader(buf, parsed, None)
        except Exception as exc:  # truncated or corrupt input raises whatever the decoder met
            why = "the value ends early" if isinstance(exc, EOFError) or "BytesIO" in str(exc) else _short(exc)
            return f"not Avro of this schema ({why})"
        if buf.tell() != len(payload):
            return f"not Avro of this schema ({len(payload) - buf.tell()} bytes left after the value)"
        return None

    return check


def _not_json_number(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _json_checker(validator: Any, fast: Check | None) -> Callable[[bytes], str | None]:
    """jsonschema's verdict and reason; `fast` (json_fast_check) first, when the schema allows it:
    a value it finds valid is valid, one it refuses is explained by jsonschema."""

    def check(payload: bytes) -> str | None:
        try:
            document = json.loads(payload, parse_constant=_not_json_number)
        except (ValueError, RecursionError) as exc:
            return f"not JSON ({_short(exc)})"
        if fast is not None:
            try:
                if fast(document):
                    return None
            except RecursionError:
                return "nested too deeply to validate"
        try:
            error = best_match(validator.iter_errors(document))
        except RecursionError:
            return "nested too deeply to validate"
        except Exception as exc:  # e.g. a $ref the schema cannot resolve (nothing is ever fetched)
            return f"cannot be checked against this schema ({_short(exc)})"
        if error is None:
            return None
        where = "/".join(str(p) for p in error.absolute_path)
        return _short(f"{'at /' + where + ': ' if where else ''}{error.message}")

    return check


# --- validation of values ----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SubjectSchemas:
    """A topic's value schema as produce checks it: the latest version and every id registered
    under the subject (a framed value may carry an older version's id)."""

    subject: str
    latest_id: int
    by_id: Mapping[int, ValueSchema]

    @property
    def latest(self) -> ValueSchema:
        return self.by_id[self.latest_id]

    def reason(self, value: bytes | None) -> str | None:
        """Why `value` is refused, or None when it is valid."""
        if value is None:
            return None
        if len(value) >= FRAME_BYTES and value[0] == MAGIC_BYTE:
            schema_id = int.from_bytes(value[1:FRAME_BYTES], "big")
            schema = self.by_id.get(schema_id)
            if schema is None:
                return f"schema id {schema_id} in the value's frame is not a version of subject {self.subject!r}"
            why = schema.reason(value[FRAME_BYTES:])
            return None if why is None else f"{why} (schema id {schema_id})"
        latest = self.latest
        if latest.schema_type == AVRO:
            return (
                "Avro values are framed: byte 0, the 4-byte schema id, then the Avro binary "
                "(Confluent's wire format; an AvroSerializer writes it)"
            )
        why = latest.reason(value)
        return None if why is None else f"{why} (schema id {self.latest_id})"

    def invalid(self, values: Sequence[bytes | None]) -> dict[int, str]:
        """Index and reason of every invalid value."""
        return {i: why for i, value in enumerate(values) if (why := self.reason(value)) is not None}


# --- compatibility -----------------------------------------------------------------------------
def compatibility_messages(level: str, new: ValueSchema, live: Sequence[ValueSchema]) -> list[str]:
    """Why `new` breaks `level` against the subject's live versions (oldest first); [] if it is
    compatible."""
    if level == "NONE" or not live:
        return []
    against = live if level.endswith("_TRANSITIVE") else live[-1:]
    messages: list[str] = []
    for old in against:
        if old.schema_type != new.schema_type:
            messages.append(f"the schema type changed from {old.schema_type} to {new.schema_type}")
            continue
        if level.startswith(("BACKWARD", "FULL")):
            messages += [f"backward: {m}" for m in _safe_reads(new, old)]
        if level.startswith(("FORWARD", "FULL")):
            messages += [f"forward: {m}" for m in _safe_reads(old, new)]
        if len(messages) > _MAX_MESSAGES:
            break
    return messages[:_MAX_MESSAGES]


_MAX_MESSAGES = 50


def _safe_reads(reader: ValueSchema, writer: ValueSchema) -> list[str]:
    """_reads, where a shape the rules do not know counts as a change (never compatible by accident)."""
    try:
        return _reads(reader, writer)
    except (TypeError, AttributeError, KeyError, ValueError, RecursionError) as exc:
        return [f"$: the schemas cannot be compared ({_short(exc)}); treated as incompatible"]


def _reads(reader: ValueSchema, writer: ValueSchema) -> list[str]:
    """Why data written with `writer` cannot be read with `reader`."""
    if reader.schema_type == AVRO:
        r, w = AvroNames(reader.document), AvroNames(writer.document)
        return _avro_reads(r, r.root, w, w.root, "$", {})
    return _json_reads(reader.document, writer.document, "$")


_AVRO_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
#: (writer type, reader type) pairs the Avro specification resolves by promotion
_AVRO_PROMOTIONS = frozenset(
    {
        ("int", "long"),
        ("int", "float"),
        ("int", "double"),
        ("long", "float"),
        ("long", "double"),
        ("float", "double"),
        ("string", "bytes"),
        ("bytes", "string"),
    }
)


class AvroNames:
    """An Avro schema normalized for resolution: every node a dict with a `type`; named types
    (record, enum, fixed) declared once in `names` by full name and referenced as `ref`."""

    def __init__(self, document: Any) -> None:
        self.names: dict[str, dict[str, Any]] = {}
        self._repeated: list[dict[str, Any]] = []  # array items and map values
        self.root = self._norm(document, "")
        for node in self._repeated:
            if self._zero_size(node, set()):
                # a count of such items costs no bytes: a tiny value could declare billions of them
                raise ValueError("array items and map values must not encode to zero bytes (null, an empty record)")

    def _zero_size(self, node: dict[str, Any], seen: set[str]) -> bool:
        node = self.deref(node)
        if node["type"] == "null":
            return True
        if node["type"] == "fixed":
            return bool(node["size"] == 0)
        if node["type"] != "record" or node["name"] in seen:
            return False
        return all(self._zero_size(f["type"], seen | {node["name"]}) for f in node["fields"])

    def _full(self, name: str, namespace: str) -> str:
        return name if "." in name or not namespace else f"{namespace}.{name}"

    def _norm(self, s: Any, ns: str) -> dict[str, Any]:
        if isinstance(s, str):
            if s in _AVRO_PRIMITIVES:
                return {"type": s}
            full = self._full(s, ns)
            return {"type": "ref", "name": full if full in self.names else s}
        if isinstance(s, list):
            branches = [self._norm(b, ns) for b in s]
            kinds = [b.get("name", b["type"]) for b in branches]
            if "union" in kinds or len(set(kinds)) != len(kinds):
                raise ValueError("a union holds no union and no type twice (Avro specification)")
            return {"type": "union", "branches": branches}
        t = s["type"]
        if isinstance(t, dict | list) or (
            isinstance(t, str) and t not in _AVRO_PRIMITIVES and t not in _NAMED_OR_NESTED
        ):
            return self._norm(t, ns)
        if t in _AVRO_PRIMITIVES:
            return {"type": t, "logical": s.get("logicalType")}
        if t == "array":
            self._repeated.append(items := self._norm(s["items"], ns))
            return {"type": "array", "items": items}
        if t == "map":
            self._repeated.append(values := self._norm(s["values"], ns))
            return {"type": "map", "values": values}
        full = self._full(s["name"], s.get("namespace", ns))
        inner = full.rpartition(".")[0]
        node: dict[str, Any] = {"type": "record" if t == "error" else t, "name": full}
        node["aliases"] = {a.rpartition(".")[2] for a in s.get("aliases", [])}
        self.names[full] = node
        if t in ("record", "error"):
            names = [f["name"] for f in s["fields"]]
            if len(set(names)) != len(names):
                raise ValueError(f"record {full} names a field twice")
            node["fields"] = [
                {
                    "name": f["name"],
                    "type": self._norm(f["type"], inner),
                    "has_default": "default" in f,
                    "aliases": set(f.get("aliases", [])),
                }
                for f in s["fields"]
            ]
        elif t == "enum":
            node["symbols"] = list(s["symbols"])
            node["default"] = s.get("default")
        else:
            if not isinstance(s["size"], int) or isinstance(s["size"], bool) or s["size"] < 0:
                raise ValueError(f"fixed {full} needs a size of 0 or more bytes")
            node["size"] = s["size"]
        return node

    def deref(self, node: dict[str, Any]) -> dict[str, Any]:
        return self.names.get(node["name"], node) if node["type"] == "ref" else node


_NAMED_OR_NESTED = frozenset({"record", "error", "enum", "fixed", "array", "map"})


def _short_name(full: str) -> str:
    return full.rpartition(".")[2]


def _avro_reads(
    rn: AvroNames,
    r: dict[str, Any],
    wn: AvroNames,
    w: dict[str, Any],
    path: str,
    seen: dict[tuple[str, str], list[str] | None],
) -> list[str]:
    """`seen` memoizes named pairs for the whole check (None while one is being compared: a
    recursive type reads itself), so each pair of named types is compared once."""
    r, w = rn.deref(r), wn.deref(w)
    if w["type"] == "union":
        return [m for b in w["branches"] for m in _avro_reads(rn, r, wn, b, path, seen)]
    if r["type"] == "union":
        if any(not _avro_reads(rn, b, wn, w, path, seen) for b in r["branches"]):
            return []
        return [f"{path}: the reader's union has no branch that reads the writer's {_avro_type(w)}"]
    if r["type"] != w["type"]:
        if (w["type"], r["type"]) in _AVRO_PROMOTIONS:
            return []
        return [f"{path}: the writer's {_avro_type(w)} cannot be read as {_avro_type(r)}"]
    kind = r["type"]
    if kind in _AVRO_PRIMITIVES:
        return []
    if kind == "array":
        return _avro_reads(rn, r["items"], wn, w["items"], f"{path}[]", seen)
    if kind == "map":
        return _avro_reads(rn, r["values"], wn, w["values"], f"{path}{{}}", seen)
    rname, wname = _short_name(r["name"]), _short_name(w["name"])
    if rname != wname and wname not in r["aliases"]:
        return [f"{path}: the writer's {kind} {wname} has another name than the reader's {rname}"]
    pair = (r["name"], w["name"])
    if pair in seen:
        return seen[pair] or []
    seen[pair] = None
    seen[pair] = result = _avro_named_reads(rn, r, wn, w, path, seen)
    return result


def _avro_named_reads(
    rn: AvroNames,
    r: dict[str, Any],
    wn: AvroNames,
    w: dict[str, Any],
    path: str,
    seen: dict[tuple[str, str], list[str] | None],
) -> list[str]:
    kind, rname = r["type"], _short_name(r["name"])
    if kind == "fixed":
        return [] if r["size"] == w["size"] else [f"{path}: fixed {rname} changed size"]
    if kind == "enum":
        missing = [s for s in w["symbols"] if s not in r["symbols"]]
        if missing and r["default"] is None:
            return [f"{path}: enum {rname} lost symbols {missing} and has no default"]
        return []
    messages: list[str] = []
    writer_fields = {f["name"]: f for f in w["fields"]}
    for rf in r["fields"]:
        wf = next((writer_fields[n] for n in [rf["name"], *sorted(rf["aliases"])] if n in writer_fields), None)
        where = f"{path}.{rf['name']}"
        if wf is not None:
            messages += _avro_reads(rn, rf["type"], wn, wf["type"], where, seen)
        elif not rf["has_default"]:
            messages.append(f"{where}: field {rf['name']} is not in the writer's schema and has no default")
    return messages


def _avro_type(node: dict[str, Any]) -> str:
    return f"{node['type']} {_short_name(node['name'])}" if "name" in node else str(node["type"])


_MIN_KEYWORDS = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties")
_MAX_KEYWORDS = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties")
_EQUAL_KEYWORDS = ("pattern", "format", "multipleOf", "uniqueItems", "const")
_CHECKED_KEYWORDS = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "enum",
        *_MIN_KEYWORDS,
        *_MAX_KEYWORDS,
        *_EQUAL_KEYWORDS,
    }
)
#: keywords that change no document's validity ($schema does: a dialect changes what keywords mean)
_ANNOTATIONS = frozenset({"$id", "title", "description", "default", "examples", "$comment", "deprecated"})


def _json_types(schema: Mapping[str, Any]) -> set[str] | None:
    t = schema.get("type")
    if t is None:
        return None
    return {t} if isinstance(t, str) else set(t)


def _same(a: Any, b: Any) -> bool:
    """JSON equality, type-strict (Python's says 1 == True == 1.0)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _is_bound(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _json_reads(r: Any, w: Any, path: str) -> list[str]:
    if r is True or r == {} or _same(r, w):
        return []
    if w is False:
        return []  # nothing was ever written
    if r is False:
        return [f"{path}: the reader accepts nothing"]
    if w is True:
        w = {}
    messages: list[str] = []
    rtypes, wtypes = _json_types(r), _json_types(w)
    if rtypes is not None:
        if wtypes is None:
            messages.append(f"{path}: the writer allowed any type, the reader only {sorted(rtypes)}")
        else:
            for t in sorted(wtypes):
                if t not in rtypes and not (t == "integer" and "number" in rtypes):
                    messages.append(f"{path}: the writer's {t} is not a type the reader accepts")
    if "enum" in r:
        written = w.get("enum", [w["const"]] if "const" in w else None)
        allowed = {json.dumps(v, sort_keys=True) for v in r["enum"]}
        if written is None or any(json.dumps(v, sort_keys=True) not in allowed for v in written):
            messages.append(f"{path}: the reader's enum does not cover every value the writer allowed")
    for kw in (*_MIN_KEYWORDS, *_MAX_KEYWORDS):
        if kw not in r:
            continue
        if not (_is_bound(r[kw]) and _is_bound(w.get(kw))):
            if not _same(r[kw], w.get(kw)):
                messages.append(f"{path}: {kw} changed")
        elif (w[kw] < r[kw]) if kw in _MIN_KEYWORDS else (w[kw] > r[kw]):
            messages.append(f"{path}: {kw} is stricter in the reader")
    for kw in _EQUAL_KEYWORDS:
        if kw in r and not _same(r[kw], w.get(kw)):
            messages.append(f"{path}: {kw} changed")
    for kw in sorted((set(r) | set(w)) - _CHECKED_KEYWORDS - _ANNOTATIONS):
        if not _same(r.get(kw), w.get(kw)):
            messages.append(f"{path}: {kw} changed (topiclake compares it only for equality)")
    messages += _json_object_reads(r, w, path)
    ritems, witems = r.get("items"), w.get("items", {})
    if isinstance(ritems, list) or isinstance(witems, list):  # tuple validation: compared as a whole
        if not _same(ritems, witems):
            messages.append(f"{path}: items changed (tuple items are compared only for equality)")
    elif isinstance(ritems, dict | bool):
        messages += _json_reads(ritems, witems, f"{path}[]")
    return messages


def _json_object_reads(r: Mapping[str, Any], w: Mapping[str, Any], path: str) -> list[str]:
    if "properties" not in r and "properties" not in w and "additionalProperties" not in r:
        return []
    messages: list[str] = []
    rprops, wprops = r.get("properties", {}), w.get("properties", {})
    radd, wadd = r.get("additionalProperties", True), w.get("additionalProperties", True)
    for name in sorted(set(r.get("required", [])) - set(w.get("required", []))):
        messages.append(f"{path}.{name}: required in the reader but optional in the writer")
    for name in sorted(set(rprops) & set(wprops)):
        messages += _json_reads(rprops[name], wprops[name], f"{path}.{name}")
    for name in sorted(set(wprops) - set(rprops)):
        if radd is False:
            messages.append(f"{path}.{name}: removed from a closed content model")
        elif isinstance(radd, dict):
            messages += _json_reads(radd, wprops[name], f"{path}.{name}")
    for name in sorted(set(rprops) - set(wprops)):
        # the writer may have written it with any value its open model allowed
        if wadd is not False and _json_reads(rprops[name], wadd if isinstance(wadd, dict) else {}, path):
            messages.append(
                f"{path}.{name}: added to an open content model (close the old one with "
                "additionalProperties: false, or let the new property accept any value)"
            )
    if radd is False and wadd is not False:
        messages.append(f"{path}: the reader closed the content model (additionalProperties: false)")
    elif isinstance(radd, dict) and wadd is not False:
        messages += _json_reads(radd, wadd if isinstance(wadd, dict) else {}, f"{path}.*")
    return messages
