"""Log set-up: plain text (the default) or one JSON object a line (``--log-format json``).

A JSON line carries the time, level, logger, message and the broker's node id, and, where the
record is about one, its ``topic``/``partition``/``group``. Those come from the record's
``extra`` (``log.info(..., extra=about(tp))``) or from ``log_context``, a context variable that
tasks inherit: a group's coordinator sets it once and every log line of that group's tasks
carries the group. Log collectors (Loki, Elasticsearch, Cloud Logging) index these fields
without parsing messages.
"""

from __future__ import annotations

import contextvars
import json
import logging
import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from kafscale.broker.config import LogFormat

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FIELDS = ("topic", "partition", "group")

log_context: contextvars.ContextVar[Mapping[str, object]] = contextvars.ContextVar(
    "kafscale_log_context", default=MappingProxyType({})
)
_process: dict[str, object] = {}


def set_node_id(node_id: int) -> None:
    """The broker id every later line of this process carries (known once registered)."""
    _process["node_id"] = node_id


def about(tp: tuple[str, int] | None = None, group: str | None = None) -> dict[str, object]:
    """``extra=`` for a record about one partition or group."""
    fields: dict[str, object] = {}
    if tp is not None:
        fields["topic"], fields["partition"] = tp
    if group is not None:
        fields["group"] = group
    return fields


def bind(**fields: object) -> None:
    """Add ``fields`` to this task's log context (and to the tasks it starts from now on)."""
    log_context.set({**log_context.get(), **fields})


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(_process)
        line.update(log_context.get())
        for name in FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def setup_logging(level: str, log_format: LogFormat) -> None:
    """Configure the root logger once for the process."""
    handler = logging.StreamHandler()
    if log_format is LogFormat.JSON:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
