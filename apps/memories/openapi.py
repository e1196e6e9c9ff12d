"""The memory endpoints' OpenAPI details that depend on run-time settings.

The namespace depth limit (memory.episodic.namespace.max_depth) is an admin setting that changes without a
restart, so it cannot be written into the schema when the views are defined: a namespace schema carries the
``x-namespace-depth`` marker and this post-processing hook (SPECTACULAR_SETTINGS) turns it into ``maxItems`` with
the value in force when /openapi.json is served.
"""

from __future__ import annotations

from typing import Any

from apps.memories import config

DEPTH_MARKER = "x-namespace-depth"


def namespace_depth_hook(result: dict[str, Any], generator, request, public) -> dict[str, Any]:
    depth = config.namespace_max_depth()

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            if node.pop(DEPTH_MARKER, False):
                node["maxItems"] = depth
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit(result)
    return result


# The search body's rules between fields (MemorySearchSerializer.validate), so a body the schema admits is one the
# service takes (tests/fuzz): query and queries exclusive; per_query_limit only with queries; search_type only with
# one of them.
SEARCH_BODY_RULES = [
    {"not": {"required": ["query", "queries"]}},
    {"anyOf": [{"not": {"required": ["per_query_limit"]}}, {"required": ["queries"]}]},
    {"anyOf": [{"not": {"required": ["search_type"]}}, {"required": ["query"]}, {"required": ["queries"]}]},
]


def search_body_hook(result: dict[str, Any], generator, request, public) -> dict[str, Any]:
    body = result.get("components", {}).get("schemas", {}).get("MemorySearchRequest")
    if body is not None:
        body["allOf"] = SEARCH_BODY_RULES
    return result
