"""Pages of a named list (pure): what `GET /topics` and `GET /groups` answer a console with
10,000 topics or 1,000 groups, one page at a time."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def page_of(
    items: Iterable[T], name: Callable[[T], str], *, search: str = "", after: str = "", limit: int | None = None
) -> tuple[list[T], str | None]:
    """`items` sorted by name: those whose name contains `search` (any case) and sorts after
    `after`, at most `limit` of them; and the name to pass as `after` for the next page (None: this
    is the last page)."""
    needle = search.lower()
    found = sorted((i for i in items if name(i) > after and needle in name(i).lower()), key=name)
    if limit is not None and len(found) > limit:
        return found[:limit], name(found[limit - 1])
    return found, None
