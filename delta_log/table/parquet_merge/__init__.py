"""Parquet files merged by copying their encoded column chunks (the roll-up's fast path).

The work is done by `_native`, a Rust extension (PyO3, parquet-rs) built from this folder's crate
by `make setup`; see `src/lib.rs` for what `merge` promises and when it refuses.
"""

import importlib
from collections.abc import Callable

# Loaded by name: import-linter finds no source for an extension module and would read a plain
# import of it as an import of the whole `delta_log` package (and so of the rooms above this one).
_native = importlib.import_module("delta_log.table.parquet_merge._native")

#: merge(inputs, output, stats_columns, required_key, required_value, order_column, min_group_rows,
#: min_group_bytes) -> (size, rows, stats per stats column: (min, max, null count))
merge: Callable[
    [list[str], str, list[str], str, str, str, int, int], tuple[int, int, list[tuple[int | None, int | None, int]]]
]
merge = _native.merge

__all__ = ["merge"]
