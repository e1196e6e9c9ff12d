"""The limits other apps call (REST views through apps.limits.throttling, services, the MCP tools):

- ``check_rate(principal, kind=None)``: take a request token (and one of ``kind``) or raise 429 ``rate_limited``;
- ``check_class(principal, kind)``: the same for a class alone, where a service finds out late that a request is
  expensive (an append that creates a conversation);
- ``charge(user_id, **deltas)`` / ``credit(rows)`` / ``move(...)``: move stored totals inside the write's
  transaction, or raise 403 ``quota_exceeded``;
- ``check_count(user_id, quota, used)``: for a total the caller counts under its own lock;
- ``set_limits`` / ``limits_of`` / ``recount``: the admin's side (``manage.py limits``, the admin pages).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from apps.limits import config
from apps.limits.definitions import QUOTAS, RATES
from apps.limits.quotas import (
    CHARGE_SQL,
    Counter,
    charge,
    check_count,
    credit,
    known_users,
    limits_for,
    move,
    raise_if_refused,
    recount,
    refusal,
    register_counter,
    usage,
)
from apps.limits.rates import check_class, check_kinds, check_rate

__all__ = [
    "CHARGE_SQL",
    "Counter",
    "charge",
    "check_class",
    "check_count",
    "check_kinds",
    "check_rate",
    "credit",
    "known_users",
    "limits_for",
    "limits_of",
    "move",
    "raise_if_refused",
    "recount",
    "refusal",
    "register_counter",
    "set_limits",
    "usage",
]

OVERRIDE_FIELDS = tuple(
    [field for rate in RATES.values() for field in (rate.per_minute_field, rate.burst_field)] + list(QUOTAS)
)


def limits_of(user_id: str) -> dict[str, dict[str, Any]]:
    """Every limit of ``user_id``: {field: {"value", "default", "overridden"}}, rates then quotas."""
    own = config.overrides(user_id)
    result: dict[str, dict[str, Any]] = {}
    for rate in RATES.values():
        for field, setting in ((rate.per_minute_field, rate.per_minute_setting), (rate.burst_field, rate.burst_setting)):
            default = config.setting(setting)
            result[field] = {"value": own.get(field) or default, "default": default, "overridden": field in own}
    for quota in QUOTAS.values():
        default = config.setting(quota.setting)
        result[quota.name] = {
            "value": own[quota.name] if quota.name in own else default,
            "default": default,
            "overridden": quota.name in own,
        }
    return result


def set_limits(user_id: str, changes: dict[str, int | None], note: str | None = None) -> None:
    """Set (an int) or reset to the default (None) the named override fields of ``user_id``; a user left with no
    override loses its row. Applies in this process at once, in the others within LIMITS_CACHE_SECONDS."""
    from apps.limits.models import UserLimits

    unknown = set(changes) - set(OVERRIDE_FIELDS)
    if unknown:
        raise ValueError(f"unknown limits: {sorted(unknown)}")
    for field, value in changes.items():
        if value is not None and (value < 0 or (value < 1 and field not in QUOTAS)):
            raise ValueError(f"{field} must be at least {0 if field in QUOTAS else 1}")
    with transaction.atomic():
        row, _ = UserLimits.objects.select_for_update().get_or_create(user_id=user_id)
        for field, value in changes.items():
            setattr(row, field, value)
        if note is not None:
            row.note = note
        if all(getattr(row, field) is None for field in OVERRIDE_FIELDS) and not row.note:
            row.delete()
        else:
            row.save()
    config.clear_cache(user_id)
