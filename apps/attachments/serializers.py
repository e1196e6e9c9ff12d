"""Request parsing of the attachment endpoints (camelCase): ``expiresIn`` and its schema. Response shapes:
apps.attachments.responses."""

from __future__ import annotations

import re

from django.conf import settings

from apps.core import errors
from apps.core.pagination import LimitBounds

ADMIN_ATTACHMENTS_LIMIT = LimitBounds(default=50, maximum=1000)  # GET /v1/admin/attachments (the limits table)

_DURATION = re.compile(
    r"^P(?!$)(?:(?P<weeks>\d+)W)?(?:(?P<days>\d+)D)?"
    r"(?:T(?=\d)(?:(?P<hours>\d+)H)?(?:(?P<minutes>\d+)M)?(?:(?P<seconds>\d+)S)?)?$"
)
_MAX_DIGITS = 12  # beyond any sane maximum; keeps int() and the arithmetic small


def parse_expires_in(raw: str | None) -> int:
    """``expiresIn`` (D7): an ISO-8601 duration (PT90S, PT30M, PT1H, P1D) or whole seconds; absent = the default;
    from 1 second up to ATTACHMENT_MAX_EXPIRES_IN, else 400."""
    maximum = settings.ATTACHMENT_MAX_EXPIRES_IN
    if raw is None or raw == "":
        return min(settings.ATTACHMENT_DEFAULT_EXPIRES_IN, maximum)
    text = raw.strip().upper()
    problem = {"expiresIn": f"must be an ISO-8601 duration (e.g. PT30M, P1D) or whole seconds, from 1 s to {maximum} s"}
    if len(text) > 40:
        raise errors.validation_error(problem)
    if text.isdigit() and text.isascii():
        seconds = int(text[:_MAX_DIGITS + 1]) if len(text) <= _MAX_DIGITS else maximum + 1
    else:
        match = _DURATION.match(text)
        if match is None or any(len(value) > _MAX_DIGITS for value in match.groupdict(default="").values()):
            raise errors.validation_error(problem)
        parts = {name: int(value) for name, value in match.groupdict(default="0").items()}
        seconds = (
            parts["weeks"] * 604800 + parts["days"] * 86400 + parts["hours"] * 3600 + parts["minutes"] * 60
            + parts["seconds"]
        )
    if not 1 <= seconds <= maximum:
        raise errors.validation_error(problem)
    return seconds


def _digits_range(low: str, high: str) -> list[str]:
    """Regex alternatives matching the decimal numbers from ``low`` to ``high``, both of the same length."""
    if low == high:
        return [low]
    if set(low) == {"0"} and set(high) == {"9"}:
        return [f"[0-9]{{{len(low)}}}"]
    if len(low) == 1:
        return [f"[{low}-{high}]"]
    if set(low[1:]) == {"0"} and set(high[1:]) == {"9"}:
        return [f"[{low[0]}-{high[0]}][0-9]{{{len(low) - 1}}}"]
    if low[0] == high[0]:
        return [low[0] + rest for rest in _digits_range(low[1:], high[1:])]
    width = len(low) - 1
    parts = [low[0] + rest for rest in _digits_range(low[1:], "9" * width)]
    if int(high[0]) - int(low[0]) > 1:
        parts.append(f"[{int(low[0]) + 1}-{int(high[0]) - 1}][0-9]{{{width}}}")
    parts += [high[0] + rest for rest in _digits_range("0" * width, high[1:])]
    return parts


def integer_range_pattern(low: int, high: int) -> str:
    """A regex group matching the decimal integers ``low``..``high`` (0 <= low <= high), without leading zeros."""
    parts = []
    for width in range(len(str(low)), len(str(high)) + 1):
        start, end = max(low, 10 ** (width - 1) if width > 1 else 0), min(high, 10**width - 1)
        if start <= end:
            parts += _digits_range(str(start), str(end))
    return "(?:" + "|".join(parts) + ")"


def expires_in_schema() -> dict:
    """``expiresIn`` in OpenAPI: whole seconds or a one-unit ISO-8601 duration, each form bounded by
    ATTACHMENT_MAX_EXPIRES_IN, so every value the schema admits is accepted. parse_expires_in also takes durations
    of several units (PT1H30M), lower case and surrounding blanks; JSON Schema cannot bound their sum."""
    maximum = settings.ATTACHMENT_MAX_EXPIRES_IN
    forms = [integer_range_pattern(1, maximum)] if maximum >= 1 else []
    for prefix, unit, seconds in (("PT", "S", 1), ("PT", "M", 60), ("PT", "H", 3600), ("P", "D", 86400), ("P", "W", 604800)):
        if maximum >= seconds:
            forms.append(f"{prefix}{integer_range_pattern(1, maximum // seconds)}{unit}")
    return {
        "type": "string",
        "pattern": "^(?:" + "|".join(forms) + ")?$",
        "description": f"An ISO-8601 duration (PT90S, PT30M, PT1H, P1D; several units such as PT1H30M too) or whole "
        f"seconds, from 1 s to {maximum} s (ATTACHMENT_MAX_EXPIRES_IN); empty = the default "
        f"({settings.ATTACHMENT_DEFAULT_EXPIRES_IN} s)",
    }
