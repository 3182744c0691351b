"""`delta_log` re-exports its names lazily (delta_log/__init__.py): the names are listed twice there
(`__all__` for the linters, `_EXPORTS` for the imports), so a name added to one list only is caught
here, not by the first caller."""

import importlib

import pytest

import delta_log


def test_every_re_exported_name_is_in_both_lists_and_is_the_module_s_own():
    assert sorted(delta_log.__all__) == sorted(delta_log._EXPORTS)
    for name, module in delta_log._EXPORTS.items():
        assert getattr(delta_log, name) is getattr(importlib.import_module(module), name)


def test_an_unknown_name_is_an_attribute_error_and_submodules_still_import():
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        delta_log.Nothing  # noqa: B018
    from delta_log import errors

    assert errors.TopiclakeError is delta_log.TopiclakeError
