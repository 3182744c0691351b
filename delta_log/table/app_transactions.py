"""The app-transaction protocol: what topiclake keeps in Delta's `txn` actions, and the only module
that reads them (`DeltaTable.transaction_version`).

Topic tables
- `hw-<p>`: partition p's high watermark (Kafka's meaning: the next offset to assign). Every commit
  that appends to p writes it; delta-rs refuses a commit whose txn app id changed since the
  committing table object's read version, so two writers never hand out one offset.
- `p-<producer>-<p>`: an idempotent producer's last committed sequence on partition p.
- `o-<producer>-<p>`: the base offset that sequence got on p (a retry is answered with it).
- `lease-<p>`, `holder-<p>`: of a `log` topic (write-ahead acks), when the lease of partition p
  ends (wall-clock ms) and which gateway holds it (`holder_number` of its write-ahead owner id).
  Only the holder acks records of p, and only until its lease ends; a gateway claims p by
  replaying the others' write-ahead logs and committing the pair with `hw-<p>` (so a claim and an
  append refuse each other); every flush renews it. Any other append to p waits until it ends.

System tables
- `group-<g>`: every row of consumer group g in `_system/consumer_groups` carries it (version =
  generation), so two writers of one group (a server and the rebalance job, or two gateways) are
  arbitrated by the same rule: the second commit on a stale snapshot is refused.
- `coord-<g>`: group g's coordinator epoch in `_system/consumer_offsets`. A gateway taking g over
  commits epoch + 1 (an empty commit); every offset commit it makes for g checks the epoch is still
  its own and carries it, so a commit racing a takeover is refused by the same rule, and one after
  it sees the newer epoch: a stale coordinator never writes an offset.

Concurrency contract: reads are of the table object's snapshot (callers refresh it); a txn is
written only inside the commit that carries the data it describes (claims of a group or a
partition are commits of their own).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from deltalake import DeltaTable, Transaction

from delta_log.core.producer import ProducerSequence, ProducerState

_HW_PREFIX = "hw-"


def hw_app_id(partition: int) -> str:
    return f"{_HW_PREFIX}{partition}"


def sequence_app_id(producer_id: str, partition: int) -> str:
    return f"p-{producer_id}-{partition}"


def base_offset_app_id(producer_id: str, partition: int) -> str:
    return f"o-{producer_id}-{partition}"


def lease_app_id(partition: int) -> str:
    return f"lease-{partition}"


def holder_app_id(partition: int) -> str:
    return f"holder-{partition}"


def holder_number(owner: str) -> int:
    """A gateway's write-ahead owner id as a txn version (62 bits of its SHA-256)."""
    return int.from_bytes(hashlib.sha256(owner.encode()).digest()[:8], "big") >> 2


@dataclass(frozen=True, slots=True)
class Lease:
    holder: int
    expires_ms: int

    def held(self, now_ms: int, gone: Collection[int] = ()) -> bool:
        """Whether the lease binds at `now_ms`: it has not ended, and its holder is not among
        `gone` (gateways known to have died: their leases bind no one)."""
        return self.expires_ms > now_ms and self.holder not in gone

    def held_by_other(self, holder: int, now_ms: int, gone: Collection[int] = ()) -> bool:
        return self.holder != holder and self.held(now_ms, gone)

    def lapsed(self, now_ms: int, gone: Collection[int] = ()) -> bool:
        """Whether the lease was taken and no longer binds without having been ended (its holder
        died or stalled; its log may hold acked records the table lacks)."""
        return self.expires_ms > 0 and not self.held(now_ms, gone)


def read_lease(dt: TxnSource, partition: int) -> Lease | None:
    expires = dt.transaction_version(lease_app_id(partition))
    holder = dt.transaction_version(holder_app_id(partition))
    return None if expires is None or holder is None else Lease(int(holder), int(expires))


def lease_transactions(partitions: Iterable[int], holder: int, expires_ms: int) -> list[Transaction]:
    return [
        t for p in partitions for t in (Transaction(lease_app_id(p), expires_ms), Transaction(holder_app_id(p), holder))
    ]


def partition_of(app_id: str) -> int | None:
    """The partition a topic table's txn is about (None: not a per-partition one)."""
    head, _, tail = app_id.rpartition("-")
    return int(tail) if head and tail.isdigit() else None


def group_app_id(group: str) -> str:
    return f"group-{group}"


def coordinator_app_id(group: str) -> str:
    return f"coord-{group}"


class TxnSource(Protocol):
    """What the readers below need: a DeltaTable, or a TransactionCache over one."""

    def transaction_version(self, app_id: str) -> int | None: ...


def read_coordinator_epoch(dt: TxnSource, group: str) -> int:
    """Group's coordinator epoch as of `dt`'s snapshot (0: never claimed)."""
    version = dt.transaction_version(coordinator_app_id(group))
    return int(version) if version is not None else 0


def coordinator_transactions(group: str, epoch: int) -> list[Transaction]:
    return [Transaction(coordinator_app_id(group), epoch)]


def read_high_watermark(dt: TxnSource, partition: int) -> int:
    """Next offset to assign in `partition` as of `dt`'s snapshot (0 for a partition never written)."""
    version = dt.transaction_version(hw_app_id(partition))
    return int(version) if version is not None else 0


def read_high_watermarks(dt: TxnSource, partitions: int | Iterable[int]) -> dict[int, int]:
    """High watermarks of `range(partitions)` (an int) or of the given partitions."""
    which = range(partitions) if isinstance(partitions, int) else partitions
    return {p: read_high_watermark(dt, p) for p in which}


def transactions_written(log_entries: Iterable[str]) -> dict[str, int]:
    """Every txn in Delta commit entries (JSON lines), in commit order: app id -> the last version
    those commits set."""
    out: dict[str, int] = {}
    for entry in log_entries:
        for line in entry.splitlines():
            if '"txn"' not in line:
                continue
            txn = json.loads(line).get("txn")
            if txn and "appId" in txn:
                out[str(txn["appId"])] = int(txn["version"])
    return out


def high_watermarks_written(log_entries: Iterable[str]) -> dict[int, int]:
    """The `hw-<p>` txns in Delta commit entries, in commit order: the high watermarks those
    commits set. A reader applies them to the snapshot it had, instead of asking the table for
    every partition (one call per partition: seconds at 10,000)."""
    return {
        int(app_id[len(_HW_PREFIX) :]): version
        for app_id, version in transactions_written(log_entries).items()
        if app_id.startswith(_HW_PREFIX)
    }


#: Past this many new versions, catching up re-reads the table instead of the commits in between.
MAX_INCREMENTAL_VERSIONS = 64


class TransactionCache:
    """`transaction_version` of a table object, remembered across its versions.

    Each `DeltaTable.transaction_version` call replays the snapshot's txns: about 0.2 ms alone,
    and on a loaded gateway every call also gives the GIL away and waits to get it back (measured:
    a third of the flush thread's time went to the 8 high watermarks of one topic). Values read
    once are kept; when the table object moves, the txns of the commits in between are applied from
    their log entries (`read_entries`, as the reader's snapshots do). Everything is forgotten when
    those entries are gone (log cleanup) or more than `max_versions`, when there is no
    `read_entries` (object stores: the entries are GETs, while the table object holds the txns in
    memory), when it holds `max_entries`, and when the table object is another one or the table
    another table (re-opened; deleted and created again: versions start over).

    Invariant (the writer's offsets depend on it): every value kept is the table's as of the
    version followed (`dt.version()`, or the `version` its owner gives when it commits without
    moving the table object). A value from an OLDER version would not be refused by Delta's txn
    rule (it only checks commits after the planned version): it would hand out offsets twice. Values
    not kept are read from the table object, whose version may trail the one followed: every txn
    written in between is kept (from the owner's commits, or their entries), so what it answers for
    the others is still current; starting over first brings it up (`sync`), and the owner checks
    that the version it planned on did not move meanwhile.

    Concurrency contract: one thread at a time, like the table object it follows. `table` returns
    the current object (its owner may re-open it).
    """

    def __init__(
        self,
        table: Callable[[], DeltaTable],
        read_entries: Callable[[range], list[str] | None] | None,
        *,
        max_versions: int = MAX_INCREMENTAL_VERSIONS,
        max_entries: int = 65_536,
        version: Callable[[], int] | None = None,
        sync: Callable[[], None] | None = None,
    ) -> None:
        self._table = table
        self._read_entries = read_entries
        # The version to follow, when its owner commits without moving the table object (which
        # then trails it), and how to bring the table object up to it before reading from it.
        self._version_of = version
        self._sync = sync
        self._max_versions = max_versions
        self._max_entries = max_entries  # idempotent producers come and go: start over past this
        self._version: int | None = None
        self._object: DeltaTable | None = None
        self._table_id: str | None = None
        self._known: dict[str, int | None] = {}

    def transaction_version(self, app_id: str) -> int | None:
        dt = self._table()
        if dt is not self._object:
            self._object, self._version = dt, None
        self._catch_up(dt)
        if app_id not in self._known:
            if len(self._known) >= self._max_entries:
                self._start_over()
                dt = self._table()
            version = dt.transaction_version(app_id)
            self._known[app_id] = None if version is None else int(version)
        return self._known[app_id]

    def committed(self, read_version: int, version: int, txns: Iterable[Transaction]) -> None:
        """The table object moved from `read_version` to `version` by one commit of ours that
        wrote `txns`: no entry needs reading when nothing else committed in between."""
        if self._version == read_version and version == read_version + 1:
            self._known.update({t.app_id: int(t.version) for t in txns})
            self._version = version

    def _current(self, dt: DeltaTable) -> int:
        return dt.version() if self._version_of is None else self._version_of()

    def _start_over(self) -> None:
        """Forget every value, and read them again from the table object, brought to the version
        followed first: values it holds from an older version may be stale."""
        self._known.clear()
        dt = self._table()
        if self._sync is not None and dt.version() != self._current(dt):
            self._sync()
            dt = self._table()
        self._object, self._version = dt, self._current(dt)

    def _catch_up(self, dt: DeltaTable) -> None:
        version = self._current(dt)
        if self._version == version:
            return
        table_id = str(dt.metadata().id)
        same_table = table_id == self._table_id
        self._table_id = table_id
        if (
            same_table
            and self._read_entries is not None
            and self._version is not None
            and 0 < version - self._version <= self._max_versions
            and len(self._known) < self._max_entries
        ):
            entries = self._read_entries(range(self._version + 1, version + 1))
            if entries is not None:
                self._known.update(transactions_written(entries))
                self._version = version
                return
        self._start_over()


def read_producer_state(dt: TxnSource, producer_id: str, partition: int) -> ProducerState | None:
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
