"""Logging set-up: one human format, or JSON lines for machines."""

from __future__ import annotations

import json
import logging
import sys
import time

HUMAN_FORMAT = "%(asctime)s %(levelname)-7s %(name)s[%(process)d]: %(message)s"


class JsonLinesFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 6),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)),
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": record.process,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure(level: str = "INFO", json_lines: bool = False) -> None:
    """Configure the root logger once per process (the CLI's --log-level/--log-json, which also
    read OVPOOL_LOG_LEVEL/OVPOOL_LOG_JSON)."""
    level = level.upper()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLinesFormatter() if json_lines else logging.Formatter(HUMAN_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
