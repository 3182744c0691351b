"""The schema registry's Delta table: changes from several writers (gateways) serialized by Delta's
transaction rule, with no lock service; ids unique, versions contiguous, state read back whole."""

from __future__ import annotations

import json
import threading

import pytest

from delta_log.core.value_schemas import parse_schema
from delta_log.errors import IncompatibleSchemaError, SubjectNotSoftDeletedError
from delta_log.system.schemas import VERSION, Event, SchemaStore

pytestmark = pytest.mark.integration


def record(name: str, *fields: str):
    doc = {"type": "record", "name": name, "fields": [{"name": f, "type": "long", "default": 0} for f in fields]}
    return parse_schema("AVRO", json.dumps(doc))


def test_two_writers_race_for_ids_and_versions(storage):
    stores = [SchemaStore(storage), SchemaStore(storage)]  # as two gateways on one root
    shared = record("Shared", "a")
    results: dict[str, list[tuple[int, int]]] = {"s-0": [], "s-1": []}
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        subject = f"s-{n}"
        try:
            results[subject].append((0, stores[n].register(subject, shared).schema_id))
            for i in range(1, 8):  # each adds a defaulted field: BACKWARD compatible
                v = stores[n].register(subject, record("Shared", "a", *(f"f{j}" for j in range(i))))
                results[subject].append((v.version, v.schema_id))
        except BaseException as exc:  # pragma: no cover - shown by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors

    fresh = SchemaStore(storage).state()
    assert fresh.live("s-0")[0].schema_id == fresh.live("s-1")[0].schema_id  # one schema, one id
    for subject in ("s-0", "s-1"):
        assert [v.version for v in fresh.live(subject)] == list(range(1, 9))
    # the same evolved schemas in both subjects share ids; no id was handed out twice
    ids = {v.schema_id for s in ("s-0", "s-1") for v in fresh.live(s)}
    assert ids == set(range(1, 9))
    assert len({fresh.schemas[i].canonical for i in ids}) == len(ids)
    assert fresh.subject_schemas("s-0").latest_id == fresh.live("s-0")[-1].schema_id


def test_levels_deletes_and_reading_back(storage):
    store = SchemaStore(storage)
    v1 = store.register("orders-value", record("Order", "id"))
    breaking = parse_schema(
        "AVRO", json.dumps({"type": "record", "name": "Order", "fields": [{"name": "x", "type": "string"}]})
    )
    with pytest.raises(IncompatibleSchemaError, match="x"):
        store.register("orders-value", breaking)
    store.set_level("orders-value", "NONE")
    v2 = store.register("orders-value", breaking)
    assert (v1.version, v2.version) == (1, 2) and v2.schema_id == v1.schema_id + 1
    with pytest.raises(SubjectNotSoftDeletedError):
        store.delete_subject("orders-value", permanent=True)
    assert store.delete_version("orders-value", None, permanent=False) == 2
    again = SchemaStore(storage).state()
    assert [v.version for v in again.live("orders-value")] == [1]
    assert again.level_of("orders-value") == "NONE" and again.global_level == "BACKWARD"
    assert store.delete_subject("orders-value", permanent=False) == [1]
    assert store.delete_subject("orders-value", permanent=True) == [1, 2]
    state = SchemaStore(storage).state()
    assert "orders-value" not in state.subjects
    # ids are never handed out again, even after a permanent delete
    assert store.register("other-value", record("Other", "z")).schema_id == v2.schema_id + 1


def test_a_change_that_loses_a_race_plans_again_on_the_winners_state(storage):
    mine, other = SchemaStore(storage), SchemaStore(storage)
    plans = []

    def plan(state):
        plans.append(state.seq)
        if len(plans) == 1:  # another gateway commits between this plan and its commit
            other.register("theirs-value", record("Theirs", "b"))
        schema = record("Mine", "a")
        event = Event(
            kind=VERSION,
            subject="mine-value",
            version=1,
            schema_id=state.next_id,
            schema_type="AVRO",
            schema=schema.text,
        )
        return [event], state.next_id

    assert mine.change(plan) == 2  # id 1 went to the winner
    assert plans == [0, 1]
    state = SchemaStore(storage).state()
    assert state.live("theirs-value")[0].schema_id == 1 and state.live("mine-value")[0].schema_id == 2
