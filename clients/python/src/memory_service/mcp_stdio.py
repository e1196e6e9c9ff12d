"""``memory-service-mcp``: Memory Service's MCP tools over stdio, for desktop clients that only launch local servers
(Claude Desktop, ...). It serves MCP on stdin/stdout and forwards ``tools/list`` and ``tools/call`` to the service's
own MCP server (``<url>/mcp``, Streamable HTTP), so the tools, their schemas, the policies and every answer are the
service's; nothing is decided here.

``pip install 'memory-service-client[mcp]'`` (the official ``mcp`` SDK). Configured from the environment:

- ``MEMORY_SERVICE_URL``: the service (``https://memory.example.com``; ``/mcp`` is appended unless present).
- ``MEMORY_SERVICE_TOKEN``: a bearer access token. Or, to fetch and refresh tokens from the identity provider,
  ``MEMORY_SERVICE_TOKEN_URL`` with ``MEMORY_SERVICE_CLIENT_ID`` and ``MEMORY_SERVICE_CLIENT_SECRET``, plus
  ``MEMORY_SERVICE_USERNAME`` and ``MEMORY_SERVICE_PASSWORD`` for a user's own token (password grant; without them,
  the client-credentials grant).
- ``MEMORY_SERVICE_API_KEY`` (optional): sent as ``X-API-Key`` with the token, as for REST (the service needs a
  user's token on every call; the key only names the calling application).

Run ``memory-service-mcp`` (or ``python -m memory_service.mcp_stdio``). Logs go to stderr, never to stdout (the
protocol's channel); tokens and keys are never logged.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

try:
    import httpx2
    import mcp_types as types
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("memory_service.mcp_stdio needs the mcp extra: pip install 'memory-service-client[mcp]'") from exc

from memory_service.auth import OAuthToken

logger = logging.getLogger("memory_service.mcp_stdio")

# How long one forwarded call may take: a semantic search or a large page, not a stream.
READ_TIMEOUT_SECONDS = 120.0
CONNECT_TIMEOUT_SECONDS = 30.0


class ConfigurationError(Exception):
    """The environment does not say where the service is or how to sign in."""


@dataclass(frozen=True)
class Settings:
    url: str
    token: str | None = None
    oauth: OAuthToken | None = None
    api_key: str | None = None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        base = env.get("MEMORY_SERVICE_URL", "").strip()
        if not base.startswith(("http://", "https://")):
            raise ConfigurationError("MEMORY_SERVICE_URL must be the service's http(s) URL")
        url = base.rstrip("/")
        if not url.endswith("/mcp"):
            url += "/mcp"
        token = env.get("MEMORY_SERVICE_TOKEN", "").strip() or None
        oauth = None
        token_url = env.get("MEMORY_SERVICE_TOKEN_URL", "").strip()
        if token is None and token_url:
            client_id = env.get("MEMORY_SERVICE_CLIENT_ID", "").strip()
            secret = env.get("MEMORY_SERVICE_CLIENT_SECRET") or None
            if not client_id:
                raise ConfigurationError("MEMORY_SERVICE_TOKEN_URL needs MEMORY_SERVICE_CLIENT_ID")
            username = env.get("MEMORY_SERVICE_USERNAME", "").strip()
            if username:
                oauth = OAuthToken.password(
                    token_url, client_id=client_id, client_secret=secret, username=username,
                    password=env.get("MEMORY_SERVICE_PASSWORD", ""),
                )  # fmt: skip
            elif secret:
                oauth = OAuthToken.client_credentials(token_url, client_id=client_id, client_secret=secret)
            else:
                raise ConfigurationError("the client-credentials grant needs MEMORY_SERVICE_CLIENT_SECRET")
        if token is None and oauth is None:
            raise ConfigurationError("set MEMORY_SERVICE_TOKEN, or MEMORY_SERVICE_TOKEN_URL and its client settings")
        api_key = env.get("MEMORY_SERVICE_API_KEY", "").strip() or None
        return cls(url=url, token=token, oauth=oauth, api_key=api_key)


class _BearerAuth(httpx2.Auth):
    """``Authorization: Bearer`` on every request: the fixed token, or the OAuth token fetched (and refreshed) before
    it; on a 401 an OAuth token is fetched anew and the request sent once more."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def sync_auth_flow(self, request: httpx2.Request) -> Generator[httpx2.Request, httpx2.Response, None]:
        raise RuntimeError("memory_service.mcp_stdio is asynchronous")  # pragma: no cover

    async def async_auth_flow(self, request: httpx2.Request) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        request.headers["Authorization"] = f"Bearer {await self._token()}"
        response = yield request
        if response.status_code == 401 and self.settings.oauth is not None:
            self.settings.oauth.invalidate()
            request.headers["Authorization"] = f"Bearer {await self._token()}"
            yield request

    async def _token(self) -> str:
        if self.settings.oauth is not None:
            return await self.settings.oauth.async_token()
        assert self.settings.token is not None
        return self.settings.token


@asynccontextmanager
async def upstream(settings: Settings) -> AsyncIterator[Client]:
    """An MCP client session with the service's /mcp."""
    headers = {"X-API-Key": settings.api_key} if settings.api_key else {}
    timeout = httpx2.Timeout(CONNECT_TIMEOUT_SECONDS, read=READ_TIMEOUT_SECONDS)
    async with httpx2.AsyncClient(headers=headers, auth=_BearerAuth(settings), timeout=timeout) as http:
        # No response cache: every listing and call reaches the service, as if the desktop client talked to it.
        async with Client(streamable_http_client(settings.url, http_client=http), cache=None) as client:
            yield client


def proxy_server(service: Client) -> Server[Any]:
    """A stdio MCP server whose tools are the service's: each request is forwarded as it came."""

    async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return await service.list_tools(cursor=params.cursor if params is not None else None)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        # A refusal comes back as the service's tool error (isError, D1's body); a protocol error is raised again.
        return await service.call_tool(params.name, params.arguments)

    info = service.server_info
    return Server(
        info.name if info is not None else "memory-service",
        version=info.version if info is not None else "",
        title=info.title if info is not None else "Memory Service",
        instructions=service.instructions,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


async def serve(settings: Settings) -> None:
    async with upstream(settings) as service:
        server = proxy_server(service)
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())


def main(argv: list[str] | None = None) -> int:
    """The ``memory-service-mcp`` console script."""
    logging.basicConfig(stream=sys.stderr, level=os.environ.get("MEMORY_SERVICE_LOG_LEVEL", "WARNING").upper())
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-h", "--help"):
        print(__doc__, file=sys.stderr)
        return 0
    try:
        settings = Settings.from_environment()
    except ConfigurationError as exc:
        print(f"memory-service-mcp: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(settings))
    except KeyboardInterrupt:
        return 0
    except Exception as exc:  # the service unreachable or refusing the credentials at start: say so, briefly
        leaves = [exc]
        while isinstance(leaves[0], BaseExceptionGroup):
            leaves = list(leaves[0].exceptions)
        print(f"memory-service-mcp: {settings.url}: {leaves[0]!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
