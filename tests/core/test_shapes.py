"""Response shapes (apps.core.shapes): one declaration renders a body and documents it. The renderers are generated
code, so their sharp parts are tested here: each field type's rendering, the marker, optional fields, from_object,
the declarations refused; and, over every shape the API serves, that what a shape renders is what /openapi.json
says of it."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import jsonschema
import pytest
from rest_framework import serializers

from apps.core.shapes import Envelope, Marker, Shape, WindowEnvelope, page_of

MISSING = object()  # a marker's trigger, as crypto.UNDECRYPTABLE is for the API's


class Thing(Shape):
    id = serializers.UUIDField()
    parentId = serializers.UUIDField(source="parent_id", allow_null=True)
    name = serializers.CharField()
    kind = serializers.ChoiceField(choices=["a", "b"])
    count = serializers.IntegerField()
    score = serializers.FloatField(allow_null=True)
    flag = serializers.BooleanField()
    tags = serializers.ListField(child=serializers.CharField())
    meta = serializers.DictField(allow_null=True)
    content = serializers.ListField(child=serializers.DictField(), allow_null=True)
    contentError = Marker(of="content", when=MISSING, value="missing")
    createdAt = serializers.DateTimeField(source="created_at")
    note = serializers.CharField(required=False)


class Holder(Shape):
    thing = Thing()
    things = Thing(many=True)


WHEN = datetime(2026, 11, 23, 14, 15, 55, 488281, tzinfo=UTC)
ID = uuid.UUID("12345678-1234-5678-1234-567812345678")
VALUES: dict[str, Any] = {
    "id": ID,
    "parent_id": None,
    "name": "n",
    "kind": "a",
    "count": 3,
    "score": None,
    "flag": True,
    "tags": ["x"],
    "meta": {"k": 1},
    "content": [{"text": "t"}],
    "created_at": WHEN,
}
RENDERED = {
    "id": str(ID),
    "parentId": None,
    "name": "n",
    "kind": "a",
    "count": 3,
    "score": None,
    "flag": True,
    "tags": ["x"],
    "meta": {"k": 1},
    "content": [{"text": "t"}],
    "createdAt": "2026-11-23T14:15:55.488281Z",
}


def test_each_field_renders_as_its_type_says() -> None:
    body = Thing.render(**VALUES)
    assert body == RENDERED
    assert list(body) == list(RENDERED)  # the declared order

    other = Thing.render(**{**VALUES, "parent_id": ID, "created_at": WHEN.astimezone(timezone(timedelta(hours=-5)))})
    assert other["parentId"] == str(ID)
    assert other["createdAt"] == "2026-11-23T14:15:55.488281Z"  # UTC with a Z, whatever the zone given


def test_a_marker_nulls_the_field_it_marks_and_says_why() -> None:
    body = Thing.render(**{**VALUES, "content": MISSING})
    assert body == {**RENDERED, "content": None, "contentError": "missing"}
    assert list(body) == [*list(RENDERED)[:10], "contentError", "createdAt"]
    assert "contentError" not in Thing.render(**{**VALUES, "content": None})  # null for another reason: no marker


def test_an_optional_field_is_left_out_unless_given() -> None:
    assert "note" not in Thing.render(**VALUES)
    assert "note" not in Thing.render(**VALUES, note=None)
    assert Thing.render(**VALUES, note="hi")["note"] == "hi"
    assert Thing.render(**{**VALUES, "content": MISSING}, note="hi")["note"] == "hi"


def test_every_other_field_must_be_given_and_nothing_else() -> None:
    with pytest.raises(TypeError):
        Thing.render(**{name: value for name, value in VALUES.items() if name != "parent_id"})
    with pytest.raises(TypeError):
        Thing.render(**VALUES, parentId=None)  # the JSON name is not the source
    with pytest.raises(TypeError):
        Thing.render(*VALUES.values())  # keywords only: no field can be given in another's place


def test_from_object_reads_the_other_sources_as_attributes() -> None:
    row = SimpleNamespace(**VALUES)
    assert Thing.from_object(row) == RENDERED
    assert Thing.from_object(row, count=9, content=MISSING) == {
        **RENDERED, "count": 9, "content": None, "contentError": "missing"
    }
    assert Thing.from_object(SimpleNamespace(**VALUES, note="hi"))["note"] == "hi"
    assert Thing.from_object(row, count=9)["count"] == 9  # a compiled renderer per set of given sources, reused
    with pytest.raises(TypeError):
        Thing.from_object(row, parentId=None)
    with pytest.raises(AttributeError):
        Thing.from_object(SimpleNamespace(id=ID))

    @dataclass(frozen=True)
    class Row:
        id: uuid.UUID
        parent_id: uuid.UUID | None

    class Small(Shape):
        id = serializers.UUIDField()
        parentId = serializers.UUIDField(source="parent_id", allow_null=True)

    assert Small.from_object(Row(ID, ID)) == {"id": str(ID), "parentId": str(ID)}


def test_nested_shapes_take_what_their_shape_rendered() -> None:
    thing = Thing.render(**VALUES)
    assert Holder.render(thing=thing, things=[thing, thing]) == {"thing": thing, "things": [thing, thing]}


@pytest.mark.parametrize(
    ("field", "problem"),
    [
        (serializers.DecimalField(max_digits=5, decimal_places=2), "DecimalField cannot be rendered"),
        (serializers.DateField(), "DateField cannot be rendered"),
        (serializers.ListField(child=serializers.DateTimeField()), "ListField cannot be rendered"),
        (serializers.DictField(child=serializers.UUIDField()), "DictField cannot be rendered"),
        (serializers.CharField(source="a.b"), "not a plain Python name"),
        (serializers.CharField(source="class"), "not a plain Python name"),
        (serializers.CharField(source="name"), "the same source"),
        (Marker(of="nothing", when=MISSING, value="x"), "not a field of the shape"),
    ],
)
def test_a_declaration_the_renderer_cannot_honour_is_refused(field: serializers.Field, problem: str) -> None:
    with pytest.raises(TypeError, match=problem):
        type("Bad", (Shape,), {"name": serializers.CharField(), "other": field})


def test_one_marker_per_shape() -> None:
    with pytest.raises(TypeError, match="at most one Marker"):
        type(
            "Bad",
            (Shape,),
            {
                "a": serializers.DictField(allow_null=True),
                "b": serializers.DictField(allow_null=True),
                "aError": Marker(of="a", when=MISSING, value="x"),
                "bError": Marker(of="b", when=MISSING, value="x"),
            },
        )


def test_a_page_is_named_after_its_item_and_rendered_by_the_envelope() -> None:
    page = page_of(Thing)
    assert page.__name__ == "ThingPage" and page_of(Thing) is page
    assert list(page._declared_fields) == ["data", "afterCursor"]
    assert page.render(data=[], afterCursor=None) == Envelope.render(data=[], afterCursor=None)
    assert Envelope.render(data=[1], afterCursor="c") == {"data": [1], "afterCursor": "c"}


def test_a_page_read_from_either_end_adds_before_cursor() -> None:
    """D11's entry lists: page_of(item, both_ways=True) declares beforeCursor, and WindowEnvelope (what
    pagination.window_envelope renders with) renders the same body. One item type is paged one way or both ways,
    never both: the two pages would be two schema components of one name."""

    class Other(Shape):
        id = serializers.UUIDField()

    page = page_of(Other, both_ways=True)
    assert page.__name__ == "OtherPage" and page_of(Other, both_ways=True) is page
    assert list(page._declared_fields) == ["data", "afterCursor", "beforeCursor"]
    body = page.render(data=[], afterCursor="a", beforeCursor=None)
    assert body == WindowEnvelope.render(data=[], afterCursor="a", beforeCursor=None)
    assert body == {"data": [], "afterCursor": "a", "beforeCursor": None}
    with pytest.raises(TypeError, match="already paged both ways"):
        page_of(Other)


# --- Every shape the API serves, against /openapi.json -----------------------------------------------------------


def _shapes() -> list[type[Shape]]:
    found, stack = [], [Shape]
    while stack:
        for sub in stack.pop().__subclasses__():
            found.append(sub)
            stack.append(sub)
    return found


def _sample(field: serializers.Field, *, null: bool) -> Any:
    if null and field.allow_null:
        return None
    if isinstance(field, serializers.ListSerializer):
        return [_sample(field.child, null=null)]
    if isinstance(field, Shape):
        return type(field).render(**_samples(type(field), null=null))
    if isinstance(field, serializers.UUIDField):
        return uuid.uuid4()
    if isinstance(field, serializers.DateTimeField):
        return WHEN
    if isinstance(field, serializers.ChoiceField):
        return next(iter(field.choices))
    if isinstance(field, serializers.BooleanField):
        return True
    if isinstance(field, serializers.IntegerField):
        return 1
    if isinstance(field, serializers.FloatField):
        return 0.5
    if isinstance(field, serializers.ListField):
        return []
    if isinstance(field, serializers.DictField):
        return {}
    return "text"


def _samples(shape: type[Shape], *, null: bool, marked: bool = False) -> dict[str, Any]:
    values = {}
    for name, field in shape._declared_fields.items():
        if isinstance(field, Marker):
            if marked:
                values[shape._sources[field.of]] = field.when
            continue
        values.setdefault(field.source or name, _sample(field, null=null))
    return values


@pytest.mark.django_db
def test_what_every_served_shape_renders_is_what_the_schema_says(api) -> None:
    document = api.get("/openapi.json").json()
    components = document["components"]["schemas"]
    served = [shape for shape in _shapes() if shape.__name__ in components]
    assert len(served) >= 20, [shape.__name__ for shape in served]
    for shape in served:
        schema = {"$ref": f"#/components/schemas/{shape.__name__}", "components": document["components"]}
        properties = components[shape.__name__]["properties"]
        for variant in ({"null": False}, {"null": True}, {"null": False, "marked": True}):
            body = shape.render(**_samples(shape, **variant))
            jsonschema.validate(body, schema, cls=jsonschema.Draft202012Validator)
            assert set(body) <= set(properties), (shape.__name__, set(body) - set(properties))
