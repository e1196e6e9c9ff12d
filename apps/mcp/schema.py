"""The JSON Schemas of the MCP tools, derived from the same serializers the REST API declares in /openapi.json.

A tool's ``inputSchema`` is its arguments serializer and its ``outputSchema`` the REST response serializer it
answers with, both mapped by drf-spectacular exactly as for the OpenAPI document (the apps' schema extensions
included: strict bodies are ``additionalProperties: false``, strings refuse NUL, limits state their bounds). So a
limit changed in a serializer (an app's ``LimitBounds``) changes the tool's schema too, and the schema is
as strict as the validation behind it.

MCP wants JSON Schema (2020-12), not OpenAPI 3.0: ``nullable`` becomes a ``null`` alternative, component ``$ref``s
are inlined (many clients do not resolve references), and drf-spectacular's ``x-`` annotations are dropped, except
the namespace depth marker, which ``with_namespace_depth`` replaces with the depth in force (as the OpenAPI hook
does).
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from drf_spectacular.plumbing import ComponentRegistry
from rest_framework import serializers
from rest_framework.views import APIView

from apps.memories.openapi import DEPTH_MARKER

_REF_PREFIX = "#/components/schemas/"
# What a JSON Schema (2020-12) validator should see of drf-spectacular's OpenAPI output; the rest is annotation.
_DROPPED_KEYS = ("readOnly", "writeOnly")
_BLANK = {"type": "string", "maxLength": 0}


def _auto_schema(direction: str):
    # drf-spectacular maps serializers through an AutoSchema bound to a view; the MCP endpoint has none, so a bare
    # APIView stands in (only its serializer context is read). Imported here: DEFAULT_SCHEMA_CLASS is in settings.
    from apps.core.openapi import ServiceAutoSchema

    auto = ServiceAutoSchema()
    auto.registry = ComponentRegistry()
    view = APIView()
    view.request = None
    view.format_kwarg = None
    auto.view = view
    auto.method = "POST" if direction == "request" else "GET"
    auto.path = auto.path_regex = "/mcp"
    return auto


@functools.cache
def serializer_schema(serializer_class: type[serializers.Serializer], direction: str) -> dict[str, Any]:
    """The JSON Schema of ``serializer_class`` as a request body (``"request"``) or a response (``"response"``).
    Cached per class: callers get a deep copy (``tool_schema``)."""
    auto = _auto_schema(direction)
    schema = auto._map_serializer(serializer_class(), direction)
    components = {
        component.name: component.schema
        for component in auto.registry._components.values()
        if component.schema is not None
    }
    schema = _json_schema(schema, components)
    # A serializer's docstring is written for developers; the tool's description speaks to the model.
    schema.pop("description", None)
    return schema


def tool_schema(serializer_class: type[serializers.Serializer], direction: str) -> dict[str, Any]:
    return copy.deepcopy(serializer_schema(serializer_class, direction))


def _json_schema(node: Any, components: dict[str, Any]) -> Any:
    """OpenAPI 3.0 schema object -> JSON Schema 2020-12, with component references inlined."""
    if isinstance(node, list):
        return [_json_schema(item, components) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith(_REF_PREFIX):
        target = _json_schema(components[ref[len(_REF_PREFIX) :]], components)
        siblings = {key: value for key, value in node.items() if key != "$ref"}
        return {**target, **_json_schema(siblings, components)} if siblings else target
    converted: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED_KEYS or (key.startswith("x-") and key != DEPTH_MARKER):
            continue
        if key in ("properties", "patternProperties", "dependentSchemas"):
            converted[key] = {name: _json_schema(sub, components) for name, sub in value.items()}
        else:
            converted[key] = _json_schema(value, components)
    branches = converted.get("oneOf")
    if isinstance(branches, list) and _BLANK in branches:
        # drf-spectacular's text that may also be blank: ``oneOf: [<text>, <blank>]``. A blank string matches both
        # branches, so oneOf would refuse the "" the field takes; either branch is what is meant.
        converted["anyOf"] = converted.pop("oneOf")
    if converted.pop("nullable", False):
        converted = _with_null(converted)
    return converted


def _with_null(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` that also accepts null (OpenAPI's ``nullable: true``)."""
    kind = schema.get("type")
    if isinstance(kind, str) and not any(key in schema for key in ("anyOf", "oneOf", "allOf", "enum", "const")):
        return {**schema, "type": [kind, "null"]}
    if isinstance(kind, list) and "enum" not in schema:
        return {**schema, "type": [*kind, *(["null"] if "null" not in kind else [])]}
    annotations = {key: schema[key] for key in ("description", "title", "default") if key in schema}
    body = {key: value for key, value in schema.items() if key not in annotations}
    return {**annotations, "anyOf": [body, {"type": "null"}]}


def with_namespace_depth(schema: dict[str, Any], depth: int) -> dict[str, Any]:
    """``schema`` (a copy of it) with each namespace marked for the configured depth capped at ``depth`` items, as
    apps.memories.openapi.namespace_depth_hook does for /openapi.json."""

    def visit(node: Any) -> Any:
        if isinstance(node, dict):
            result = {key: visit(value) for key, value in node.items() if key != DEPTH_MARKER}
            if node.get(DEPTH_MARKER):
                result["maxItems"] = depth
            return result
        if isinstance(node, list):
            return [visit(value) for value in node]
        return node

    return visit(schema)
