"""One logging set-up for every process of the service (the proxy, `rtvideo serve`, the model).

Log lines carry client text (event ids, prompts, messages quoted in errors). A client must
not be able to forge log lines or flood the log, so every message is escaped (control
characters, line breaks, unpaired surrogates) and cut to a bounded length; tracebacks,
which come from our own code, keep their lines.
"""

from __future__ import annotations

import json
import logging
import sys

#: longest message kept whole (prompts are at most 4096 characters; config lines quote one)
MAX_MESSAGE_CHARS = 6000
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def escape(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """One printable line: JSON string escapes for control characters, cut at `limit`."""
    if len(text) > limit:
        text = f"{text[:limit]}…(+{len(text) - limit} chars)"
    if text.isprintable():
        return text
    escaped = json.dumps(text, ensure_ascii=False)[1:-1]
    return escaped.encode("utf-8", "backslashreplace").decode("utf-8")


class SafeFormatter(logging.Formatter):
    """A formatter whose message part is always one escaped, bounded line."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape(record.message)
        return super().formatMessage(record)


def configure(level: str | int = "INFO", stream: object = None) -> None:
    """Root logging to standard error (or `stream`) through `SafeFormatter`."""
    handler = logging.StreamHandler(stream or sys.stderr)  # type: ignore[arg-type]
    handler.setFormatter(SafeFormatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
