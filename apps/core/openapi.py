"""OpenAPI generation details shared by every view: the schema class (DEFAULT_SCHEMA_CLASS) and the errors every
operation can meet (a postprocessing hook), so clients and the fuzzer (tests/fuzz) can trust /openapi.json. Response
shapes and the page envelope of every cursor-paginated list: apps.core.shapes. That unknown request fields are refused
is said by apps.core.serializers.StrictSerializerSchema.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from drf_spectacular.openapi import AutoSchema
from rest_framework.serializers import ListSerializer

from apps.core.serializers import _ERROR_DESCRIPTIONS

ERROR_REF = {"$ref": "#/components/schemas/Error"}
_METHODS = {"get", "put", "post", "patch", "delete"}


def _error_response(status: int) -> dict[str, Any]:
    return {"description": _ERROR_DESCRIPTIONS.get(status, ""), "content": {"application/json": {"schema": ERROR_REF}}}


def _has_required_fields(schema: dict[str, Any], schemas: dict[str, Any], depth: int = 0) -> bool:
    """Whether every body ``schema`` admits names a required field (through $ref, oneOf and anyOf)."""
    if depth > 8:
        return False
    ref = schema.get("$ref", "")
    if ref.startswith("#/components/schemas/"):
        return _has_required_fields(schemas.get(ref.rsplit("/", 1)[1], {}), schemas, depth + 1)
    branches = schema.get("oneOf") or schema.get("anyOf")
    if branches:
        return all(_has_required_fields(branch, schemas, depth + 1) for branch in branches)
    return bool(schema.get("required"))


def api_operations(result: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(path, method, operation) of every operation of the API (``/v1/...``) in a generated schema."""
    for path, item in result.get("paths", {}).items():
        if not path.startswith("/v1/"):
            continue
        for method, operation in item.items():
            if method in _METHODS:
                yield path, method, operation


def document_errors(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """Document the errors the shared layers raise on every API operation, where the view did not:

    - 401 on every operation that takes credentials (authentication runs first, D1);
    - 400 on every operation with parameters or a body (validation, malformed JSON);
    - 413 on every operation with a body (REQUEST_MAX_BODY_BYTES);
    - 404 on every operation with a path parameter;
    - 503 on every operation: the database (or another dependency) is down, frozen or unreachable (issue 21.13).

    A request body whose schema has required fields is itself required.

    An error response documented without a body gets D1's. The Error component allows no other keys.
    """
    error = result.get("components", {}).get("schemas", {}).get("Error")
    if error is not None:
        error["additionalProperties"] = False
        error["properties"]["details"] = {"type": "object", "additionalProperties": True}
    default_security = result.get("security")
    schemas = result.get("components", {}).get("schemas", {})
    for path, _method, operation in api_operations(result):
        body = operation.get("requestBody")
        if body is not None and any(
            _has_required_fields(media.get("schema", {}), schemas) for media in body.get("content", {}).values()
        ):
            body["required"] = True  # a body with required fields cannot be left out (hand-written schemas)
        responses = operation.setdefault("responses", {})
        wanted = []
        # [{}] (or no entry at all) means "no credentials needed": nothing to be 401 about.
        if any(operation.get("security", default_security) or []):
            wanted.append(401)
        if operation.get("parameters") or operation.get("requestBody"):
            wanted.append(400)
        if operation.get("requestBody"):
            wanted.append(413)
        if "{" in path:
            wanted.append(404)
        wanted.append(503)
        for status in wanted:
            responses.setdefault(str(status), _error_response(status))
        for status, response in responses.items():
            if status.isdigit() and int(status) >= 400 and "content" not in response:
                response["content"] = {"application/json": {"schema": ERROR_REF}}
                response["description"] = response.get("description") or _ERROR_DESCRIPTIONS.get(int(status), "")
    return result


class ServiceAutoSchema(AutoSchema):
    """drf-spectacular's AutoSchema, with two differences:

    - a list body's bounds: ``many=True`` with ``allow_empty=False`` or ``max_length`` refuses an empty or longer
      array (400), so the schema says minItems/maxItems (tests/fuzz holds the server to every schema-valid request);
    - no response is a bare array: every list answers its page envelope (``apps.core.shapes.page_of``), which drf-spectacular
      would otherwise wrap in an array for a ViewSet's ``list``.
    """

    def _is_list_view(self, serializer=None) -> bool:
        return False

    def _unwrap_list_serializer(self, serializer, direction):
        schema = super()._unwrap_list_serializer(serializer, direction)
        if schema is not None and isinstance(serializer, ListSerializer):
            if not serializer.allow_empty:
                schema["minItems"] = max(1, serializer.min_length or 0)
            elif serializer.min_length is not None:
                schema["minItems"] = serializer.min_length
            if serializer.max_length is not None:
                schema["maxItems"] = serializer.max_length
        return schema
