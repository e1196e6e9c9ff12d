"""Quotas on stored totals, enforced by PostgreSQL in the write's own transaction.

A write that adds to a counted total (definitions.COUNTED_QUOTAS) calls ``charge`` in its transaction, or embeds
``limits_charge(...)`` (the SQL function of migration 0001) in its own statement: the total moves with the write and
the write is refused, 403 ``quota_exceeded`` with ``details: {quota, limit, used}``, when it would take the total
past the user's limit. The upsert's row lock serialises one user's concurrent writers, so none overshoots. A write
that removes stored things (a delete, the expiry sweeps) credits the total the same way, in its transaction.
``members_per_conversation`` is counted, not kept: the membership write counts under the conversation's lock and
asks ``check_count``.

Locks: a transaction that moves several totals takes their rows in (quota, user) order (``charge`` sorts; ``credit``
locks in that order first), so two writers never wait on each other's rows in a cycle.

Drift: every path that adds or removes a counted thing moves its total in the same transaction, so the totals stay
exact; data written before this app existed (or changed by hand in the database) is not counted until
``manage.py limits recount`` rebuilds the totals from the data, under the same row locks (exact while writes go on).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from django.db import DatabaseError, connection, transaction

from apps.core import errors, metrics
from apps.limits import config
from apps.limits.definitions import COUNTED_QUOTAS, QUOTAS

logger = logging.getLogger(__name__)

# The SQLSTATE limits_charge raises with (migration 0001).
QUOTA_SQLSTATE = "ML001"
CHARGE_SQL = "SELECT limits_charge(%s, %s::text[], %s::bigint[], %s::bigint[])"


def limits_for(user_id: str, quotas: Iterable[str]) -> list[int]:
    """The user's limits of ``quotas``, in order: the last argument of ``limits_charge``."""
    return [config.quota(user_id, name) for name in quotas]


def charge(user_id: str | None, **deltas: int) -> None:
    """Move ``user_id``'s totals by ``deltas`` (quota name → change) inside the caller's transaction; 403
    ``quota_exceeded`` (the transaction then rolls back with the error) when an increase would pass a limit."""
    items = sorted((name, delta) for name, delta in deltas.items() if delta)
    if user_id is None or not items:
        return
    if not connection.in_atomic_block:
        raise RuntimeError("limits.charge outside a transaction: the total would not move with the write")
    names = [name for name, _ in items]
    try:
        with connection.cursor() as cursor:
            cursor.execute(CHARGE_SQL, [user_id, names, [delta for _, delta in items], limits_for(user_id, names)])
    except DatabaseError as exc:
        raise_if_refused(exc)
        raise


def credit(rows: Iterable[tuple[str, str, int]]) -> None:
    """Lower totals, ``rows`` of (user_id, quota, amount removed), inside the caller's transaction: what a delete or
    an expiry sweep removed. The rows are locked in (quota, user) order before they change."""
    totals: dict[tuple[str, str], int] = {}
    for user_id, name, amount in rows:
        if user_id is not None and amount:
            totals[(name, user_id)] = totals.get((name, user_id), 0) + amount
    if not totals:
        return
    order = sorted(totals)
    quotas, users, amounts = [q for q, _ in order], [u for _, u in order], [totals[key] for key in order]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM limits_usage u JOIN unnest(%s::text[], %s::text[]) AS t(quota, user_id) "
            "ON u.quota = t.quota AND u.user_id = t.user_id ORDER BY u.quota, u.user_id FOR UPDATE OF u",
            [quotas, users],
        )
        cursor.execute(
            "UPDATE limits_usage u SET used = greatest(u.used - t.amount, 0) "
            "FROM unnest(%s::text[], %s::text[], %s::bigint[]) AS t(quota, user_id, amount) "
            "WHERE u.quota = t.quota AND u.user_id = t.user_id",
            [quotas, users, amounts],
        )


def move(name: str, amount: int, from_user: str, to_user: str) -> None:
    """``amount`` of quota ``name`` changes hands (a transfer of ownership), inside the caller's transaction: 403
    ``quota_exceeded`` when ``to_user`` cannot take it. The two rows are taken in user order."""
    if not amount or from_user == to_user:
        return
    for user_id in sorted((from_user, to_user)):
        if user_id == to_user:
            charge(to_user, **{name: amount})
        else:
            credit([(from_user, name, amount)])


def check_count(user_id: str, name: str, used: int, adding: int = 1) -> None:
    """For a quota counted by its caller under its own lock (members_per_conversation): 403 when ``used + adding``
    would pass ``user_id``'s limit."""
    limit = config.quota(user_id, name)
    if used + adding > limit:
        raise refusal(name, limit, used)


def refusal(name: str, limit: int, used: int) -> errors.ApiError:
    metrics.QUOTA_EXCEEDED.labels(name).inc()
    unit = " bytes" if QUOTAS[name].unit == "bytes" else ""
    return errors.ApiError(
        403,
        f"Quota {name} exceeded: {used}{unit} of {limit}{unit} used. Delete something or ask an admin to raise it.",
        code="quota_exceeded",
        details={"quota": name, "limit": limit, "used": used},
    )


def raise_if_refused(exc: BaseException) -> None:
    """Turn limits_charge's refusal (raised by PostgreSQL, wrapped by Django) into 403 ``quota_exceeded``; any
    other error is left to the caller to re-raise."""
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    if getattr(cause, "sqlstate", None) != QUOTA_SQLSTATE:
        return
    detail = json.loads(cause.diag.message_detail or "{}")
    raise refusal(detail["quota"], int(detail["limit"]), int(detail["used"])) from None


# --- Recounting -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Counter:
    """How an app counts its part of the stored totals: ``count(user_id)`` → {quota: total} for ``quotas``, and
    ``users()``: every user it holds something of."""

    quotas: tuple[str, ...]
    count: Callable[[str], dict[str, int]]
    users: Callable[[], Iterable[str]]


_COUNTERS: list[Counter] = []


def register_counter(counter: Counter) -> None:
    """Called from the AppConfig.ready() of the app that owns the data."""
    unknown = set(counter.quotas) - set(COUNTED_QUOTAS)
    if unknown:
        raise ValueError(f"not counted quotas: {sorted(unknown)}")
    _COUNTERS.append(counter)


def usage(user_id: str) -> dict[str, int]:
    """The user's kept totals (0 where none is kept yet)."""
    from apps.limits.models import Usage

    found = dict(Usage.objects.filter(user_id=user_id).values_list("quota", "used"))
    return {name: found.get(name, 0) for name in COUNTED_QUOTAS}


def recount(user_id: str) -> dict[str, tuple[int, int]]:
    """Rebuild ``user_id``'s totals from the data: {quota: (kept before, counted)}. The total rows are locked
    first and the data counted after, in fresh statements: a write that committed before is counted, one still
    running waits for the lock and adds to the counted total after, so the result is exact under load."""
    with transaction.atomic(), connection.cursor() as cursor:
        names = sorted(COUNTED_QUOTAS)
        cursor.execute(
            "INSERT INTO limits_usage (user_id, quota, used) SELECT %s, q, 0 FROM unnest(%s::text[]) AS q "
            "ON CONFLICT DO NOTHING",
            [user_id, names],
        )
        cursor.execute(
            "SELECT quota, used FROM limits_usage WHERE user_id = %s ORDER BY quota FOR UPDATE", [user_id]
        )
        before = dict(cursor.fetchall())
        counted = dict.fromkeys(names, 0)
        for counter in _COUNTERS:
            counted.update({name: int(value) for name, value in counter.count(user_id).items()})
        cursor.execute(
            "UPDATE limits_usage u SET used = t.used FROM unnest(%s::text[], %s::bigint[]) AS t(quota, used) "
            "WHERE u.user_id = %s AND u.quota = t.quota",
            [names, [counted[name] for name in names], user_id],
        )
    return {name: (before.get(name, 0), counted[name]) for name in names}


def known_users() -> list[str]:
    """Every user with a kept total or with counted data."""
    from apps.limits.models import Usage

    users = set(Usage.objects.values_list("user_id", flat=True).distinct())
    for counter in _COUNTERS:
        users.update(counter.users())
    return sorted(users)
