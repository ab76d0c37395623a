"""How an rlog process writes its log: one line of text per record (the default), or one
JSON object per line (`--log-format json`, or RLOG_LOG_FORMAT=json) for pipelines that index
fields (Loki, Elasticsearch, Cloud Logging) instead of parsing text.

The JSON comes from python-json-logger, the formatter kopf itself uses for its JSON logs, so
the operator's lines and its replicas' lines have one shape: `time`, `level`, `logger`,
`message`, and `exc_info` with the traceback when there is one. Rejected: a hand-written
`json.dumps` of the record (escaping, exceptions and extra fields are that library's job).
"""

from __future__ import annotations

import logging
import os
from typing import Final

TEXT: Final = "text"
JSON: Final = "json"
LOG_FORMATS: Final = (TEXT, JSON)
ENV: Final = "RLOG_LOG_FORMAT"
TEXT_LAYOUT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def default_format() -> str:
    """RLOG_LOG_FORMAT if set (validated where it is used), else text."""
    return os.environ.get(ENV, TEXT) or TEXT


def check_format(name: str) -> str:
    """`name` if it is a log format; ValueError naming the choices otherwise."""
    if name not in LOG_FORMATS:
        raise ValueError(f"log format {name!r} is not one of {', '.join(LOG_FORMATS)}")
    return name


def formatter(name: str) -> logging.Formatter:
    if check_format(name) == TEXT:
        return logging.Formatter(TEXT_LAYOUT)
    from pythonjsonlogger.json import JsonFormatter

    return JsonFormatter(
        "%(asctime)s %(levelname)s %(name)s %(message)s",
        rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
    )


def configure(level: int, name: str = TEXT) -> None:
    """Send every record at `level` or above to stderr in format `name` (replacing any
    handler set before: the process's first configuration wins otherwise)."""
    handler = logging.StreamHandler()
    handler.setFormatter(formatter(name))
    logging.basicConfig(level=level, handlers=[handler], force=True)
