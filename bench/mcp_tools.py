"""A tool call of the MCP server (/mcp, apps.mcp) against the same REST call (issue 31: at most +5 ms at p95).

    python bench/mcp_tools.py [--calls N] [--rounds R] [--concurrency C] [--requests M] [--web-workers W]

Starts the Procfile's web server (gunicorn + uvicorn worker, ``--web-workers`` [1]) on a private benchmark database,
seeds bob's memories, then measures three operations, each the REST call and the tool that stands for it, with the
same token, over keep-alive connections of the same client (``http.client``):

- get: ``GET /v1/memories?ns=..&key=..`` and ``get_memory``;
- put: ``PUT /v1/memories`` and ``put_memory`` (the same value; each side rewrites its own 100 keys in turn);
- search: ``POST /v1/memories/search`` (attribute search over bob's 1,000 memories, limit 10) and ``search_memories``.

A tool call is the JSON-RPC POST an MCP client sends, in each protocol era the server speaks: after the 2025-11-25
``initialize`` handshake a bare request (``MCP-Protocol-Version`` header; the server is stateless, so there is no
session to carry), and in 2026-07-28 the per-request envelope (``_meta`` with the version, client info and
capabilities, and the ``Mcp-Method``/``Mcp-Name`` headers), as the SDK's client sends them. The client parses the
answer and checks ``isError`` as it checks the REST status. The REST call is the floor: the same service,
serializer, policy and SQL without the MCP layer.

- c1: the three (REST, MCP in each era) in turn, call by call (the order rotated every call), ``--rounds`` x
  ``--calls`` calls each, so a load change on a shared machine hits all alike; p50/p95/p99 and the differences
  against REST. The goal is on p95.
- cN (``--concurrency`` [8]): each as a closed loop of ``--requests`` calls, back to back; throughput, p50/p95 and
  the web server's CPU per call (ms of CPU, all its processes).
- Informational: ``tools/list``, and ``get_memory`` through the SDK's own client (``mcp.Client.call_tool`` in this
  process: what a Python agent sees, its client's work included; the client validates every result against the
  tool's output schema).

Results: a markdown report on stdout, JSON in bench/results/. (Not ``bench/mcp.py``: bench/ is first on the path of
a bench script, and that name would hide the ``mcp`` SDK.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _harness as h

DB_NAME = "memory_service_bench_mcp"
USER, PASSWORD = "bob", "bob"
NAMESPACE = ["user", "bob", "bench"]
SEEDED = 1000
GOAL_P95_MS = 5.0
LEGACY, MODERN = "2025-11-25", "2026-07-28"
MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "0"},
    "io.modelcontextprotocol/clientCapabilities": {},
}


def rest_get(session: h.HttpSession, i: int) -> None:
    query = urllib.parse.urlencode({"ns": NAMESPACE, "key": f"m{i % SEEDED:04}"}, doseq=True)
    json.loads(session.request("GET", f"/v1/memories?{query}")[1])


def rest_put(session: h.HttpSession, i: int) -> None:
    body = {"namespace": NAMESPACE, "key": f"rest-{i % 100}", "value": {"likes": "flat white", "n": i}}
    json.loads(session.request("PUT", "/v1/memories", body)[1])


def rest_search(session: h.HttpSession, i: int) -> None:
    json.loads(session.request("POST", "/v1/memories/search", {"namespace_prefix": NAMESPACE, "limit": 10})[1])


def tool(name: str, arguments: Callable[[int], dict], era: str) -> Callable[[h.HttpSession, int], None]:
    """The tools/call of one protocol era: after the 2025-11-25 handshake a bare JSON-RPC request (the version in a
    header); in 2026-07-28 every request carries the envelope (``_meta``) and its routing headers."""

    def call(session: h.HttpSession, i: int) -> None:
        params: dict[str, Any] = {"name": name, "arguments": arguments(i)}
        if era == MODERN:
            params["_meta"] = MODERN_META
        body = {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": params}
        answer = json.loads(session.request("POST", "/mcp", body)[1])
        result = answer.get("result")
        if result is None or result.get("isError"):
            raise h.BenchError(f"{name} failed: {json.dumps(answer)[:300]}")

    call.tool_name = name  # type: ignore[attr-defined]
    return call


def _get_arguments(i: int) -> dict:
    return {"namespace": NAMESPACE, "key": f"m{i % SEEDED:04}"}


def _put_arguments(i: int) -> dict:
    return {"namespace": NAMESPACE, "key": f"mcp-{i % 100}", "value": {"likes": "flat white", "n": i}}


def _search_arguments(i: int) -> dict:
    return {"namespace_prefix": NAMESPACE, "limit": 10}


def mcp_list(session: h.HttpSession, i: int) -> None:
    answer = json.loads(session.request("POST", "/mcp", {"jsonrpc": "2.0", "id": i, "method": "tools/list"})[1])
    if len(answer["result"]["tools"]) < 11:
        raise h.BenchError(f"tools/list: {json.dumps(answer)[:300]}")


# op -> (REST call, tool name, its arguments)
OPS: dict[str, tuple[Callable[[h.HttpSession, int], None], str, Callable[[int], dict]]] = {
    "get": (rest_get, "get_memory", _get_arguments),
    "put": (rest_put, "put_memory", _put_arguments),
    "search": (rest_search, "search_memories", _search_arguments),
}
SIDES = ("rest", LEGACY, MODERN)


def side_call(op: str, side: str) -> Callable[[h.HttpSession, int], None]:
    rest, name, arguments = OPS[op]
    return rest if side == "rest" else tool(name, arguments, side)


def session_for(server: h.WebServer, token: str, side: str, tool_name: str | None = None) -> h.HttpSession:
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    if side != "rest":
        headers.update({"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": side})
        if side == MODERN and tool_name:
            headers.update({"Mcp-Method": "tools/call", "Mcp-Name": tool_name})
    session = h.HttpSession(server.host, server.port, headers)
    session.conn.connect()
    return session


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {f"p{q}": round(h.percentile(ordered, q) * 1000, 3) for q in (50, 95, 99)} | {"calls": len(ordered)}


def interleaved(server: h.WebServer, token: str, *, rounds: int, per_round: int, warmup: int = 50) -> dict[str, Any]:
    """c1: for each op, the REST call and the tool in both eras, rotated call by call on connections of their own."""
    results: dict[str, Any] = {}
    for op, (_rest, name, _arguments) in OPS.items():
        sessions = {side: session_for(server, token, side, name) for side in SIDES}
        calls = {side: side_call(op, side) for side in SIDES}
        samples: dict[str, list[float]] = {side: [] for side in SIDES}
        try:
            for i in range(warmup):
                for side in SIDES:
                    calls[side](sessions[side], i)
            h.log(f"c1 {op}: {rounds * per_round} calls each, REST and MCP ({LEGACY}, {MODERN}) in turn")
            for i in range(rounds * per_round):
                shift = i % len(SIDES)
                for side in SIDES[shift:] + SIDES[:shift]:
                    started = time.perf_counter()
                    calls[side](sessions[side], i)
                    samples[side].append(time.perf_counter() - started)
        finally:
            for session in sessions.values():
                session.close()
        results[op] = {side: summary(values) for side, values in samples.items()}
        for side in (LEGACY, MODERN):
            results[op][f"delta_p50_ms_{side}"] = round(results[op][side]["p50"] - results[op]["rest"]["p50"], 3)
            results[op][f"delta_p95_ms_{side}"] = round(results[op][side]["p95"] - results[op]["rest"]["p95"], 3)
    return results


def concurrent(server: h.WebServer, token: str, *, concurrency: int, requests: int, max_seconds: float) -> dict[str, Any]:
    """cN: each side of each op as a closed loop, back to back, with the web server's CPU."""
    cpu = h.CpuMeter({"web": server.process.pid, "pg": h.postmaster_pid()})
    results: dict[str, Any] = {}
    for op, (_rest, name, _arguments) in OPS.items():
        for side in SIDES:
            h.log(f"c{concurrency} {op} {side}: {requests} calls")
            fn = side_call(op, side)
            run = h.run_load(
                f"{op}-{side}",
                lambda index, fn=fn, side=side, name=name: _Worker(session_for(server, token, side, name), fn),
                concurrency=concurrency, requests=requests, max_seconds=max_seconds, cpu=cpu,
            )  # fmt: skip
            if run.errors:
                raise h.BenchError(f"{op} {side}: {run.errors} errors, e.g. {run.error_samples}")
            summary_ = run.summary()
            web_cpu_ms = run.cpu_percent.get("web", 0) / 100 * run.wall / max(run.completed, 1) * 1000
            summary_["web_cpu_ms_per_call"] = round(web_cpu_ms, 3)
            results.setdefault(op, {})[side] = summary_
    return results


class _Worker:
    def __init__(self, session: h.HttpSession, fn: Callable[[h.HttpSession, int], None]) -> None:
        self.session, self.fn = session, fn

    def call(self, i: int) -> None:
        self.fn(self.session, i)

    def close(self) -> None:
        self.session.close()


def informational(server: h.WebServer, token: str, *, calls: int) -> dict[str, Any]:
    session = session_for(server, token, LEGACY)
    try:
        for i in range(20):
            mcp_list(session, i)
        listing: list[float] = []
        for i in range(calls):
            started = time.perf_counter()
            mcp_list(session, i)
            listing.append(time.perf_counter() - started)
    finally:
        session.close()
    return {"tools_list": summary(listing), "sdk_get_memory": asyncio.run(_sdk_get(server, token, calls))}


async def _sdk_get(server: h.WebServer, token: str, calls: int) -> dict[str, float]:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    samples: list[float] = []
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
        async with Client(streamable_http_client(f"{server.base_url}/mcp", http_client=http), mode="legacy") as client:
            for i in range(calls + 20):
                started = time.perf_counter()
                result = await client.call_tool("get_memory", {"namespace": NAMESPACE, "key": f"m{i % SEEDED:04}"})
                if result.is_error:
                    raise h.BenchError(f"SDK get_memory failed: {result.content}")
                if i >= 20:
                    samples.append(time.perf_counter() - started)
    return summary(samples)


def seed(server: h.WebServer, token: str) -> None:
    h.log(f"seeding {SEEDED} memories")
    session = session_for(server, token, "rest")
    try:
        for i in range(SEEDED):
            value = {"likes": "flat white", "n": i, "note": "a memory of about a hundred bytes " * 2}
            session.request("PUT", "/v1/memories", {"namespace": NAMESPACE, "key": f"m{i:04}", "value": value})
    finally:
        session.close()


def report(c1: dict[str, Any], cn: dict[str, Any], info: dict[str, Any], concurrency: int, loads: tuple[str, str]) -> str:
    rows = []
    for op, sides in c1.items():
        for side in (LEGACY, MODERN):
            delta95 = sides[f"delta_p95_ms_{side}"]
            rows.append([
                op, side, h.fmt(sides["rest"]["p50"]), h.fmt(sides["rest"]["p95"]), h.fmt(sides["rest"]["p99"]),
                h.fmt(sides[side]["p50"]), h.fmt(sides[side]["p95"]), h.fmt(sides[side]["p99"]),
                f"{sides[f'delta_p50_ms_{side}']:+.2f}", f"{delta95:+.2f}", "yes" if delta95 <= GOAL_P95_MS else "NO",
            ])  # fmt: skip
    load_rows = []
    for op, sides in cn.items():
        for side in SIDES:
            run = sides[side]
            load_rows.append([f"{op} {'REST' if side == 'rest' else 'MCP ' + side}", run["completed"],
                              h.fmt(run["throughput_per_s"], 0), h.fmt(run["p50_ms"]), h.fmt(run["p95_ms"]),
                              h.fmt(run["web_cpu_ms_per_call"])])  # fmt: skip
    calls = c1["get"]["rest"]["calls"]
    return "\n".join([
        "## A tool call against the same REST call (c1, in turn)",
        "",
        h.markdown_table(["op", "MCP era", "REST p50", "REST p95", "REST p99", "MCP p50", "MCP p95", "MCP p99",
                          "Δ p50", "Δ p95", f"Δ p95 ≤ {GOAL_P95_MS:g} ms"], rows),
        "",
        f"ms; {calls} calls per side and op.",
        "",
        f"## Closed loop at c{concurrency}, back to back",
        "",
        h.markdown_table(["op", "calls", "calls/s", "p50 ms", "p95 ms", "web CPU ms/call"], load_rows),
        "",
        "## Informational",
        "",
        f"- tools/list (21 KB of schemas): p50 {info['tools_list']['p50']:.2f} ms, p95 {info['tools_list']['p95']:.2f} ms.",
        f"- get_memory through the SDK's client (mcp.Client.call_tool, output validated): p50 "
        f"{info['sdk_get_memory']['p50']:.2f} ms, p95 {info['sdk_get_memory']['p95']:.2f} ms.",
        f"- Load average (1, 5, 15 min) before: {loads[0]}; after: {loads[1]} ({os.cpu_count()} CPUs).",
    ])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="c1: calls per round per side")
    parser.add_argument("--rounds", type=int, default=4, help="c1: rounds")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--requests", type=int, default=2000, help="cN: calls per side and op")
    parser.add_argument("--max-seconds", type=float, default=20.0, help="cN: time cap per run")
    parser.add_argument("--web-workers", type=int, default=1)
    args = parser.parse_args(argv)
    h.install_sigterm_handler()

    server_url = h.embedded_postgres_url()
    database_url = h.recreate_database(server_url, DB_NAME)
    h.log("migrating the benchmark database")
    h.migrate(database_url)
    log_path = Path(h.RESULTS_DIR) / "mcp-web.log"
    load_before = " ".join(f"{value:.2f}" for value in os.getloadavg())
    started = time.monotonic()
    with h.web_server(database_url, workers=args.web_workers, log_path=log_path,
                      extra_env={"EMBEDDING_PROVIDER": "hash"}) as server:  # fmt: skip
        token = h.mint_token(server.base_url, USER, PASSWORD)
        seed(server, token)
        c1 = interleaved(server, token, rounds=args.rounds, per_round=args.calls)
        cn = concurrent(server, token, concurrency=args.concurrency, requests=args.requests, max_seconds=args.max_seconds)
        info = informational(server, token, calls=args.calls)
    load_after = " ".join(f"{value:.2f}" for value in os.getloadavg())
    print(report(c1, cn, info, args.concurrency, (load_before, load_after)))
    path = h.write_json("mcp", {
        "machine": h.machine_info(database_url, load_avg_at_end=load_after),
        "command": h.command_line(),
        "seconds": round(time.monotonic() - started, 1),
        "c1": c1,
        f"c{args.concurrency}": cn,
        "informational": info,
    })  # fmt: skip
    h.log(f"results written to {path.relative_to(h.REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    h.run_main(main)
