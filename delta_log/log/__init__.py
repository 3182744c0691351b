"""The log itself: topic catalog, writer and group commit, reader (index, tail cache, fetch)."""
