import base64
import json

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from delta_log.errors import InvalidRecordError, InvalidSchemaError
from ingest_gateway.decoding import decode_arrow, decode_json, decode_ndjson
from ingest_gateway.kit.errors import MalformedRequestError


def body(records, **extra):
    return json.dumps({"records": records, **extra}).encode()


def test_json_formats():
    t = decode_json(
        body(
            [
                {"key": "k", "value": {"a": 1}, "headers": {"h": "v"}, "timestamp": 1000},
                {
                    "value": None,
                    "partition": 2,
                    "timestamp": "2024-01-01T00:00:00Z",
                    "headers": [{"key": "x", "value": None}],
                },
            ]
        )
    )
    assert t.column("key").to_pylist() == [b"k", None]
    assert t.column("value").to_pylist() == [b'{"a":1}', None]
    assert t.column("partition").to_pylist() == [None, 2]
    assert t.column("timestamp").cast(pa.int64()).to_pylist() == [1_000_000, 1_704_067_200_000_000]
    assert t.column("headers").to_pylist()[0] == [{"key": "h", "value": b"v"}]
    t = decode_json(body([{"value": base64.b64encode(b"\x00\x01").decode()}], value_format="binary"))
    assert t.column("value").to_pylist() == [b"\x00\x01"]


@pytest.mark.parametrize(
    ("payload", "error", "index"),
    [
        (b"{not json", MalformedRequestError, None),
        (b"[]", MalformedRequestError, None),
        (json.dumps({"records": [], "extra": 1}).encode(), MalformedRequestError, None),
        (body([]), InvalidRecordError, None),
        (body([{"value": 1}, {"key": "k"}]), InvalidRecordError, 1),
        (body([{"value": 1}, {"value": 1, "bogus": 2}]), InvalidRecordError, 1),
        (body([{"value": 1, "partition": "x"}]), InvalidRecordError, 0),
        (body([{"value": 1}, {"value": 1, "timestamp": "yesterday"}]), InvalidRecordError, 1),
        (body([{"value": 5}], value_format="string"), InvalidRecordError, 0),
        (body([{"value": "***"}], value_format="binary"), InvalidRecordError, 0),
        (body([{"value": 1}], value_format="xml"), MalformedRequestError, None),
    ],
)
def test_json_errors_name_the_record(payload, error, index):
    with pytest.raises(error) as e:
        decode_json(payload)
    if index is not None:
        assert e.value.details["index"] == index
        assert f"Record {index}" in e.value.message


def test_ndjson_names_bad_line():
    t = decode_ndjson(b'{"value": 1}\n\n{"value": 2, "key": "k"}\n')
    assert t.num_rows == 2
    with pytest.raises(MalformedRequestError) as e:
        decode_ndjson(b'{"value": 1}\n{"value": \n')
    assert e.value.details == {"index": 1, "line": 2}


def arrow_bytes(table):
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def test_arrow_accepts_strings_and_ms_timestamps():
    t = decode_arrow(arrow_bytes(pa.table({"key": ["a"], "value": ["b"], "timestamp": pa.array([5], pa.int64())})))
    assert t.column("key").to_pylist() == [b"a"] and t.column("value").to_pylist() == [b"b"]
    assert t.column("timestamp").cast(pa.int64()).to_pylist() == [5000]


@pytest.mark.parametrize(
    ("table", "error"),
    [
        (pa.table({"key": [b"a"]}), InvalidSchemaError),
        (pa.table({"value": [b"a"], "nope": [1]}), InvalidSchemaError),
        (pa.table({"value": [b"a"], "headers": [1]}), InvalidSchemaError),
    ],
)
def test_arrow_schema_errors(table, error):
    with pytest.raises(error):
        decode_arrow(arrow_bytes(table))


def test_arrow_garbage():
    with pytest.raises(MalformedRequestError):
        decode_arrow(b"definitely not arrow")
