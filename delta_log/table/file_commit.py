"""Committing file changes (roll-up, retention) safely beside live writers.

delta-rs's internal commit retry does not refuse a remove of a file another commit removed
meanwhile (measured: two roll-ups of one run both committed, doubling records). So file-changing
commits are made on a version where every file they remove was checked to be live: on local disk
they write their log entry themselves (delta_log.table.log_entries), past later versions only if
none of those removed one of the same files; elsewhere through delta-rs with no internal retry, on
that exact version, any commit in between failing the attempt. They never touch `hw-<p>`
transactions, so producers' commits are not refused because of them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties
from deltalake.exceptions import CommitFailedError, DeltaError
from deltalake.transaction import AddAction, RemoveAction

from delta_log.core.records import TOPIC_SCHEMA
from delta_log.errors import SourcesGoneError
from delta_log.table import log_entries
from delta_log.table.log_entries import (
    append_entry,
    checkpoint_interval,
    crosses_checkpoint,
    local_log_dir,
    plain_protocol,
)

log = logging.getLogger(__name__)


def commit_file_changes(
    dt: DeltaTable,
    removes: Iterable[str],
    actions: list[AddAction | RemoveAction],
    *,
    operation: str,
    attempts: int,
) -> None:
    """Commit `actions` only on a version where every path in `removes` is live.

    Raises: SourcesGoneError.
    """
    wanted = set(removes)
    log_dir = local_log_dir(dt.table_uri)
    for _ in range(attempts):
        dt.update_incremental()
        live = set(pa.table(dt.get_add_actions(flatten=True)).column("path").to_pylist())
        if not wanted <= live:
            raise SourcesGoneError("a file to remove was removed by another commit")
        # delta.appendOnly tables refuse removes that change data: delta-rs says so
        append_only = dt.metadata().configuration.get("delta.appendOnly", "false").lower() == "true"
        try:
            if (
                log_dir is not None
                and plain_protocol(dt)
                and not (append_only and any(isinstance(a, RemoveAction) and a.data_change for a in actions))
            ):
                # the entry ourselves (delta_log.table.log_entries), after versions that removed none of
                # these files: beside a writer committing every few ms, a commit that must land on
                # the exact version it checked would hardly ever win
                read_version = dt.version()
                version = commit_own_file_changes(
                    log_dir, read_version, wanted, actions, operation=operation, attempts=attempts
                )
                _after_own_commit(dt, read_version, version)
                return
            dt.create_write_transaction(
                actions,
                "append",
                TOPIC_SCHEMA,
                partition_by=["partition"],
                commit_properties=CommitProperties(
                    custom_metadata={"topiclake.operation": operation}, max_commit_retries=0
                ),
                post_commithook_properties=PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False),
            )
        except CommitFailedError:
            continue
        dt.update_incremental()
        return
    raise SourcesGoneError("too many concurrent commits")


def commit_own_file_changes(
    log_dir: str,
    read_version: int,
    removes: Iterable[str],
    actions: list[AddAction | RemoveAction],
    *,
    operation: str,
    attempts: int,
) -> int:
    """Write the log entry of `actions` (file changes, no txn) as the first free version after
    `read_version`, where every path in `removes` was live, past later versions only if none of
    them removed one of those paths (local disk, a plain protocol). Returns the version.

    Raises: CommitFailedError (a later version removed one), StaleVersionError, OSError."""
    entry = append_entry(actions, [], {"topiclake.operation": operation}, partition_by=["partition"])
    return log_entries.commit(log_dir, read_version, entry, removed=frozenset(removes), attempts=attempts)


def _after_own_commit(dt: DeltaTable, read_version: int, version: int) -> None:
    """The committed version is final: bring `dt` to it, and checkpoint when the commit crossed a
    multiple of the interval (as delta-rs's post-commit hook would). A failure here is logged, never
    raised: the caller would take the commit for failed and delete the files it references."""
    try:
        dt.update_incremental()
        if crosses_checkpoint(read_version, version, checkpoint_interval(dt)):
            dt.create_checkpoint()
    except (DeltaError, OSError) as exc:
        log.warning("after a committed file change of %s (version %d): %s", dt.table_uri, version, exc)
