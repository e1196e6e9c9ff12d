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
