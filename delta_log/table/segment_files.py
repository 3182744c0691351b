"""Segment files: writing one parquet file per partition and describing it as a Delta add action;
listing a snapshot's segments.

I/O adapter (pyarrow.parquet + the root's filesystem). Files are immutable once written; they
become visible only when a Delta commit adds them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.transaction import AddAction

from conf.settings import WriterSettings
from delta_log.core.records import CODEC_KEY, partition_runs
from delta_log.core.segments import SegmentInfo, StatsFallback, parse_add_actions
from delta_log.table.storage import StorageRoot

log = logging.getLogger(__name__)

try:  # the roll-up's fast path; without the extension (not built here) every merge decodes
    from delta_log.table.parquet_merge import merge as merge_parquet_files
except ImportError as exc:  # pragma: no cover - make setup builds it
    log.warning("segments are merged by decoding: the parquet merge extension is missing (%s); run make setup", exc)
    merge_parquet_files = None  # type: ignore[assignment]

#: parquet key-value metadata of a segment file whose rows ascend by offset
ORDER_KEY, BY_OFFSET = "topiclake.order", "offset"
SORTED_BY_OFFSET = {ORDER_KEY: BY_OFFSET}

#: Columns with Delta file statistics (delta.dataSkippingStatsColumns); offset drives the index.
STATS_COLUMNS = ("offset", "timestamp", "timestampType")
# Dictionary encoding only where values repeat. On values and offsets pyarrow builds a dictionary
# until it overflows and falls back: measured 359 vs 1,612 MB/s writing 100 B random values.
DICTIONARY_COLUMNS = ("key", "topic", "timestampType")


@dataclass(frozen=True, slots=True, kw_only=True)
class ParquetOptions:
    row_group_rows: int = 8192
    #: a row group also ends at about this many bytes of keys and values: a fetch decodes whole row
    #: groups, so 8,192 records of 1 KB (8 MB) to return a consumer's next 1 MB cost 8x the work
    row_group_bytes: int = 1024 * 1024
    compression: str = "snappy"

    @classmethod
    def of(cls, writer: WriterSettings) -> ParquetOptions:
        """The options the writer settings ask for."""
        return cls(row_group_rows=writer.max_row_group_rows, compression=writer.compression.lower())

    def rows_per_group(self, records: pa.Table) -> int:
        """Rows per row group for `records`: `row_group_rows`, fewer for large records."""
        n = records.num_rows
        if not n:
            return self.row_group_rows
        payload = records.column("value").nbytes + records.column("key").nbytes
        return max(1, min(self.row_group_rows, self.row_group_bytes * n // max(payload, 1)))


@dataclass(frozen=True, slots=True, kw_only=True)
class WrittenSegment:
    relative_path: str
    partition: int
    records: int
    action: AddAction


def _iso_millis(us: int) -> str:
    # Delta stats keep timestamps to the millisecond, UTC.
    secs, rem = divmod(us // 1000, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{rem:03d}Z"


#: per stats column: (min, max, null count); min and max None when every value is null
ColumnStats = tuple[int | None, int | None, int]


def segment_stats(table: pa.Table, *, first_offset: int | None = None) -> str:
    """Delta `stats` JSON for a segment (TOPIC_SCHEMA rows of one partition).

    `first_offset` lowers minValues.offset to a segment's base offset (stats are bounds, so this
    stays valid): a key-compacted segment keeps its base offset, as Kafka's do, and the log start
    offset does not move because superseded records were removed.
    """
    columns = {"offset": table.column("offset"), "timestamp": table.column("timestamp").cast(pa.int64())}
    columns["timestampType"] = table.column("timestampType")
    stats = {}
    for name, column in columns.items():
        mm = pc.min_max(column)
        stats[name] = (mm["min"].as_py(), mm["max"].as_py(), column.null_count)
    return _stats_json(table.num_rows, stats, first_offset=first_offset)


def _stats_json(records: int, stats: dict[str, ColumnStats], *, first_offset: int | None = None) -> str:
    """The `stats` JSON from each STATS_COLUMNS column's (min, max, null count); timestamps are
    epoch microseconds."""
    (min_offset, max_offset, offset_nulls), ts, tt = (stats[c] for c in STATS_COLUMNS)
    if first_offset is not None and min_offset is not None:
        min_offset = min(min_offset, first_offset)
    min_values: dict[str, object] = {"offset": min_offset}
    max_values: dict[str, object] = {"offset": max_offset}
    if ts[0] is not None and ts[1] is not None:
        min_values["timestamp"], max_values["timestamp"] = _iso_millis(ts[0]), _iso_millis(ts[1])
    if tt[0] is not None:
        min_values["timestampType"], max_values["timestampType"] = tt[0], tt[1]
    return json.dumps(
        {
            "numRecords": records,
            "minValues": min_values,
            "maxValues": max_values,
            "nullCount": {"offset": offset_nulls, "timestamp": ts[2], "timestampType": tt[2]},
        }
    )


def write_segments(
    storage: StorageRoot,
    table_uri: str,
    records: pa.Table,
    options: ParquetOptions,
    *,
    first_offset: int | None = None,
    codecs: Mapping[int, str] | None = None,
) -> list[WrittenSegment]:
    """Write `records` (TOPIC_SCHEMA, sorted by partition then offset) as one file per partition;
    `codecs`: partition -> its producers' codec (`CODEC_KEY`, when not none)."""
    fs, _ = storage.filesystem()
    base = storage.fs_path(table_uri)
    parts = records.column("partition").to_numpy()
    if not len(parts):
        return []
    out: list[WrittenSegment] = []
    now_ms = int(time.time() * 1000)
    for partition, s, e in partition_runs(parts):
        piece = records.slice(s, e - s)
        data = piece.drop_columns(["partition"])  # a partition value lives in the path (Hive style)
        offsets = piece.column("offset").to_numpy()
        meta: dict[str, str] = {}
        if bool(np.all(offsets[1:] > offsets[:-1])):  # what merge_segments may copy without sorting
            meta |= SORTED_BY_OFFSET
        if (codec := (codecs or {}).get(partition, "none")) != "none":
            meta[CODEC_KEY] = codec
        if meta:
            data = data.replace_schema_metadata(meta)
        rel = f"partition={partition}/part-{uuid.uuid4()}-c000.{options.compression}.parquet"
        path = f"{base}/{rel}"
        fs.create_dir(f"{base}/partition={partition}", recursive=True)
        with fs.open_output_stream(path) as sink:
            pq.write_table(
                data,
                sink,
                compression=options.compression,
                row_group_size=options.rows_per_group(piece),
                write_statistics=list(STATS_COLUMNS),
                use_dictionary=list(DICTIONARY_COLUMNS),
            )
        size = fs.get_file_info(path).size
        action = AddAction(
            rel, size, {"partition": str(partition)}, now_ms, True, segment_stats(piece, first_offset=first_offset)
        )
        out.append(WrittenSegment(relative_path=rel, partition=partition, records=piece.num_rows, action=action))
    return out


def codec_of(tables: Sequence[pa.Table]) -> str:
    """The producers' codec (`CODEC_KEY`) of segment files read into `tables` (in offset order),
    for the file that replaces them: the newest one's, as the writer keeps its last request's."""
    meta = (tables[-1].schema.metadata or {}) if tables else {}
    return meta.get(CODEC_KEY.encode(), b"none").decode()


def merge_segments(
    storage: StorageRoot, table_uri: str, partition: int, paths: list[str], options: ParquetOptions
) -> WrittenSegment | None:
    """One new segment holding the segment files `paths` (relative, one partition's, adjacent and
    in offset order) by copying their encoded column chunks: no decoding, no encoding
    (delta_log/table/parquet_merge, Rust). Row groups stay as the inputs wrote them.

    None where it does not apply, for the caller to merge by decoding: an object store (the merge
    reads and writes local files), an input not known to ascend by offset (`SORTED_BY_OFFSET`:
    written before it, or by another writer), row groups whose offsets do not ascend across the
    inputs, inputs whose schemas differ, statistics missing from an input, or row groups under
    half of `options`' size on average (copying keeps them as they are; decoding rewrites them
    full)."""
    if not storage.is_local or merge_parquet_files is None:
        return None
    rel = f"partition={partition}/part-{uuid.uuid4()}-c000.{options.compression}.parquet"
    inputs = [storage.file_path(table_uri, p) for p in paths]  # a job's paths may be URL-encoded
    try:
        size, records, stats = merge_parquet_files(
            inputs,
            storage.file_path(table_uri, rel),
            list(STATS_COLUMNS),
            ORDER_KEY,
            BY_OFFSET,
            "offset",
            options.row_group_rows // 2,  # row groups at least half full on average (else decode:
            options.row_group_bytes // 2,  # many small ones make every reader slower)
        )
    except ValueError as exc:
        log.info("segments of %s merged by decoding: %s", table_uri, exc)
        return None
    action = AddAction(
        rel, size, {"partition": str(partition)}, int(time.time() * 1000), True,
        _stats_json(records, dict(zip(STATS_COLUMNS, stats, strict=True))),
    )  # fmt: skip
    return WrittenSegment(relative_path=rel, partition=partition, records=records, action=action)


def segments_of(dt: DeltaTable, *, stats_fallback: StatsFallback | None = None) -> dict[int, list[SegmentInfo]]:
    """Every data file of a topic table's snapshot by partition (see core.segments.parse_add_actions)."""
    return parse_add_actions(pa.table(dt.get_add_actions(flatten=True)), stats_fallback=stats_fallback)


def remove_files(storage: StorageRoot, table_uri: str, relative_paths: list[str]) -> None:
    """Best-effort delete of files no commit references."""
    fs, _ = storage.filesystem()
    base = storage.fs_path(table_uri)
    for rel in relative_paths:
        with contextlib.suppress(OSError):
            fs.delete_file(f"{base}/{rel}")
