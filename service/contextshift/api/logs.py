"""The server's logs: one JSON object per line on stderr (time, level, logger, pid, message, and the
record's `fields`), never message content, keys or chat ids."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and the record's `fields`."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "msg": record.getMessage(),
        }
        line.update(getattr(record, "fields", {}))
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("contextshift")
    logger.handlers[:] = [handler]
    logger.setLevel(level.upper())
    logger.propagate = False
