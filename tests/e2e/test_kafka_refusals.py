"""Every API of the Kafka listener, asked by a key of each kind (none, describe, consume, produce,
a topic owner, an admin), answers as Kafka 4.3.1 with its StandardAuthorizer and the same rights
answered (tests/e2e/refusal_probe.py; Kafka's answers recorded in kafka_refusals.json, refreshed
with `python -m tests.e2e.refusal_probe --record`): the same error codes at every level, the same
resources listed, the same authorized operations, a record set where Kafka sends one."""

from __future__ import annotations

import json

from tests.e2e.refusal_probe import PRINCIPALS, RECORDED, differences, topiclake_answers


def test_every_api_refuses_and_answers_each_kind_of_key_as_kafka_does(tmp_path):
    expected = json.loads(RECORDED.read_text())
    # what the recording holds: each principal, refusals at every level, and granted answers
    assert {k.split("|")[0] for k in expected} == set(PRINCIPALS)
    assert expected["nobody|Fetch"]["responses[orders-a]/partitions[0]/error_code"] == 29
    assert expected["consumer|Fetch"]["responses[orders-a]/partitions[0]/records"] == "some"
    assert expected["owner|ElectLeaders"]["error_code"] == 31
    assert expected["monitor|Metadata"]["topics[orders-a]/topic_authorized_operations"] == 1280
    got = topiclake_answers(tmp_path)
    assert set(got) == set(expected)
    assert differences(expected, got) == []
