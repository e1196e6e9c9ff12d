"""Response shapes: each response body is declared once, and that one declaration both renders it and documents it.

A shape is a ``Shape`` subclass whose fields are DRF serializer fields (name, type, ``allow_null``, ``help_text``,
``choices``; ``source`` where the Python name differs from the JSON one). drf-spectacular documents it as it
documents any serializer (the component is named after the class), and the class compiles, once, a renderer that
builds the dict with no DRF serializer in the way (a DRF serializer's ``.data`` costs 10-50x a dict literal):

    class EntryResponse(Shape):
        id = serializers.UUIDField()
        conversationId = serializers.UUIDField(source="conversation_id")
        content = serializers.ListField(child=serializers.DictField(), allow_null=True)
        contentError = Marker(of="content", when=crypto.UNDECRYPTABLE, value=crypto.UNDECRYPTABLE_MARKER)
        createdAt = serializers.DateTimeField(source="created_at")

    EntryResponse.render(id=..., conversation_id=..., content=..., created_at=...)   # keywords: the sources
    EntryResponse.from_object(row, content=...)   # the other sources read as attributes of row

How a value is rendered follows from its field: a UUIDField is ``str()``-ed, a DateTimeField is ``isoformat``-ed (ISO
8601 UTC with a Z), a nested shape (``EntryResponse()``, ``Item(many=True)``) takes what that shape rendered, anything
else passes as given. Every field must be given, except that a field with ``required=False`` (never null) may be left
out or None, and is then left out of the body. A ``Marker`` is the one computed field: when the field it marks holds
``when``, that field renders null and the marker ``value`` (the undecryptable rows of a page); otherwise the marker
is absent. Both renderers are generated Python (a dict literal), as fast as one written by hand, so the hot paths
use them directly and no hand-written copy of a shape exists to drift from its schema.

A list's page is ``page_of(<item shape>)``: ``{"data": [item], "afterCursor": string | null}``
(``apps.core.pagination.envelope`` renders it); a list read from either end (D11) is ``page_of(<item>, both_ways=True)``,
which adds ``"beforeCursor": string | null`` (``apps.core.pagination.window_envelope``); a page with more than that is
a Shape of its own.

To add a field to a response: declare it on the shape and pass its source to the shape's ``render`` (or give it as
an attribute or keyword to ``from_object``); the schema, the renderer and tests/core/test_shapes.py follow.
"""

from __future__ import annotations

import functools
import keyword
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from rest_framework import serializers
from rest_framework.fields import _UnvalidatedField


def isoformat(value: datetime | None) -> str | None:
    """ISO 8601 in UTC with a Z suffix, the one timestamp format of every response."""
    if value is None:
        return None
    # Database timestamps are already in UTC (apps.core.db): no conversion for them, half the cost (issue 12: an
    # events page formats 50).
    if value.tzinfo is not UTC:
        value = value.astimezone(UTC)
    return value.isoformat().replace("+00:00", "Z")


class Marker(serializers.ChoiceField):
    """Present only when the field ``of`` holds ``when`` (compared by identity): that field is then null and this
    one is ``value``. In the schema: an optional string enum of ``value``."""

    def __init__(self, *, of: str, when: Any, value: str, **kwargs: Any) -> None:
        self.of, self.when, self.value = of, when, value
        super().__init__(choices=[value], required=False, **kwargs)


# Types whose values a response holds as they are, and that drf-spectacular documents as what JSON makes of them.
_AS_GIVEN = (
    serializers.CharField,
    serializers.ChoiceField,
    serializers.IntegerField,
    serializers.FloatField,
    serializers.BooleanField,
    serializers.JSONField,
)
_CONTAINERS = (serializers.ListField, serializers.DictField)


def _as_given(field: serializers.Field) -> bool:
    if isinstance(field, _CONTAINERS):
        child = field.child
        return isinstance(child, _UnvalidatedField) or _as_given(child)  # DictField() holds any JSON
    return isinstance(field, _AS_GIVEN)


def _expression(shape: str, name: str, field: serializers.Field, variable: str) -> str:
    """How one field's value is rendered, as an expression over the variable holding it. A type not handled here
    is refused, so a field can never render as something other than what the schema says of it."""
    if isinstance(field, Shape) or (
        isinstance(field, serializers.ListSerializer) and isinstance(field.child, Shape)
    ):
        return variable  # a nested shape: the caller passes what that shape rendered
    if isinstance(field, serializers.UUIDField):
        return f"(None if {variable} is None else str({variable}))" if field.allow_null else f"str({variable})"
    if isinstance(field, serializers.DateTimeField):
        return f"_isoformat({variable})"
    if _as_given(field):
        return variable
    raise TypeError(f"{shape}.{name}: a {type(field).__name__} cannot be rendered by a Shape (see apps.core.shapes)")


# No docstring: drf-spectacular takes the nearest docstring in a serializer's bases as its component's description.
class Shape(serializers.Serializer):
    # Compiled for each subclass by __init_subclass__ (below): ``render(**sources)`` and ``from_object(obj, **sources)``.
    render: Callable[..., dict[str, Any]]
    _sources: dict[str, str]  # JSON name -> source
    _from_object: dict[tuple[str, ...], Callable[..., dict[str, Any]]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        fields: dict[str, serializers.Field] = cls._declared_fields
        cls._sources = {name: field.source or name for name, field in fields.items() if not isinstance(field, Marker)}
        for name, source in cls._sources.items():
            if not source.isidentifier() or keyword.iskeyword(source) or source.startswith("_"):
                raise TypeError(f"{cls.__name__}.{name}: source {source!r} is not a plain Python name")
        if len(set(cls._sources.values())) != len(cls._sources):
            raise TypeError(f"{cls.__name__}: two fields have the same source")
        markers = [(name, field) for name, field in fields.items() if isinstance(field, Marker)]
        for name, marker in markers:
            if marker.of not in cls._sources:
                raise TypeError(f"{cls.__name__}.{name} marks {marker.of!r}, which is not a field of the shape")
        if len(markers) > 1:
            raise TypeError(f"{cls.__name__}: at most one Marker per shape")
        cls.render = staticmethod(_compile(cls, fields, given=None))
        cls._from_object = {}

    @classmethod
    def from_object(cls, obj: Any, /, **given: Any) -> dict[str, Any]:
        """The body with each source not in ``given`` read as an attribute of ``obj`` (a row, a model, a dataclass)."""
        names = tuple(given)
        renderer = cls._from_object.get(names)
        if renderer is None:
            unknown = set(names) - set(cls._sources.values())
            if unknown:
                raise TypeError(f"{cls.__name__}.from_object: unknown sources {sorted(unknown)}")
            renderer = cls._from_object[names] = _compile(cls, cls._declared_fields, given=names)
        return renderer(obj, *given.values())


def _compile(
    cls: type[Shape], fields: dict[str, serializers.Field], *, given: tuple[str, ...] | None
) -> Callable[..., dict[str, Any]]:
    """Generate the renderer: ``render(*, <sources>)`` when ``given`` is None, else ``from_object(_obj, <given>)``
    reading the other sources from ``_obj``'s attributes."""
    sources = cls._sources
    optional = [  # a list: the generated code, and so the order of the keys, is the same in every process
        name for name, field in fields.items()
        if not field.required and not field.allow_null and not isinstance(field, Marker)
    ]
    markers = [(name, field) for name, field in fields.items() if isinstance(field, Marker)]
    namespace: dict[str, Any] = {"_isoformat": isoformat}
    lines: list[str] = []
    if given is None:
        params = [f"{sources[n]}=None" if n in optional else sources[n] for n in sources]
        lines.append(f"def render(*, {', '.join(params)}):" if params else "def render():")
    else:
        lines.append(f"def from_object(_obj, {', '.join(given)}):")
        lines += [
            f"    {sources[n]} = getattr(_obj, {sources[n]!r}, None)" if n in optional else f"    {sources[n]} = _obj.{sources[n]}"
            for n in sources if sources[n] not in given
        ]

    def literal(marked: str | None) -> str:
        items = []
        for name, field in fields.items():
            if name in optional:
                continue
            if isinstance(field, Marker):
                if marked is not None:
                    items.append(f"{name!r}: _marker")
                continue
            value = "None" if name == marked else _expression(cls.__name__, name, field, sources[name])
            items.append(f"{name!r}: {value}")
        return "{" + ", ".join(items) + "}"

    def body(indent: str, marked: str | None) -> list[str]:
        if not optional:
            return [f"{indent}return {literal(marked)}"]
        out = [f"{indent}_body = {literal(marked)}"]
        for name in optional:
            source = sources[name]
            out += [f"{indent}if {source} is not None:", f"{indent}    _body[{name!r}] = {_expression(cls.__name__, name, fields[name], source)}"]
        return [*out, f"{indent}return _body"]

    if markers:
        marker = markers[0][1]
        namespace["_when"], namespace["_marker"] = marker.when, marker.value
        lines.append(f"    if {sources[marker.of]} is _when:")
        lines += body("        ", marker.of)
    lines += body("    ", None)
    code = "\n".join(lines)
    exec(compile(code, f"<shape {cls.__module__}.{cls.__name__}>", "exec"), namespace)  # noqa: S102 - our own code
    return namespace["from_object" if given is not None else "render"]


# --- Pages of cursor-paginated lists -----------------------------------------------------------------------------


def _page_fields(data: serializers.Field, *, both_ways: bool = False) -> dict[str, serializers.Field]:
    fields = {"data": data, "afterCursor": serializers.CharField(allow_null=True)}
    if both_ways:
        fields["beforeCursor"] = serializers.CharField(allow_null=True)
    return fields


_ANY_ITEMS = serializers.ListField(child=serializers.DictField())
# What every page holds, whatever its items (apps.core.pagination.envelope renders with it), and a page of a list
# read from either end (D11; apps.core.pagination.window_envelope).
Envelope = type("Envelope", (Shape,), {"__module__": __name__, **_page_fields(_ANY_ITEMS)})
WindowEnvelope = type("WindowEnvelope", (Shape,), {"__module__": __name__, **_page_fields(_ANY_ITEMS, both_ways=True)})


@functools.cache
def page_of(item: type[Shape], *, both_ways: bool = False) -> type[Shape]:
    """The page envelope of a cursor-paginated list of ``item``, plus ``beforeCursor`` for a list paged
    ``both_ways`` (apps.core.pagination.keyset_window). One shape (one schema component) per item type, named
    after the item without a trailing ListItem, Item, Response or Result: ConversationListItem -> ConversationPage;
    so a list of one item type is paged one way or both ways everywhere, never both."""
    name = re.sub(r"(ListItem|Item|Response|Result)$", "", item.__name__) + "Page"
    paged = _PAGED.setdefault(item, both_ways)
    if paged != both_ways:  # two components of one name: drf-spectacular would document only one of them
        raise TypeError(f"{item.__name__} is already paged {'both ways' if paged else 'one way'}")
    return type(name, (Shape,), {"__module__": item.__module__, **_page_fields(item(many=True), both_ways=both_ways)})


_PAGED: dict[type[Shape], bool] = {}  # item shape -> whether its pages are both_ways (page_of)
