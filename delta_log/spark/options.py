"""Options of the `topiclake` Spark source, parsed and planned without Spark (pure).

The options are Spark's Kafka source's: subscribe | subscribePattern | assign, startingOffsets,
endingOffsets, startingOffsetsByTimestamp, startingTimestamp, maxOffsetsPerTrigger,
includeHeaders, failOnDataLoss; plus `root` (the storage root) and `groupId`.
Offsets are {"topic": {"partition": offset}} with -2 = earliest, -1 = latest, as in Kafka.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from conf.settings import object_store_options
from delta_log.errors import SourceOptionError

EARLIEST, LATEST = -2, -1
#: {topic: {partition: offset}}
Offsets = dict[str, dict[int, int]]


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceOptions:
    root: str
    storage_options: dict[str, str] = field(default_factory=dict)
    subscribe: tuple[str, ...] = ()
    subscribe_pattern: str | None = None
    assign: dict[str, tuple[int, ...]] = field(default_factory=dict)
    starting: str | Offsets = "latest"
    ending: str | Offsets = "latest"
    starting_by_timestamp: dict[str, dict[int, int]] | None = None
    starting_timestamp: int | None = None
    max_offsets_per_trigger: int | None = None
    include_headers: bool = False
    fail_on_data_loss: bool = True
    group_id: str | None = None
    parse_values: bool = False  # add `value_parsed`: the value read by the topic's JSON Schema

    def topics(self, existing: list[str]) -> list[str]:
        """The topics this source reads, given the topics that exist now."""
        if self.subscribe:
            return list(self.subscribe)
        if self.assign:
            return sorted(self.assign)
        assert self.subscribe_pattern is not None
        pattern = re.compile(self.subscribe_pattern)
        return [t for t in existing if pattern.fullmatch(t)]


def _bool(opts: Mapping[str, str], key: str, default: bool) -> bool:
    raw = opts.get(key.lower())
    if raw is None:
        return default
    if raw.lower() not in ("true", "false"):
        raise SourceOptionError(f"Option {key} must be true or false; got {raw!r}.", option=key)
    return raw.lower() == "true"


def _offsets_json(key: str, raw: str, *, allow: tuple[int, ...]) -> Offsets:
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise SourceOptionError(
            f'Option {key} is not valid JSON ({exc.msg}); expected e.g. {{"orders": {{"0": 23, "1": -2}}}}.',
            option=key,
        ) from None
    if not isinstance(doc, dict):
        raise SourceOptionError(f"Option {key} must be a JSON object of topic -> {{partition: offset}}.", option=key)
    out: Offsets = {}
    for topic, parts in doc.items():
        if not isinstance(parts, dict):
            raise SourceOptionError(
                f"Option {key}: topic {topic!r} needs an object of partition -> offset.", option=key
            )
        out[topic] = {}
        for p, off in parts.items():
            try:
                partition = int(p)
            except ValueError:
                raise SourceOptionError(
                    f"Option {key}: partition {p!r} of {topic!r} is not a number.", option=key
                ) from None
            if not isinstance(off, int) or isinstance(off, bool) or (off < 0 and off not in allow):
                raise SourceOptionError(
                    f"Option {key}: offset {off!r} for {topic}-{partition} must be >= 0"
                    + (f" or one of {allow}" if allow else "")
                    + ".",
                    option=key,
                )
            out[topic][partition] = off
    return out


#: Options `storage.<key>` are the root's storage options (object-store endpoint, credentials...).
STORAGE_OPTION_PREFIX = "storage."


def root_and_storage_options(
    opts: Mapping[str, str], default_root: str, default_storage_options: Mapping[str, str] | None
) -> tuple[str, dict[str, str]]:
    """The `root` (or `path`) option and its storage options (`storage.<key>` options over the
    defaults); another S3 root than the default is completed from the AWS environment, as the
    settings' root is. `opts` has lower-cased keys."""
    root = opts.get("root") or opts.get("path") or default_root
    storage_options = dict(default_storage_options or {})
    storage_options.update(
        {k[len(STORAGE_OPTION_PREFIX) :]: v for k, v in opts.items() if k.startswith(STORAGE_OPTION_PREFIX)}
    )
    return root, object_store_options(root, storage_options)


def parse_options(
    options: Mapping[str, str],
    *,
    default_root: str,
    default_storage_options: Mapping[str, str] | None = None,
    streaming: bool,
) -> SourceOptions:
    """Raises: SourceOptionError with a message that says what to change."""
    opts = {k.lower(): v for k, v in options.items()}
    root, storage_options = root_and_storage_options(opts, default_root, default_storage_options)
    chosen = [k for k in ("subscribe", "subscribepattern", "assign") if opts.get(k)]
    if len(chosen) != 1:
        raise SourceOptionError(
            "Set exactly one of subscribe, subscribePattern or assign"
            + (f" (got {', '.join(chosen)})." if chosen else "."),
        )
    subscribe: tuple[str, ...] = ()
    assign: dict[str, tuple[int, ...]] = {}
    pattern = None
    if "subscribe" in chosen:
        subscribe = tuple(t.strip() for t in opts["subscribe"].split(",") if t.strip())
    elif "subscribepattern" in chosen:
        pattern = opts["subscribepattern"]
        try:
            re.compile(pattern)
        except re.error as exc:
            raise SourceOptionError(
                f"subscribePattern is not a valid regex: {exc}.", option="subscribePattern"
            ) from None
    else:
        try:
            doc = json.loads(opts["assign"])
            assign = {t: tuple(int(p) for p in ps) for t, ps in doc.items()}
        except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
            raise SourceOptionError('Option assign must be JSON like {"orders": [0, 1]}.', option="assign") from None
    starting: str | Offsets = "earliest" if not streaming else "latest"
    raw_start = opts.get("startingoffsets")
    if raw_start is not None:
        starting = (
            raw_start
            if raw_start in ("earliest", "latest")
            else _offsets_json("startingOffsets", raw_start, allow=(EARLIEST, LATEST))
        )
    ending: str | Offsets = "latest"
    raw_end = opts.get("endingoffsets")
    if raw_end is not None:
        if streaming:
            raise SourceOptionError(
                "endingOffsets is for batch queries only; remove it from the stream.", option="endingOffsets"
            )
        if raw_end == "earliest":
            raise SourceOptionError(
                "endingOffsets cannot be earliest; use latest or JSON offsets.", option="endingOffsets"
            )
        ending = raw_end if raw_end == "latest" else _offsets_json("endingOffsets", raw_end, allow=(LATEST,))
    by_ts = None
    if opts.get("startingoffsetsbytimestamp"):
        by_ts = _offsets_json("startingOffsetsByTimestamp", opts["startingoffsetsbytimestamp"], allow=())
    start_ts = None
    if opts.get("startingtimestamp"):
        try:
            start_ts = int(opts["startingtimestamp"])
        except ValueError:
            raise SourceOptionError(
                "startingTimestamp must be epoch milliseconds.", option="startingTimestamp"
            ) from None
    max_per_trigger = None
    if opts.get("maxoffsetspertrigger"):
        try:
            max_per_trigger = int(opts["maxoffsetspertrigger"])
        except ValueError:
            max_per_trigger = -1
        if max_per_trigger <= 0:
            raise SourceOptionError("maxOffsetsPerTrigger must be a positive integer.", option="maxOffsetsPerTrigger")
    return SourceOptions(
        root=root,
        storage_options=storage_options,
        subscribe=subscribe,
        subscribe_pattern=pattern,
        assign=assign,
        starting=starting,
        ending=ending,
        starting_by_timestamp=by_ts,
        starting_timestamp=start_ts,
        max_offsets_per_trigger=max_per_trigger,
        include_headers=_bool(opts, "includeHeaders", False),
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        group_id=opts.get("groupid") or None,
        parse_values=_bool(opts, "parseValues", False),
    )


def plan_limited_end(start: Offsets, latest: Offsets, max_offsets: int) -> Offsets:
    """Kafka's rate limit: split `max_offsets` over partitions in proportion to their backlog (pure).

    Every partition keeps start <= end <= latest and the total advance is at most `max_offsets`.
    """
    backlog = {(t, p): max(0, latest[t][p] - start.get(t, {}).get(p, latest[t][p])) for t in latest for p in latest[t]}
    total = sum(backlog.values())
    end: Offsets = {t: dict(ps) for t, ps in start.items()}
    for t in latest:
        end.setdefault(t, {})
        for p in latest[t]:
            end[t].setdefault(p, start.get(t, {}).get(p, latest[t][p]))
    if total <= max_offsets:
        return {t: dict(ps) for t, ps in latest.items()}
    given = 0
    shares = sorted(backlog.items(), key=lambda kv: (-kv[1], kv[0]))
    for (t, p), lag in shares:
        take = min(lag, (lag * max_offsets) // total)
        end[t][p] = start.get(t, {}).get(p, 0) + take
        given += take
    for (t, p), _lag in shares:  # hand out what rounding left, biggest backlog first
        if given >= max_offsets:
            break
        room = latest[t][p] - end[t][p]
        extra = min(room, max_offsets - given)
        end[t][p] += extra
        given += extra
    return end


def to_json_offsets(offsets: Offsets) -> dict[str, dict[str, int]]:
    """Spark wants primitive keys: partitions as strings."""
    return {t: {str(p): o for p, o in sorted(ps.items())} for t, ps in sorted(offsets.items())}


def from_json_offsets(doc: Mapping[str, Mapping[str, int]]) -> Offsets:
    return {t: {int(p): int(o) for p, o in ps.items()} for t, ps in doc.items()}
