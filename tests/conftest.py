"""Markers by directory: unit, integration, spark, e2e."""

from __future__ import annotations

import pathlib

import pytest

_MARKS = {"integration": "integration", "spark": "spark", "e2e": "e2e"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = pathlib.Path(str(item.fspath)).parts
        for folder, mark in _MARKS.items():
            if folder in parts:
                item.add_marker(getattr(pytest.mark, mark))
