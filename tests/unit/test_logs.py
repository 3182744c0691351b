import json
import logging
import logging.config

from conf.logs import EscapingFormatter, escape
from conf.settings import LOGGING_JSON


def test_control_characters_are_escaped():
    assert escape("a\nFORGED\r\x1b[31m\u2028z") == "a\\nFORGED\\r\\x1b[31m\\u2028z"
    assert escape("plain ünïcode") == "plain ünïcode"


def test_a_client_string_cannot_forge_a_log_line():
    cfg = json.loads(LOGGING_JSON.read_text())
    assert cfg["formatters"]["default"]["()"] == "conf.logs.EscapingFormatter"
    record = logging.LogRecord(
        "consumer_api", logging.WARNING, __file__, 1, "group %s: %s", ("g\nINFO forged", "x"), None
    )
    line = EscapingFormatter("%(levelname)s %(message)s").format(record)
    assert "\n" not in line and line == "WARNING group g\\nINFO forged: x"
