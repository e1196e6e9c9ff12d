"""LangGraph's value filters and namespace patterns, applied on this side of the wire.

The service filters memories by their plaintext *attributes* only: values are encrypted at rest, so the database
cannot look inside them. LangGraph filters look inside values (``{"status": "active"}``, ``{"score": {"$gt": 4}}``),
so :class:`~memory_service.langgraph.MemoryServiceStore` applies them here, to the decrypted values the service
returns, with the semantics of LangGraph's own ``InMemoryStore``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

OPERATORS = frozenset({"$eq", "$ne", "$gt", "$gte", "$lt", "$lte"})


def check_filter(filter: Mapping[str, Any]) -> None:
    """Raise ValueError for an operator LangGraph does not define (before any request is sent)."""
    for value in filter.values():
        if isinstance(value, Mapping):
            if any(isinstance(key, str) and key.startswith("$") for key in value):
                unknown = [key for key in value if key not in OPERATORS]
                if unknown:
                    raise ValueError(f"unsupported filter operator(s) {unknown}; use {sorted(OPERATORS)}")
            else:
                check_filter(value)


def matches(value: Mapping[str, Any], filter: Mapping[str, Any] | None) -> bool:
    """Whether a memory's value passes every condition of ``filter`` (all are ANDed)."""
    if not filter:
        return True
    return all(_compare(value.get(key), wanted) for key, wanted in filter.items())


def _compare(actual: Any, wanted: Any) -> bool:
    if isinstance(wanted, Mapping):
        if any(isinstance(key, str) and key.startswith("$") for key in wanted):
            return all(_apply(actual, operator, operand) for operator, operand in wanted.items())
        # A nested object: each of its fields must match (a partial match, as InMemoryStore does).
        return isinstance(actual, Mapping) and all(_compare(actual.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, list | tuple):
        return (
            isinstance(actual, list | tuple)
            and len(actual) == len(wanted)
            and all(_compare(a, w) for a, w in zip(actual, wanted, strict=True))
        )
    return _equal(actual, wanted)


def _equal(actual: Any, wanted: Any) -> bool:
    # JSON has no bool/int distinction problem in LangGraph's stores: True == 1 in Python, not in JSON.
    if isinstance(actual, bool) != isinstance(wanted, bool):
        return False
    return bool(actual == wanted)


def _apply(actual: Any, operator: str, operand: Any) -> bool:
    if operator == "$eq":
        return _equal(actual, operand)
    if operator == "$ne":
        return not _equal(actual, operand)
    ordered = _ordered(actual, operand)
    if ordered is None:
        return False  # absent, or not comparable with the operand (a string against a number): no match
    left, right = ordered
    if operator == "$gt":
        return bool(left > right)
    if operator == "$gte":
        return bool(left >= right)
    if operator == "$lt":
        return bool(left < right)
    if operator == "$lte":
        return bool(left <= right)
    raise ValueError(f"unsupported filter operator {operator!r}")


def _ordered(actual: Any, operand: Any) -> tuple[Any, Any] | None:
    """Numbers compare as numbers, strings as strings; anything else (None, bools, mixed kinds) is not ordered."""
    if _number(actual) and _number(operand):
        return float(actual), float(operand)
    if isinstance(actual, str) and isinstance(operand, str):
        return actual, operand
    return None


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and not (
        isinstance(value, float) and math.isnan(value)
    )


# --- Namespace patterns -----------------------------------------------------------------------------------------


def namespace_matches(namespace: Sequence[str], match_type: str, path: Sequence[str]) -> bool:
    """LangGraph's ``MatchCondition``: ``path`` against the start (prefix) or the end (suffix) of ``namespace``,
    ``"*"`` matching any one segment; a namespace shorter than the path never matches."""
    if len(namespace) < len(path):
        return False
    if match_type == "prefix":
        pairs = zip(namespace, path, strict=False)
    elif match_type == "suffix":
        pairs = zip(reversed(namespace), reversed(path), strict=False)
    else:
        raise ValueError(f"unsupported match type {match_type!r}")
    return all(pattern == "*" or segment == pattern for segment, pattern in pairs)


def literal_head(path: Sequence[str]) -> list[str]:
    """The segments before the first wildcard: what the service can match exactly as a prefix."""
    head: list[str] = []
    for segment in path:
        if segment == "*":
            break
        head.append(segment)
    return head


def literal_tail(path: Sequence[str]) -> list[str]:
    """The segments after the last wildcard: what the service can match exactly as a suffix."""
    return list(reversed(literal_head(list(reversed(path)))))
