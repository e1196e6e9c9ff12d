"""Structured logging helpers: the current request id travels in a context variable into every log record."""

from __future__ import annotations

import logging
import re
import uuid
from contextvars import ContextVar

_request_id: ContextVar[str] = ContextVar("request_id", default="-")


_SUPPLIED_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


def request_id_for(supplied: str) -> str:
    """The id of a request (D1): the caller's ``X-Request-ID`` when it is a safe token, else a new one."""
    return supplied if _SUPPLIED_REQUEST_ID.match(supplied) else uuid.uuid4().hex


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
