"""Log formatting that no client can forge: every control character in a log line's message and
arguments (a newline in a group id, an ANSI escape in a path) is written escaped, so one request
can never write a line that looks like another."""

from __future__ import annotations

import logging
import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def escape(text: str) -> str:
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


class EscapingFormatter(logging.Formatter):
    """A Formatter whose message part has control characters escaped (tracebacks keep their lines)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape(record.message)
        return super().formatMessage(record)
