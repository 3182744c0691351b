import re

from delta_log.errors import OffsetOutOfRangeError, TopiclakeError, all_error_classes


def test_every_error_has_stable_code_and_name():
    for cls in all_error_classes():
        assert cls.__name__.endswith("Error"), cls
        assert re.fullmatch(r"[A-Z][A-Z_]+", cls.code), cls
    # unique, but for a subclass that keeps its parent's (Kafka's) code with another HTTP status
    codes = [c.code for c in all_error_classes() if c.code != c.__mro__[1].__dict__.get("code")]
    assert len(codes) == len(set(codes)), "codes must be unique"


def test_offset_out_of_range_carries_bounds():
    e = OffsetOutOfRangeError(topic="t", partition=1, offset=99, log_start_offset=3, high_watermark=10)
    assert isinstance(e, TopiclakeError)
    assert e.to_dict()["details"] == {
        "topic": "t",
        "partition": 1,
        "offset": 99,
        "log_start_offset": 3,
        "high_watermark": 10,
    }
    assert "[3, 10]" in e.message and "Seek" in e.message
