"""The Python client's cost per call, against bare httpx on the same endpoint (issue 22).

    python bench/clients.py [--calls N] [--rounds R]

Starts the Procfile's web server (gunicorn + uvicorn worker, 1 worker) on a private benchmark database and seeds one
memory. Then, in one process and one run, it times the memory GET (GET /v1/memories, the hottest point read) two
ways over the same kind of keep-alive connection with the same token:

- bare: ``httpx.Client.get(url, params, headers)``, status check, ``response.json()``: the floor a user of plain
  httpx would have;
- sdk: ``memory_service.Client.get_memory(namespace, key)``: request built from the operation, token resolved,
  retry bookkeeping, error mapping, the answer parsed into a ``Memory`` dataclass.

The two are interleaved call by call (``--rounds`` x ``--calls`` calls each, the order flipped every call), so load
changes on a shared machine hit both alike. It reports p50/p95/p99 of both and the SDK's p50 overhead against bare (goal: within 10%), and the
client-side cost alone (both against an in-process transport with a canned answer: no network, no server).

Results: a markdown report on stdout, JSON in bench/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _harness as h

# The client from this checkout, whether or not the venv has it installed.
sys.path.insert(0, str(h.REPO_ROOT / "clients" / "python" / "src"))

import httpx
from memory_service import Client

DB_NAME = "memory_service_bench_clients"
USER, PASSWORD = "bob", "bob"
NAMESPACE = ("user", "bob", "bench")
KEY = "coffee"
GOAL_OVERHEAD = 0.10


def percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {f"p{q}": h.percentile(ordered, q) * 1000 for q in (50, 95, 99)} | {"calls": len(ordered)}


def bare_get(http: httpx.Client, base_url: str, token: str) -> Callable[[], Any]:
    url = f"{base_url}/v1/memories"
    params = [*(("ns", segment) for segment in NAMESPACE), ("key", KEY)]
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}

    def call() -> Any:
        response = http.get(url, params=params, headers=headers)
        if response.status_code != 200:
            raise h.BenchError(f"bare GET answered {response.status_code}: {response.text[:200]}")
        return response.json()

    return call


def sdk_get(client: Client) -> Callable[[], Any]:
    return lambda: client.get_memory(NAMESPACE, KEY)


def alternate(calls: dict[str, Callable[[], Any]], *, rounds: int, per_round: int) -> dict[str, list[float]]:
    """Per-call seconds of each callable (warmed up first), interleaved call by call with the order flipped every
    call, so a load change on a shared machine lands on both alike."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for fn in calls.values():
        for _ in range(50):
            fn()
    items = list(calls.items())
    for index in range(rounds * per_round):
        for name, fn in items if index % 2 == 0 else reversed(items):
            started = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - started)
    return samples


def canned_transport(body: bytes) -> httpx.MockTransport:
    headers = {"Content-Type": "application/json", "X-Request-ID": "bench"}
    return httpx.MockTransport(lambda request: httpx.Response(200, headers=headers, content=body))


def measure_overhead(server: h.WebServer, token: str, *, rounds: int, per_round: int) -> dict[str, Any]:
    with Client(server.base_url, token=token) as client, httpx.Client(timeout=30) as http:
        client.put_memory(NAMESPACE, KEY, {"likes": "flat white", "milk": "oat", "shots": 2},
                          index={"text": "bob likes a flat white"})
        h.log(f"live: {rounds * per_round} calls each, bare httpx and the SDK interleaved")
        live = alternate({"bare": bare_get(http, server.base_url, token), "sdk": sdk_get(client)},
                         rounds=rounds, per_round=per_round)
        body = json.dumps(bare_get(http, server.base_url, token)()).encode()

    h.log("client side only: both against an in-process transport with the same answer")
    with httpx.Client(transport=canned_transport(body)) as bare_http, \
            Client(server.base_url, token=token, http_client=httpx.Client(transport=canned_transport(body))) as sdk:
        local = alternate({"bare": bare_get(bare_http, server.base_url, token), "sdk": sdk_get(sdk)},
                          rounds=rounds, per_round=per_round)
    result = {"live": {name: percentiles(values) for name, values in live.items()},
              "client_side": {name: percentiles(values) for name, values in local.items()}}
    result["p50_overhead"] = result["live"]["sdk"]["p50"] / result["live"]["bare"]["p50"] - 1
    result["client_side_p50_extra_us"] = (result["client_side"]["sdk"]["p50"] - result["client_side"]["bare"]["p50"]) * 1000
    return result


def report(result: dict[str, Any], load_before: str, load_after: str) -> str:
    rows = []
    for scope in ("live", "client_side"):
        for name in ("bare", "sdk"):
            row = result[scope][name]
            rows.append([f"{scope.replace('_', ' ')}: {'bare httpx' if name == 'bare' else 'memory_service.Client'}",
                         row["calls"], h.fmt(row["p50"], 3), h.fmt(row["p95"], 3), h.fmt(row["p99"], 3)])
    overhead = result["p50_overhead"]
    verdict = "within" if overhead <= GOAL_OVERHEAD else "OVER"
    return "\n".join([
        "## memory GET: the Python client against bare httpx",
        "",
        h.markdown_table(["caller", "calls", "p50 ms", "p95 ms", "p99 ms"], rows),
        "",
        f"SDK p50 overhead against bare httpx, live: {overhead * 100:+.1f}% ({verdict} the {GOAL_OVERHEAD:.0%} goal); "
        f"client-side work the SDK adds per call: {result['client_side_p50_extra_us']:.1f} µs at p50.",
        f"Load average (1, 5, 15 min) before: {load_before}; after: {load_after} ({os.cpu_count()} CPUs).",
    ])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=500, help="calls per round per caller")
    parser.add_argument("--rounds", type=int, default=6, help="alternating rounds")
    args = parser.parse_args()
    h.install_sigterm_handler()

    server_url = h.embedded_postgres_url()
    database_url = h.recreate_database(server_url, DB_NAME)
    h.log("migrating the benchmark database")
    h.migrate(database_url)
    log_path = Path(h.RESULTS_DIR) / "clients-web.log"
    load_before = " ".join(f"{value:.2f}" for value in os.getloadavg())
    started = time.monotonic()
    with h.web_server(database_url, workers=1, log_path=log_path, extra_env={"EMBEDDING_PROVIDER": "hash"}) as server:
        token = h.mint_token(server.base_url, USER, PASSWORD)
        result = measure_overhead(server, token, rounds=args.rounds, per_round=args.calls)
    load_after = " ".join(f"{value:.2f}" for value in os.getloadavg())
    print(report(result, load_before, load_after))
    path = h.write_json("clients", {
        "machine": h.machine_info(database_url, load_avg_at_end=load_after),
        "command": h.command_line(),
        "seconds": round(time.monotonic() - started, 1),
        "memory_get": result,
    })
    h.log(f"results written to {path.relative_to(h.REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
