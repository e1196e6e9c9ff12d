"""Attribute filters and namespace matching, compiled to parametrized SQL.

One compiler serves the primary store (attribute search, namespaces, events) and the vector store (semantic
search), so both modes mean the same thing by a filter. Caller input only ever reaches SQL as bound parameters;
the column expression comes from code.

Filter forms (D4): a bare scalar is equality; ``{"in": [...]}`` (non-empty) is membership; ``{"gt"|"gte"|"lt"|
"lte": v}`` are ranges (several allowed). ``$eq``, ``$in``, ``$gt``... are accepted as aliases. Ranges compare
numbers as numbers and RFC 3339 strings as timestamps; a row whose attribute is of another type does not match.
A filter holds at most MAX_ATTRIBUTES attributes of at most MAX_OPERATORS operators each, and MAX_IN_VALUES ``in``
values in all.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from apps.core import errors
from apps.core.serializers import text_problem

Scalar = str | int | float | bool | None

_RANGE_SQL = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}
_ALIASES = {"$eq": "eq", "$in": "in", "$gt": "gt", "$gte": "gte", "$lt": "lt", "$lte": "lte", "eq": "eq"}

# Caps on one filter (the caller's or a policy's), so that no request can make the filter the work: each condition
# is a test on every candidate row (a semantic search may walk tens of thousands), and the values reach the
# filter policy as input. Far above any real filter; a filter beyond them is a 400 naming `filter`.
MAX_ATTRIBUTES = 16  # attribute names
MAX_OPERATORS = 4  # operators (eq, in, gt, gte, lt, lte and their $ aliases) on one attribute
MAX_IN_VALUES = 1000  # values of all `in` lists together
_IN_AS_CONTAINMENT = 16  # an `in` list up to this long is compiled to GIN-indexable containments (see to_sql)

# RFC 3339 date-time (the only strings compared as timestamps); PostgreSQL's own timestamptz input would also
# accept words such as 'today', which must stay plain strings.
RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
_RFC3339_SQL = r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$"


@dataclass(frozen=True)
class Condition:
    """One validated condition on one attribute."""

    field: str
    equals: Scalar | None = None
    has_equals: bool = False
    one_of: tuple[Scalar, ...] | None = None
    ranges: tuple[tuple[str, float | datetime], ...] = ()


@dataclass
class CompiledFilter:
    conditions: list[Condition] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.conditions)


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _check_text(value: Any, where: str) -> None:
    # PostgreSQL text and jsonb cannot hold NUL; refusing it here keeps a bad filter a 400, not a 500.
    if isinstance(value, str) and "\x00" in value:
        raise errors.validation_error({where: "must not contain NUL characters"})
    _check_scalar(value, where)


def _check_scalar(value: Any, where: str) -> None:
    # The filter also reaches filter.rego as input and PostgreSQL as a parameter: neither takes a lone surrogate,
    # an integer beyond 64 bits or a non-finite number (JSON 1e400 parses to Infinity).
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise errors.validation_error({where: "must not contain lone surrogates"}) from None
    elif isinstance(value, float) and not math.isfinite(value):
        raise errors.validation_error({where: "numbers must be finite"})
    elif isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
        raise errors.validation_error({where: "integers must fit in 64 bits"})


def _range_operand(value: Any, where: str) -> float | datetime:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise errors.validation_error({where: "range bounds must be numbers or RFC 3339 timestamps"})
    if isinstance(value, str):
        if not RFC3339.match(value):
            raise errors.validation_error({where: "range bounds must be numbers or RFC 3339 timestamps"})
        try:
            # 2024-02-30 matches the pattern but is no date; year 1 at +23:59 is before the first UTC instant.
            return datetime.fromisoformat(value.replace("z", "Z").replace("Z", "+00:00")).astimezone(UTC)
        except (ValueError, OverflowError):
            raise errors.validation_error({where: "not a valid RFC 3339 timestamp"}) from None
    _check_scalar(value, where)
    return value


def parse_filter(raw: Any, where: str = "filter") -> CompiledFilter:
    """Validate a filter object (the caller's or a policy's); anything outside the forms above is a 400."""
    if raw is None:
        return CompiledFilter()
    if not isinstance(raw, dict):
        raise errors.validation_error({where: "must be an object"})
    _check_caps(raw, where)
    conditions = []
    for name, spec in raw.items():
        if not isinstance(name, str) or not name:
            raise errors.validation_error({where: "attribute names must be non-empty strings"})
        # Reported under `where`: a name that cannot be encoded must not become a key of the error body.
        _check_text(name, where)
        path = f"{where}.{name}"
        if _is_scalar(spec):
            _check_text(spec, path)
            conditions.append(Condition(name, equals=spec, has_equals=True))
            continue
        if not isinstance(spec, dict) or not spec:
            raise errors.validation_error({path: "must be a scalar or an operator object (in, gt, gte, lt, lte)"})
        equals, has_equals, one_of, ranges = None, False, None, []
        for op_name, operand in spec.items():
            op = _ALIASES.get(op_name, op_name)
            if op == "eq":
                if not _is_scalar(operand):
                    raise errors.validation_error({f"{path}.{op_name}": "must be a scalar"})
                _check_text(operand, path)
                equals, has_equals = operand, True
            elif op == "in":
                if not isinstance(operand, list) or not operand:
                    raise errors.validation_error({f"{path}.{op_name}": "must be a non-empty array"})
                if not all(_is_scalar(item) for item in operand):
                    raise errors.validation_error({f"{path}.{op_name}": "must hold scalars only"})
                for item in operand:
                    _check_text(item, path)
                one_of = tuple(operand)
            elif op in _RANGE_SQL:
                ranges.append((op, _range_operand(operand, f"{path}.{op_name}")))
            else:
                raise errors.validation_error(
                    {f"{path}.{op_name}": "unknown operator; use in, gt, gte, lt, lte (or $eq, $in, $gt, ...)"}
                )
        conditions.append(Condition(name, equals, has_equals, one_of, tuple(ranges)))
    return CompiledFilter(conditions)


def _check_caps(raw: dict, where: str) -> None:
    """MAX_ATTRIBUTES, MAX_OPERATORS and MAX_IN_VALUES, counted before anything else looks at the values. So a
    filter is at most MAX_ATTRIBUTES * MAX_OPERATORS conditions, each a test on every candidate row."""
    if len(raw) > MAX_ATTRIBUTES:
        raise errors.validation_error({where: f"at most {MAX_ATTRIBUTES} attributes"})
    in_values = 0
    for name, spec in raw.items():
        if not isinstance(spec, dict):
            continue
        if len(spec) > MAX_OPERATORS:
            # Named under `where` when the name itself cannot be encoded (parse_filter refuses it next).
            nameable = isinstance(name, str) and name and text_problem(name) is None
            field = f"{where}.{name}" if nameable else where
            raise errors.validation_error({field: f"at most {MAX_OPERATORS} operators"})
        for op_name, operand in spec.items():
            if _ALIASES.get(op_name, op_name) == "in" and isinstance(operand, list):
                in_values += len(operand)
    if in_values > MAX_IN_VALUES:
        raise errors.validation_error({where: f"at most {MAX_IN_VALUES} values in all `in` lists together"})


def merge(*filters: CompiledFilter) -> CompiledFilter:
    """AND of filters: a policy's attribute_filter and the caller's both hold (same field: both conditions)."""
    return CompiledFilter([condition for f in filters for condition in f.conditions])


def to_sql(compiled: CompiledFilter, column: str) -> tuple[str, list[Any]]:
    """SQL boolean expression over the jsonb ``column`` (a trusted identifier) and its parameters."""
    parts: list[str] = []
    params: list[Any] = []
    # Equalities become one jsonb containment: a single GIN (jsonb_path_ops) probe, type-exact (9 = 9.0,
    # "9" != 9). A field required equal to two different values cannot be folded into one object.
    equalities: dict[str, Any] = {}
    for condition in compiled.conditions:
        if not condition.has_equals:
            continue
        # Compared as JSON: in Python True == 1, in jsonb they differ.
        if condition.field in equalities and json.dumps(equalities[condition.field]) != json.dumps(condition.equals):
            parts.append(f"{column} @> %s::jsonb")
            params.append(json.dumps({condition.field: condition.equals}))
        else:
            equalities[condition.field] = condition.equals
    if equalities:
        parts.insert(0, f"{column} @> %s::jsonb")
        params.insert(0, json.dumps(equalities))
    for condition in compiled.conditions:
        if condition.one_of is not None and len(condition.one_of) <= _IN_AS_CONTAINMENT:
            # A short list: one containment per value, which the GIN index can answer (a BitmapOr).
            alternatives = " OR ".join([f"{column} @> %s::jsonb"] * len(condition.one_of))
            parts.append(f"({alternatives})")
            params.extend(json.dumps({condition.field: item}) for item in condition.one_of)
        elif condition.one_of is not None:
            # A long one: one array parameter, compared by jsonb equality (as type-exact as containment for the
            # scalars attributes hold). PostgreSQL hashes an = ANY over known values, so a row costs one lookup,
            # not one comparison per value, and the statement one parameter, not one per value.
            parts.append(f"({column} -> %s) = ANY(%s::jsonb[])")
            params.extend([condition.field, [json.dumps(item) for item in condition.one_of]])
        numeric_guarded = False
        for op, operand in condition.ranges:
            sql_op = _RANGE_SQL[op]
            if isinstance(operand, datetime):
                # Only RFC 3339 strings are cast; anything else yields NULL, which never matches.
                parts.append(
                    f"coalesce((CASE WHEN jsonb_typeof({column} -> %s) = 'string' AND ({column} ->> %s) ~ %s "
                    f"AND pg_input_is_valid({column} ->> %s, 'timestamptz') "
                    f"THEN ({column} ->> %s)::timestamptz END) {sql_op} %s, false)"
                )
                params.extend([condition.field, condition.field, _RFC3339_SQL, condition.field, condition.field, operand])
            else:
                if not numeric_guarded:
                    # One type test per attribute, ahead of its bounds: a row of another type (or without the
                    # attribute) stops the AND chain at once (false, not NULL: NULL would go on to evaluate every
                    # other condition).
                    parts.append(f"coalesce(jsonb_typeof({column} -> %s) = 'number', false)")
                    params.append(condition.field)
                    numeric_guarded = True
                # Compared as jsonb numbers, which are numeric: exact, and no text to parse per row. The bound is
                # its text read by jsonb: bound server-side as a number, a float would be float8 (15 digits), so
                # 2**53 + 1 would not be > 2.0**53.
                parts.append(f"({column} -> %s) {sql_op} %s::jsonb")
                params.extend([condition.field, str(operand)])
    if not parts:
        return "TRUE", []
    return " AND ".join(parts), params


def namespace_prefix_sql(prefix: list[str], column: str) -> tuple[str, list[Any]]:
    """Segment-exact prefix match. ``@>`` lets the GIN index narrow the rows; the slice makes it positional.

    Segments are bound as a text[] parameter, so no value (``%``, ``_``, ``\\``, ``.``, ``/``) is a pattern.
    """
    if not prefix:
        return "TRUE", []
    return (
        f"({column} @> %s::text[] AND {column}[1:%s] = %s::text[])",
        [list(prefix), len(prefix), list(prefix)],
    )


OWNER_DEPTH = 2  # ["user", <id>]: the subtree filter.rego confines a user to


def owner_prefix_sql(prefix: list[str], column: str) -> tuple[str, list[Any]]:
    """The same match as ``namespace_prefix_sql``, led by ``column[1:2] = owner`` for an index on that expression.

    For a prefix of exactly two segments the equality is the whole test: no ``@>``, whose estimate, multiplied by
    the equality's, would make the planner believe almost nothing matches and sort a whole subtree instead of
    walking the index. A deeper prefix adds the GIN-backed match, for prefixes holding few rows.
    """
    if len(prefix) < OWNER_DEPTH:
        return namespace_prefix_sql(prefix, column)
    # [1:2] is written out, not bound: the planner matches an index expression only against constants.
    owner_sql, owner_params = f"{column}[1:{OWNER_DEPTH}] = %s::text[]", [list(prefix[:OWNER_DEPTH])]
    if len(prefix) == OWNER_DEPTH:
        return owner_sql, owner_params
    deeper_sql, deeper_params = namespace_prefix_sql(prefix, column)
    return f"({owner_sql} AND {deeper_sql})", [*owner_params, *deeper_params]


def namespace_suffix_sql(suffix: list[str], column: str) -> tuple[str, list[Any]]:
    if not suffix:
        return "TRUE", []
    return (
        f"(cardinality({column}) >= %s AND "
        f"{column}[cardinality({column}) - %s + 1 : cardinality({column})] = %s::text[])",
        [len(suffix), len(suffix), list(suffix)],
    )


def namespace_has_prefix(namespace: list[str], prefix: list[str]) -> bool:
    """The same rule in Python (used where a row is already loaded, and by the unit tests as the reference)."""
    return len(namespace) >= len(prefix) and namespace[: len(prefix)] == prefix
