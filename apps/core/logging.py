"""Structured logging helpers: the current request id travels in a context variable into every log record."""

from __future__ import annotations

import logging
from contextvars import ContextVar

_request_id: ContextVar[str] = ContextVar("request_id", default="-")


def current_request_id() -> str:
    return _request_id.get()


def set_request_id(value: str):
    return _request_id.set(value)


def reset_request_id(token) -> None:
    _request_id.reset(token)


class RequestContextFilter(logging.Filter):
    """Adds ``request_id`` to every record so JSON logs of one request can be joined."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = _request_id.get()
        return True
