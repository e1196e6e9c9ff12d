"""``/mcp``: the Model Context Protocol server (D11) over Streamable HTTP, on the official ``mcp`` SDK.

config.asgi serves it natively next to the REST API, on the same port and event loop (apps.mcp.routing). Per HTTP
request:

1. Authenticate exactly as the REST API does (apps.identity.authentication: a Bearer token, optionally with
   ``X-API-Key``), in a request thread. Without credentials, or with bad ones, the answer is D1's 401 with
   ``WWW-Authenticate: Bearer ... resource_metadata="..."`` pointing at the protected-resource metadata (RFC 9728,
   apps.mcp.metadata), which is how an MCP client finds the authorization server.
2. Hand the request to the SDK's session manager in **stateless** mode with JSON responses: every POST is a
   self-contained JSON-RPC exchange, so any worker of any host can serve any request, with no session affinity and
   no server-side state to lose on a restart. The SDK speaks both protocol eras (the ``initialize`` handshake and
   the 2026-07-28 per-request envelope).
3. ``tools/call`` runs the tool (apps.mcp.tools) in a request thread of the REST bridge's pool, between Django's
   ``request_started`` and ``request_finished`` signals, as a WSGI request would (database connections are checked
   out and recycled the same way; the pool caps them as it does for REST). A refusal of any kind (validation,
   policy, access, not found, an unavailable dependency) is a tool result with ``isError: true`` carrying D1's body
   (``code``, ``error``, ``requestId``, ...), never a JSON-RPC error.

Each HTTP request gets a request id (the caller's ``X-Request-ID`` when well-formed), echoed in ``X-Request-ID``,
one access-log line and the request-latency metric under the route ``/mcp``; each tool call one more line and metric
under ``/mcp/tools/<name>`` with the status its REST twin would have answered.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, TypeVar

import mcp_types as types
from django.conf import settings
from django.core import signals
from django.http.request import split_domain_port, validate_host
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError

from apps.core import errors, metrics
from apps.core.logging import request_id_for, reset_request_id, set_request_id
from apps.core.renderers import JSONRenderer
from apps.identity.authentication import authenticate_cached, authenticate_credentials
from apps.identity.principal import Principal
from apps.limits.rates import check_rate
from apps.mcp import metadata, tools
from apps.memories import config as memory_config

logger = logging.getLogger(__name__)
access_log = logging.getLogger("apps.access")

T = TypeVar("T")

ROUTE = "/mcp"
# Where the HTTP layer leaves the caller for the SDK's handlers: ctx.request is the Starlette request over this scope.
PRINCIPAL_KEY = "memory_service.principal"
REQUEST_ID_KEY = "memory_service.request_id"

INSTRUCTIONS = (
    "Memory Service: long-term memories (JSON values under namespaces, searchable by meaning) and conversations. "
    "Every tool acts as the signed-in user, under the service's access policies: by default a user reads and writes "
    "memories only under [\"user\", <their user id>, ...]. A refusal is a tool error whose JSON names a stable "
    "`code` (validation_error, forbidden, not_found, ...) and a message."
)

_renderer = JSONRenderer()


def _json_text(data: Any) -> str:
    """The REST API's own JSON encoding (apps.core.renderers): the text content is what REST would have answered."""
    return _renderer.render(data).decode()


def tool_result(data: dict[str, Any]) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=_json_text(data))], structured_content=data, is_error=False
    )


def tool_error(error: errors.ApiError) -> types.CallToolResult:
    """D1's body as a tool error. A ``Retry-After`` the REST answer would carry (503, 429) goes in ``_meta``."""
    body = errors.body(error)
    meta = None
    retry_after = error.headers.get("Retry-After")
    if retry_after is not None and retry_after.isdigit():
        meta = {"retryAfter": int(retry_after)}
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=_json_text(body))],
        structured_content=body,
        is_error=True,
        _meta=meta,
    )


# A tool's rate class beside the per-request one, as its REST twin's view names it (``rate_kinds``).
RATE_KINDS = {"search_memories": "searches", "search_conversations": "searches"}


def check_request(principal: Principal, tool: tools.Tool) -> None:
    """The request-level checks every tool call passes before it runs, as a REST request passes them before its
    view: the caller's request rates (D11; apps.limits). Raises errors.ApiError (429 ``rate_limited`` with
    ``Retry-After``) to refuse the call. Quotas and the ``creates`` class are charged by the services themselves."""
    check_rate(principal, RATE_KINDS.get(tool.name))


def run_tool(principal: Principal, tool: tools.Tool, arguments: Any) -> types.CallToolResult:
    """One tool call, in a request thread: checks, validation, the app's service or selector; any refusal becomes
    the tool error of D1's body (an unexpected exception a 500 ``internal_error``, logged)."""
    started = time.perf_counter()
    try:
        check_request(principal, tool)
        result = tool_result(tools.call(principal, tool, arguments))
        status = 200
    except Exception as exc:
        error = errors.from_exception(exc)
        if error is None:
            logger.exception("unhandled error in MCP tool", extra={"tool": tool.name})
            error = errors.ApiError(500, "Internal server error.")
        result, status = tool_error(error), error.status
    elapsed = time.perf_counter() - started
    route = f"{ROUTE}/tools/{tool.name}"
    metrics.observe_request("POST", route, status, elapsed)
    access_log.info(
        "tool call", extra={"method": "POST", "route": route, "status": status, "duration_ms": round(elapsed * 1000, 2)}
    )
    return result


@functools.cache
def tool_list(namespace_depth: int) -> tuple[types.Tool, ...]:
    """Every tool, with a write's namespace capped at the depth in force (cached per depth: built once)."""
    return tuple(
        types.Tool(
            name=tool.name,
            title=tool.title,
            description=tool.description,
            input_schema=tool.input_schema(namespace_depth),
            output_schema=tool.output_schema(),
            annotations=types.ToolAnnotations(**tool.annotations()),
        )
        for tool in tools.TOOLS.values()
    )


def _in_request(request_id: str, function: Callable[..., T], *args: Any) -> T:
    """``function(*args)`` as Django runs a view: between request_started and request_finished (old or broken
    database connections are closed, queued events flushed), with the request id in the logs."""
    token = set_request_id(request_id)
    signals.request_started.send(sender=McpApplication)
    try:
        return function(*args)
    finally:
        signals.request_finished.send(sender=McpApplication)
        reset_request_id(token)


class McpApplication:
    """The ASGI application at ``/mcp``. ``executor`` runs everything that touches Django (the REST bridge's
    thread pool, so MCP and REST share its cap on threads and database connections)."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self.server: Server[Any] = Server(
            "memory-service",
            title="Memory Service",
            instructions=INSTRUCTIONS,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            get_tool_input_schema=self._input_schema,
        )
        # The SDK wraps every message in an OpenTelemetry span by default; the service exports no traces (its
        # requests are logged and measured here), so the per-message span is work without a reader.
        self.server.middleware = []
        self._manager: StreamableHTTPSessionManager | None = None
        self._started: asyncio.Future | None = None

    # --- HTTP -----------------------------------------------------------------------------------------------------

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        request_id = request_id_for(headers.get("x-request-id", ""))
        token = set_request_id(request_id)
        started = time.perf_counter()
        status: int | None = None

        async def send_with_request_id(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), (b"x-request-id", request_id.encode())]}
            await send(message)

        try:
            await self._serve(scope, receive, send_with_request_id, headers, request_id)
        except Exception as exc:
            error = errors.from_exception(exc)
            if error is None:
                logger.exception("MCP request failed")
                error = errors.ApiError(500, "Internal server error.")
            if status is None:  # nothing sent yet: answer with D1's body
                await _send_error(send_with_request_id, error, scope)
        finally:
            elapsed = time.perf_counter() - started
            answered = 499 if status is None else status  # the client left before any answer
            metrics.observe_request(scope["method"], ROUTE, answered, elapsed)
            duration_ms = round(elapsed * 1000, 2)
            access_log.info(
                "request",
                extra={"method": scope["method"], "route": ROUTE, "status": answered, "duration_ms": duration_ms},
            )
            reset_request_id(token)

    async def _serve(self, scope: dict, receive: Callable, send: Callable, headers: dict, request_id: str) -> None:
        if not _host_allowed(headers.get("host", "")):
            await _send_error(send, errors.validation_error({"Host": "not an allowed host"}, "Bad Request."), scope)
            return
        authorization, api_key = headers.get("authorization", ""), headers.get("x-api-key")
        # An agent sends the same token on every call: verified moments ago, it is decided here, on the loop, and
        # the call makes one thread hop (the tool's) instead of two.
        authenticated = authenticate_cached(authorization, api_key)
        if authenticated is None and (authorization or api_key):
            try:
                authenticated = await self.in_thread(request_id, authenticate_credentials, authorization, api_key)
            except errors.ApiError as error:
                await _send_error(send, _with_metadata(error, scope), scope)
                return
        if authenticated is None:
            await _send_error(send, _with_metadata(errors.unauthenticated(), scope), scope)
            return
        if scope["method"] != "POST":
            # Stateless: no server-initiated messages, so no GET stream to open and no session to DELETE. The spec
            # lets such a server answer 405 (a GET would otherwise hold a connection open with nothing to say).
            refusal = errors.ApiError(405, f"Method {scope['method']} is not allowed.", headers={"Allow": "POST"})
            await _send_error(send, refusal, scope)
            return
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > settings.REQUEST_MAX_BODY_BYTES:
            # As the REST API (apps.core.middleware.BodySizeLimitMiddleware): D1's 413 from the header, unread. A
            # chunked body is held to the same limit by the SDK while it reads.
            limit = settings.REQUEST_MAX_BODY_BYTES
            await _send_error(send, errors.payload_too_large(f"Request body exceeds {limit} bytes."), scope)
            return
        scope[PRINCIPAL_KEY] = authenticated[0]
        scope[REQUEST_ID_KEY] = request_id
        manager = await self._running_manager()
        await manager.handle_request(scope, receive, send)

    async def in_thread(self, request_id: str, function: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        call = functools.partial(contextvars.copy_context().run, _in_request, request_id, function, *args)
        return await loop.run_in_executor(self.executor, call)

    async def _running_manager(self) -> StreamableHTTPSessionManager:
        """The SDK's session manager, started on first use in this process's event loop and kept running: it needs
        a task group for its life, which neither daphne (no ASGI lifespan) nor a forked gunicorn worker (the
        application is imported before the fork) can give it at import."""
        if self._started is None:
            self._started = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().create_task(self._run_manager(self._started))
        return await asyncio.shield(self._started)

    async def _run_manager(self, started: asyncio.Future) -> None:
        manager = StreamableHTTPSessionManager(
            app=self.server,
            json_response=True,
            stateless=True,
            max_request_body_size=settings.REQUEST_MAX_BODY_BYTES,
        )
        try:
            async with manager.run():
                started.set_result(manager)
                await asyncio.Event().wait()  # for the life of the process
        except BaseException as exc:
            if not started.done():
                started.set_exception(exc if isinstance(exc, Exception) else RuntimeError("MCP manager stopped"))
            self._started = None  # the next request starts another
            raise

    # --- MCP handlers ---------------------------------------------------------------------------------------------

    async def _list_tools(self, ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        request_id = _request_id(ctx)
        depth = await self.in_thread(request_id, memory_config.namespace_max_depth)
        return types.ListToolsResult(tools=list(tool_list(depth)))

    async def _call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        tool = tools.TOOLS.get(params.name)
        if tool is None:
            # Not an argument the caller got wrong but a tool that does not exist: the protocol's error (MCP spec).
            raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown tool: {params.name[:100]}")
        principal = ctx.request.scope[PRINCIPAL_KEY]
        return await self.in_thread(_request_id(ctx), run_tool, principal, tool, params.arguments)

    def _input_schema(self, name: str) -> dict[str, Any] | None:
        tool = tools.TOOLS.get(name)
        return None if tool is None else tool.input_schema()


def _request_id(ctx: Any) -> str:
    request = getattr(ctx, "request", None)
    return request.scope.get(REQUEST_ID_KEY, "-") if request is not None else "-"


def _host_allowed(host: str) -> bool:
    """Django's ALLOWED_HOSTS, as a REST request is held to it (the REST API answers a disallowed host with 400)."""
    domain, _port = split_domain_port(host)
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    return bool(domain) and validate_host(domain, allowed)


def _with_metadata(error: errors.ApiError, scope: dict) -> errors.ApiError:
    """A 401 whose challenge names the protected-resource metadata (RFC 9728 section 5.1), as MCP clients expect."""
    if error.status == 401:
        challenge = f'Bearer realm="memory-service", resource_metadata="{metadata.metadata_url(scope)}"'
        if "authorization" in {name.decode("latin-1").lower() for name, _ in scope["headers"]}:
            challenge += ', error="invalid_token"'
        error.headers = {**error.headers, "WWW-Authenticate": challenge}
    return error


async def _send_error(send: Callable, error: errors.ApiError, scope: dict) -> None:
    body = _renderer.render(errors.body(error))
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body if scope["method"] != "HEAD" else b""})
