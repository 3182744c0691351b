"""Committing file changes (roll-up, retention) safely beside live writers.

delta-rs's internal commit retry does not refuse a remove of a file another commit removed
meanwhile (measured: two roll-ups of one run both committed, doubling records). So file-changing
commits are made with no internal retry, on the exact version where every file they remove was
checked to be live; any commit in between fails the attempt and the check runs again. They never
touch `hw-<p>` transactions, so producers' commits are not refused because of them.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, RemoveAction

from delta_log.core.records import TOPIC_SCHEMA
from delta_log.errors import SourcesGoneError


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
    for _ in range(attempts):
        dt.update_incremental()
        live = set(pa.table(dt.get_add_actions(flatten=True)).column("path").to_pylist())
        if not wanted <= live:
            raise SourcesGoneError("a file to remove was removed by another commit")
        try:
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
