"""The app-transaction protocol: what topiclake keeps in Delta's `txn` actions, and the only module
that reads them (`DeltaTable.transaction_version`).

Topic tables
- `hw-<p>`: partition p's high watermark (Kafka's meaning: the next offset to assign). Every commit
  that appends to p writes it; delta-rs refuses a commit whose txn app id changed since the
  committing table object's read version, so two writers never hand out one offset.
- `p-<producer>-<p>`: an idempotent producer's last committed sequence on partition p.
- `o-<producer>-<p>`: the base offset that sequence got on p (a retry is answered with it).

System tables
- `group-<g>`: every row of consumer group g in `_system/consumer_groups` carries it (version =
  generation), so two writers of one group (a server and the rebalance job, or two gateways) are
  arbitrated by the same rule: the second commit on a stale snapshot is refused.
- `coord-<g>`: group g's coordinator epoch in `_system/consumer_offsets`. A gateway taking g over
  commits epoch + 1 (an empty commit); every offset commit it makes for g checks the epoch is still
  its own and carries it, so a commit racing a takeover is refused by the same rule, and one after
  it sees the newer epoch: a stale coordinator never writes an offset.

Concurrency contract: reads are of the table object's snapshot (callers refresh it); a txn is
written only inside the commit that carries the data it describes, never on its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from deltalake import DeltaTable, Transaction

from delta_log.core.producer import ProducerSequence, ProducerState

_HW_PREFIX = "hw-"


def hw_app_id(partition: int) -> str:
    return f"{_HW_PREFIX}{partition}"


def sequence_app_id(producer_id: str, partition: int) -> str:
    return f"p-{producer_id}-{partition}"


def base_offset_app_id(producer_id: str, partition: int) -> str:
    return f"o-{producer_id}-{partition}"


def group_app_id(group: str) -> str:
    return f"group-{group}"


def coordinator_app_id(group: str) -> str:
    return f"coord-{group}"


def read_coordinator_epoch(dt: DeltaTable, group: str) -> int:
    """Group's coordinator epoch as of `dt`'s snapshot (0: never claimed)."""
    version = dt.transaction_version(coordinator_app_id(group))
    return int(version) if version is not None else 0


def coordinator_transactions(group: str, epoch: int) -> list[Transaction]:
    return [Transaction(coordinator_app_id(group), epoch)]


def read_high_watermark(dt: DeltaTable, partition: int) -> int:
    """Next offset to assign in `partition` as of `dt`'s snapshot (0 for a partition never written)."""
    version = dt.transaction_version(hw_app_id(partition))
    return int(version) if version is not None else 0


def read_high_watermarks(dt: DeltaTable, partitions: int | Iterable[int]) -> dict[int, int]:
    """High watermarks of `range(partitions)` (an int) or of the given partitions."""
    which = range(partitions) if isinstance(partitions, int) else partitions
    return {p: read_high_watermark(dt, p) for p in which}


def high_watermarks_written(log_entries: Iterable[str]) -> dict[int, int]:
    """The `hw-<p>` txns in Delta commit entries (JSON lines), in commit order: the high
    watermarks those commits set. A reader applies them to the snapshot it had, instead of
    asking the table for every partition (one call per partition: seconds at 10,000)."""
    out: dict[int, int] = {}
    for entry in log_entries:
        for line in entry.splitlines():
            if '"txn"' not in line:
                continue
            txn = json.loads(line).get("txn")
            if txn and str(txn.get("appId", "")).startswith(_HW_PREFIX):
                out[int(txn["appId"][len(_HW_PREFIX) :])] = int(txn["version"])
    return out


def read_producer_state(dt: DeltaTable, producer_id: str, partition: int) -> ProducerState | None:
    """What the log holds for one producer on one partition, or None if it never committed there."""
    last = dt.transaction_version(sequence_app_id(producer_id, partition))
    if last is None:
        return None
    base = dt.transaction_version(base_offset_app_id(producer_id, partition))
    return ProducerState(last_sequence=int(last), base_offset=int(base) if base is not None else -1)


def append_transactions(
    new_high_watermarks: Mapping[int, int],
    producer_ranges: Iterable[tuple[ProducerSequence, int, int]] = (),
) -> list[Transaction]:
    """The txns of one append commit: every touched partition's new high watermark, and for each
    (producer, partition, base offset) the producer's sequence and base offset. Later entries of
    one producer overwrite earlier ones (its highest sequence in the commit wins)."""
    versions = {hw_app_id(p): hw for p, hw in new_high_watermarks.items()}
    for producer, partition, base_offset in producer_ranges:
        versions[sequence_app_id(producer.producer_id, partition)] = producer.sequence
        versions[base_offset_app_id(producer.producer_id, partition)] = base_offset
    return [Transaction(app_id, v) for app_id, v in versions.items()]


def high_watermark_transactions(high_watermarks: Mapping[int, int]) -> list[Transaction]:
    """Txns setting high watermarks without producer state (replication)."""
    return append_transactions(high_watermarks)


def group_transactions(generations: Mapping[str, int]) -> list[Transaction]:
    """One `group-<g>` txn per group (version = its generation, never negative)."""
    return [Transaction(group_app_id(g), max(0, gen)) for g, gen in generations.items()]
