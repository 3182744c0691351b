"""Pages of a named list (pure): what `GET /topics` and `GET /groups` answer a console with
10,000 topics or 1,000 groups, one page at a time."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import islice
from typing import TypeVar

T = TypeVar("T")


def page_of(
    items: Iterable[T],
    name: Callable[[T], str],
    *,
    search: str = "",
    after: str = "",
    limit: int | None = None,
    keep: Callable[[T], bool] | None = None,
) -> tuple[list[T], str | None]:
    """`items` sorted by name: those whose name contains `search` (any case) and sorts after
    `after`, at most `limit` of them; and the name to pass as `after` for the next page (None: this
    is the last page). `keep`, a costlier check, is asked only of the items a page needs: a page
    of 50 out of 10,000 asks it about 51, not 10,000."""
    needle = search.lower()
    found = sorted((i for i in items if name(i) > after and needle in name(i).lower()), key=name)
    kept = found if keep is None else (i for i in found if keep(i))
    if limit is None:
        return list(kept), None
    page = list(islice(kept, limit + 1))
    if len(page) > limit:
        return page[:limit], name(page[limit - 1])
    return page, None
