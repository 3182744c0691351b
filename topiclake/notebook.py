"""Databricks-style notebooks over topiclake: `%load_ext topiclake.notebook`.

Gives the notebook a ready `spark` (Delta and the `topiclake` source configured, topics registered
as `topics.<name>`), `display(df)` for Spark or pandas DataFrames, `refresh_topics()`, and a
`%%sql` cell magic (`%%sql` shows the result; `%%sql name` also keeps it as the DataFrame `name`).
The server URL and storage root come from TOPICLAKE_URL and TOPICLAKE_ROOT.
"""

from __future__ import annotations

import os
from typing import Any

_state: dict[str, Any] = {}


def display(obj: Any, n: int = 20) -> None:
    """Show a Spark DataFrame (first `n` rows), a pandas DataFrame, or anything IPython can show."""
    from IPython.display import display as ipy_display

    if hasattr(obj, "toPandas") and hasattr(obj, "limit"):
        obj = obj.limit(n).toPandas()
    ipy_display(obj)


def refresh_topics() -> dict[str, str]:
    """Register topics created since the notebook started; refresh topics._partitions."""
    from delta_log.spark import register_topics

    tables = register_topics(_state["spark"], _state["root"], storage_options=_state["storage_options"])
    _state["tables"] = tables
    return tables


def sql(line: str, cell: str) -> None:
    df = _state["spark"].sql(cell)
    name = line.strip()
    if name:
        _state["ipython"].push({name: df})
    if df.columns:
        display(df, n=50)


def load_ipython_extension(ipython: Any) -> None:
    from conf import load_settings
    from delta_log import StorageRoot
    from delta_log.spark import get_spark

    settings = load_settings()
    root = StorageRoot(settings.root).root  # a local root made absolute; an object-store URI as is
    spark = get_spark(settings, app_name="topiclake-notebook")
    _state.update(spark=spark, root=root, storage_options=settings.storage_options, ipython=ipython)
    refresh_topics()
    ipython.push(
        {
            "spark": spark,
            "display": display,
            "refresh_topics": refresh_topics,
            "TOPICLAKE_URL": os.environ.get("TOPICLAKE_URL", "http://127.0.0.1:8080"),
            "TOPICLAKE_ROOT": root,
        }
    )
    ipython.register_magic_function(sql, magic_kind="cell", magic_name="sql")
