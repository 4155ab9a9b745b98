"""One logging set-up for every process of the service (the proxy, `rtvideo serve`, the model).

Log lines carry client text (event ids, messages quoted in errors; prompts at DEBUG only,
INFO gets `prompt_summary`; correlation ids never, `sequence=` is their hash). A client must
not be able to forge log lines or flood the log, so every message is escaped (control
characters, line breaks, unpaired surrogates) and cut to a bounded length; tracebacks,
which come from our own code, keep their lines.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import TextIO

from rtvideo.triton.access import short_hash

#: longest message kept whole (prompts are at most 4096 characters; DEBUG lines quote one)
MAX_MESSAGE_CHARS = 6000
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def prompt_summary(prompt: str) -> str:
    """What an INFO line says of a prompt: its length and `short_hash`. The text itself is
    logged at DEBUG only (docs/security.md): prompts are the users' words, and logs travel."""
    return f"<{len(prompt)} chars, {short_hash(prompt)}>"


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


#: `key=value` fields that log lines carry by convention and JSON lines lift into fields
_FIELDS = re.compile(r"\b(request_id|event_id|sequence|peer)=(\S+)")
_KEYS = re.compile(r"\b(request_id|event_id|sequence|peer)=")
FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and the `request_id`, `event_id`,
    `sequence` (a correlation id's `short_hash`, never the id) and `peer` the message names
    (`key=value`) as fields of their own."""

    def format(self, record: logging.LogRecord) -> str:
        message = escape(record.getMessage())
        line: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": message,
        }
        # Only keys the code itself writes (those in the format string, before any client text);
        # a prompt or field name saying "peer=..." is client text, not a field.
        written = set(_KEYS.findall(str(record.msg)))
        for key, value in _FIELDS.findall(message):
            if key in written:
                line.setdefault(key, value)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure(level: str | int = "INFO", stream: TextIO | None = None, fmt: str = "text") -> None:
    """Root logging to standard error (or `stream`): escaped text lines, or JSON lines."""
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: use one of {', '.join(FORMATS)}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else SafeFormatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
