import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delta_log.core.group_rules import GROUP_ID_PATTERN, MAX_GROUP_ID_LENGTH, validate_group_id
from delta_log.core.topic_config import (
    MAX_TOPIC_NAME_LENGTH,
    TOPIC_NAME_PATTERN,
    TopicConfig,
    validate_config,
    validate_partitions,
    validate_topic_name,
)
from delta_log.errors import InvalidConfigError, InvalidGroupError, InvalidPartitionsError, InvalidTopicError


@pytest.mark.parametrize("name", ["orders", "a", "A.b_c-9", "x" * 249])
def test_legal_names(name):
    assert validate_topic_name(name) == name


@pytest.mark.parametrize("name", ["", ".", "..", "x" * 250, "a b", "a/b", "ü", "a:b", None, 3])
def test_illegal_names(name):
    with pytest.raises(InvalidTopicError) as e:
        validate_topic_name(name)
    assert e.value.code == "INVALID_TOPIC"


@given(st.text(min_size=1, max_size=300))
def test_names_accepted_iff_kafka_legal(name):
    legal = (
        len(name) <= 249 and name not in {".", ".."} and all(c.isascii() and (c.isalnum() or c in "._-") for c in name)
    )
    try:
        validate_topic_name(name)
        assert legal
    except InvalidTopicError:
        assert not legal


@pytest.mark.parametrize("n", [0, -1, 10_001, True, "3", 1.5])
def test_bad_partitions(n):
    with pytest.raises(InvalidPartitionsError):
        validate_partitions(n)


@pytest.mark.parametrize(
    "cfg",
    [
        {"nope": "1"},
        {"retention.ms": "abc"},
        {"retention.ms": -2},
        {"cleanup.policy": "forever"},
        {"max.message.bytes": 0},
        {"message.timestamp.type": "Now"},
    ],
)
def test_bad_config(cfg):
    with pytest.raises(InvalidConfigError):
        validate_config(cfg)


def test_config_roundtrip_through_properties():
    cfg = TopicConfig(
        partitions=4,
        values={
            **TopicConfig(partitions=1).values,
            **validate_config({"retention.ms": 1000, "cleanup.policy": "compact, delete"}),
        },
    )
    back = TopicConfig.from_properties(cfg.to_properties() | {"delta.checkpointInterval": "100"})
    assert back == cfg and back.retention_ms == 1000 and back.cleanup_policy == "compact,delete"


# The OpenAPI patterns say exactly what the validators accept.
def _accepts(validate, error, value) -> bool:
    try:
        validate(value)
        return True
    except error:
        return False


@given(st.one_of(st.text(alphabet="ab._-/ é", max_size=6), st.sampled_from([".", "..", "...", ".a", "a.", "-"])))
def test_topic_name_pattern_matches_the_validator(name):
    by_pattern = bool(re.fullmatch(TOPIC_NAME_PATTERN, name)) and len(name) <= MAX_TOPIC_NAME_LENGTH
    assert by_pattern == _accepts(validate_topic_name, InvalidTopicError, name)


@given(st.text(alphabet="ab/\\\x00 é.", max_size=6))
def test_group_id_pattern_matches_the_validator(group):
    by_pattern = bool(re.fullmatch(GROUP_ID_PATTERN, group)) and len(group) <= MAX_GROUP_ID_LENGTH
    assert by_pattern == _accepts(validate_group_id, InvalidGroupError, group)
