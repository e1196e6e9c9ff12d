"""SQL that one app lends another: a fragment and the values of its placeholders.

An app owns its tables (issue 29): another app never writes their names. Where one statement must still read
across apps (a list scoped by the caller's memberships, a lock and a membership read in one round trip), the owner
exports a function returning a ``SqlFragment``; the borrower places ``fragment.sql`` in its statement and
``fragment.params`` among its parameters, at the fragment's place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SqlFragment:
    """A piece of SQL (a table expression, a scalar subquery or a condition) with the values its ``%s``
    placeholders take, in order."""

    sql: str
    params: tuple[Any, ...] = ()
