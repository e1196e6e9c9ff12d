"""The fixed cost of the limits (issue 28) on a memory GET and PUT, next to today's figure, in one run.

* HTTP, limiter off vs on: two web servers (as the Procfile starts them) on one private database, the same
  requests to each, at concurrency 1 call by call (off, on, on, off, ...), at higher concurrency in alternating
  rounds, so both see the same machine. "off" runs with
  RATE_LIMITS_ENABLED=false: no Valkey round trip, what a request cost before the limiter. "on" checks the caller's
  bucket in Valkey on every request (its limits out of reach, so nothing is refused). Both charge the quotas:
  that part is in the PUT's own SQL statement, measured below.
* floor, quota charge: the PUT's statements (apps.memories.services.PUT_STATEMENTS, one pipelined round trip)
  through psycopg alone, charged to bob (the row upsert that moves his totals) vs charged to no one (the
  function call returns at once), alternating rounds.
* in-process: the limiter's own call (apps.limits.rates.check_kinds), with its leases and without (one EVALSHA
  round trip to Valkey per call).

PUT (update) replaces one of 64 memories with a value of another size each time, so every one moves bob's
memory_bytes total (a same-size replacement would move nothing and take no lock); PUT (add) writes a new key
each time (both totals move).

Run: ``.venv/bin/python bench/limits.py`` (``--quick`` for a smoke run; ``--help``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import _harness as h

BENCH_DB = "memory_service_bench_limits"
USER, PASSWORD = "bob", "bob"
NS = ["user", USER, "bench"]
TARGETS = 64

FULL = {"rounds": 6, "requests": 400, "floor_requests": 1000}
QUICK = {"rounds": 2, "requests": 100, "floor_requests": 200}


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--web-workers", type=int, default=2, help="gunicorn --workers of each server (default 2)")
    parser.add_argument("--concurrency", default="1", help="client threads, comma-separated (default 1)")
    parser.add_argument("--rounds", type=int, help=f"alternating rounds (default {FULL['rounds']})")
    parser.add_argument("--requests", type=int, help=f"requests per operation, server and round (default {FULL['requests']})")
    parser.add_argument("--floor-requests", type=int, help=f"floor PUTs per side and round (default {FULL['floor_requests']})")
    parser.add_argument("--max-seconds", type=float, default=30.0, help="time cap per measured run (default 30)")
    parser.add_argument("--control", action="store_true",
                        help="A/A control: the 'on' server runs with the limiter off too (the two servers' own difference)")
    parser.add_argument("--quick", action="store_true", help="smoke run")
    args = parser.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.concurrency = [int(value) for value in str(args.concurrency).split(",")]
    return args


def _value(i: int) -> dict[str, str]:
    return {"text": "x" * (200 + 40 * (i % 2))}  # the size alternates: every update moves memory_bytes


class Latencies:
    def __init__(self) -> None:
        self.runs: dict[tuple[str, str, int], list[h.RunResult]] = {}

    def add(self, operation: str, side: str, concurrency: int, result: h.RunResult) -> None:
        if result.errors:
            raise h.BenchError(f"{operation} {side}: {result.errors} failed call(s), e.g. {result.error_samples[:2]}")
        self.runs.setdefault((operation, side, concurrency), []).append(result)

    def merged(self, operation: str, side: str, concurrency: int) -> h.RunResult:
        runs = self.runs[(operation, side, concurrency)]
        latencies = [value for run in runs for value in run.latencies]
        wall = sum(run.wall for run in runs)
        return h.RunResult(operation, concurrency, sum(run.planned for run in runs), latencies, 0, [], wall, {},
                           any(run.timed_out for run in runs))


def http_rounds(args: argparse.Namespace, servers: dict[str, Any], tokens: dict[str, str], out: Latencies) -> None:
    operations: dict[str, Callable[[h.HttpSession, int], None]] = {}
    query = "&".join(f"ns={segment}" for segment in NS)
    operations["GET"] = lambda s, i: s.request("GET", f"/v1/memories?{query}&key=k{i % TARGETS}")
    operations["PUT (update)"] = lambda s, i: s.request(
        "PUT", "/v1/memories", {"namespace": NS, "key": f"k{i % TARGETS}", "value": _value(i)})
    run_tag = uuid.uuid4().hex[:8]
    operations["PUT (add)"] = lambda s, i: s.request(
        "PUT", "/v1/memories", {"namespace": NS, "key": f"add-{run_tag}-{uuid.uuid4().hex}", "value": _value(i)})
    for round_index in range(args.rounds):
        order = ("off", "on") if round_index % 2 == 0 else ("on", "off")
        for operation, call in operations.items():
            for concurrency in args.concurrency:
                if concurrency == 1:
                    sessions = {side: h.HttpWorker(servers[side].base_url,
                                                   {"Authorization": f"Bearer {tokens[side]}"}, call)
                                for side in order}
                    results = paired(operation, sessions, args.requests)
                    for side, result in results.items():
                        out.add(operation, side, 1, result)
                    h.log(f"round {round_index + 1} {operation:<13} c1   " + "  ".join(
                        f"limiter {side} p50={result.ms(50):6.3f} ms" for side, result in results.items()))
                    continue
                for side in order:
                    server, headers = servers[side], {"Authorization": f"Bearer {tokens[side]}"}
                    result = h.run_load(
                        f"{operation} {side}",
                        lambda _i, server=server, headers=headers, call=call: h.HttpWorker(server.base_url, headers, call),
                        concurrency=concurrency, requests=args.requests, max_seconds=args.max_seconds,
                    )
                    out.add(operation, side, concurrency, result)
                    h.log(f"round {round_index + 1} {operation:<13} c{concurrency:<3} limiter {side:<3} "
                          f"p50={result.ms(50):6.3f} ms p99={result.ms(99):6.3f} ms")


def paired(label: str, workers: dict[str, Any], requests: int) -> dict[str, h.RunResult]:
    """At concurrency 1, the two sides call by call (a, b, b, a, a, b, ...): whatever the machine does meanwhile
    (other processes on a shared host) falls on both alike."""
    sides = list(workers)
    latencies: dict[str, list[float]] = {side: [] for side in sides}
    started = time.perf_counter()
    try:
        for i in range(requests):
            for side in (sides if i % 2 == 0 else sides[::-1]):
                begin = time.perf_counter()
                workers[side].call(i)
                latencies[side].append(time.perf_counter() - begin)
    finally:
        for worker in workers.values():
            worker.close()
    wall = time.perf_counter() - started
    return {side: h.RunResult(f"{label} {side}", 1, requests, values, 0, [], wall / 2, {}, False)
            for side, values in latencies.items()}


def floor_rounds(args: argparse.Namespace, database_url: str, out: Latencies) -> None:
    from apps.encryption import crypto
    from apps.memories import keyword_index, services

    def put(charged: bool) -> Callable[[Any, int], None]:
        def call(conn: Any, i: int) -> None:
            key = f"k{i % TARGETS}"
            params = services.write_params(NS, key, "superseded")
            if not charged:
                params["quota_user"] = None
            version_id, event_id = uuid.uuid4(), uuid.uuid4()
            serialized = json.dumps(_value(i)).encode()
            params.update({
                "id": version_id, "value": crypto.encrypt(serialized, purpose=services.VALUE_PURPOSE,
                                                          row_id=str(version_id)),
                "attributes": json.dumps({"namespace": "user", "sub": USER}), "indexed_content": None,
                "ttl_seconds": None, "index_status": "none", "event_id": event_id,
                "event_value": crypto.encrypt(serialized, purpose=services.EVENT_VALUE_PURPOSE, row_id=str(event_id)),
                **keyword_index.document_params(None),
            })
            h.execute_pipelined(conn, services.PUT_STATEMENTS, params)
        return call

    sides = {"uncharged": put(False), "charged": put(True)}
    for round_index in range(args.rounds):
        order = ("uncharged", "charged") if round_index % 2 == 0 else ("charged", "uncharged")
        for concurrency in args.concurrency:
            if concurrency == 1:
                results = paired("floor PUT", {side: h.PgWorker(database_url, sides[side]) for side in order},
                                 args.floor_requests)
                for side, result in results.items():
                    out.add("floor PUT (update)", side, 1, result)
                continue
            for side in order:
                result = h.run_load(f"floor PUT {side}", lambda _i, call=sides[side]: h.PgWorker(database_url, call),
                                    concurrency=concurrency, requests=args.floor_requests, max_seconds=args.max_seconds)
                out.add("floor PUT (update)", side, concurrency, result)


def in_process_check(calls: int) -> dict[str, list[float]]:
    """The limiter's own call, as configured (most calls take a leased token) and with leases off (each call one
    EVALSHA round trip to Valkey)."""
    from django.conf import settings

    from apps.limits import rates

    samples = {}
    for label, lease in (("leases on", settings.RATE_LIMIT_LEASE), ("leases off", 1)):
        settings.RATE_LIMIT_LEASE = lease
        rates.reset()
        user = f"bench-{os.getpid()}-{lease}"
        samples[label] = h.time_calls(lambda u=user: rates.check_kinds(u, ("requests",)), calls=calls, max_seconds=20)
    return samples


def report(info: dict[str, Any], out: Latencies, args: argparse.Namespace, check: dict[str, list[float]]) -> str:
    lines = [f"# Limits benchmark ({info['date']})", ""]
    lines.append(h.markdown_table(["", ""], [[k, v] for k, v in info.items() if k != "date"], align="ll"))
    lines += ["", f"Command: `{h.command_line()}`", ""]
    rows = []
    for operation in ("GET", "PUT (update)", "PUT (add)"):
        for concurrency in args.concurrency:
            off, on = out.merged(operation, "off", concurrency), out.merged(operation, "on", concurrency)
            rows.append([operation, concurrency, f"{off.completed} / {on.completed}",
                         " / ".join(h.fmt(off.ms(q), 3) for q in (50, 95, 99)),
                         " / ".join(h.fmt(on.ms(q), 3) for q in (50, 95, 99)),
                         f"{on.ms(50) - off.ms(50):+.3f}"])
    lines.append(h.markdown_table(
        ["operation (HTTP)", "concurrency", "n off / on", "limiter off p50 / p95 / p99 ms",
         "limiter on p50 / p95 / p99 ms", "p50 on - off ms"], rows, align="lrrrrr"))
    lines += ["", "Quota charge at the SQL floor (the PUT's pipelined statements through psycopg):", ""]
    rows = []
    for concurrency in args.concurrency:
        free = out.merged("floor PUT (update)", "uncharged", concurrency)
        charged = out.merged("floor PUT (update)", "charged", concurrency)
        rows.append([concurrency, f"{free.completed} / {charged.completed}",
                     " / ".join(h.fmt(free.ms(q), 3) for q in (50, 95, 99)),
                     " / ".join(h.fmt(charged.ms(q), 3) for q in (50, 95, 99)),
                     f"{charged.ms(50) - free.ms(50):+.3f}"])
    lines.append(h.markdown_table(
        ["concurrency", "n", "charged to no one p50 / p95 / p99 ms", "charged to bob p50 / p95 / p99 ms",
         "p50 difference ms"], rows, align="rrrrr"))
    lines += ["", "The limiter's call in-process (apps.limits.rates.check_kinds: settings, the override cache, a leased "
                  "token or one EVALSHA to Valkey):", ""]
    lines.append(h.markdown_table(
        ["", "calls", "p50 ms", "p99 ms"],
        [[label, len(values), h.fmt(h.percentile(sorted(values), 50) * 1000, 3),
          h.fmt(h.percentile(sorted(values), 99) * 1000, 3)] for label, values in check.items()], align="lrrr"))
    lines.append("")
    goal = [(op, out.merged(op, "on", 1).ms(50) - out.merged(op, "off", 1).ms(50)) for op in ("GET", "PUT (update)")
            if 1 in args.concurrency]
    if goal:
        lines.append("Goal (issue 28): the limiter adds at most 0.3 ms p50 on GET and PUT at concurrency 1: " + ", ".join(
            f"{op} {delta:+.3f} ms{'' if delta <= 0.3 else ' (over)'}" for op, delta in goal) + ".")
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    h.install_sigterm_handler()
    started = time.monotonic()
    database_url = h.fresh_django_database(BENCH_DB)
    out = Latencies()
    try:
        with h.web_server(database_url, workers=args.web_workers, log_path=h.RESULTS_DIR / "limits-off-server.log",
                          extra_env={"RATE_LIMITS_ENABLED": "false"}) as off, \
             h.web_server(database_url, workers=args.web_workers, log_path=h.RESULTS_DIR / "limits-on-server.log",
                          extra_env={"RATE_LIMITS_ENABLED": "false"} if args.control else None) as on:
            servers = {"off": off, "on": on}
            tokens = {side: h.mint_token(server.base_url, USER, PASSWORD) for side, server in servers.items()}
            seed = h.HttpSession(off.host, off.port, {"Authorization": f"Bearer {tokens['off']}"})
            for i in range(TARGETS):
                seed.request("PUT", "/v1/memories", {"namespace": NS, "key": f"k{i}", "value": _value(i)})
            seed.close()
            for side, server in servers.items():  # every worker's connections and caches warm
                headers = {"Authorization": f"Bearer {tokens[side]}"}
                h.run_load("warm-up", lambda _i, s=server, hd=headers: h.HttpWorker(
                    s.base_url, hd, lambda sess, i: sess.request("GET", "/v1/me")),
                    concurrency=4, requests=200, max_seconds=30)
            info = h.machine_info(database_url, web_workers=args.web_workers, rounds=args.rounds,
                                  requests_per_round=args.requests,
                                  control="A/A: both servers run with the limiter off" if args.control else "no")
            http_rounds(args, servers, tokens, out)
            floor_rounds(args, database_url, out)
            check = in_process_check(2000)
    except KeyboardInterrupt:
        h.log("interrupted; servers stopped")
        return 130
    info["load_avg_at_end"] = " ".join(f"{value:.2f}" for value in os.getloadavg())
    info["duration_s"] = round(time.monotonic() - started)
    print(report(info, out, args, check))
    path = h.write_json("limits", {
        "command": h.command_line(), "machine": info, "args": dict(vars(args)),
        "runs": {" | ".join(map(str, key)): [run.summary() for run in runs] for key, runs in out.runs.items()},
    })
    h.log(f"results written to {path.relative_to(h.REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    h.run_main(main)
