"""ASGI-native routes of the MCP server, picked up by config.asgi beside the event stream's.

``/mcp`` needs the REST bridge's thread pool (its tools run Django code there), so config.asgi passes it in."""

from __future__ import annotations

from concurrent.futures import Executor

from apps.mcp import metadata
from apps.mcp.server import ROUTE, McpApplication


def native_routes(executor: Executor) -> dict[str, object]:
    mcp = McpApplication(executor)
    return {ROUTE: mcp, **{path: metadata.application for path in metadata.PATHS}}
