"""What one of the service's read statements costs PostgreSQL when it runs back to back, as the floors of
bench/memories.py run it, and when the client does a few milliseconds of work between calls, as a web worker does
at one connection (authentication, policy, decryption, JSON, the HTTP hand-off).

The statements are the floors' own (bench/memories.py's Floor: the service's SQL, bound as the service binds it),
on the database bench/memories.py left behind (run it first), for bob's scope from the filter policy. Each runs
``--calls`` times on one connection: back to back, then with ``--gaps`` milliseconds of Python work (dict and string
churn, like a request's) or of sleep between calls. Reported per call: the statement's p50 as the client sees it,
and PostgreSQL's CPU (the postmaster's process tree, from /proc).

    .venv/bin/python bench/pg_pacing.py [--calls 1000] [--gaps 1,3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import _harness as h
import memories as bm


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000, help="calls per statement and pacing (default 1000)")
    parser.add_argument("--gaps", default="1,3", help="client work between calls, ms, comma-separated (default 1,3)")
    args = parser.parse_args(argv)
    args.gaps = [float(gap) for gap in args.gaps.split(",") if gap]
    return args


def busy(ms: float) -> None:
    """Client-side work of ``ms`` milliseconds that touches memory as a request does."""
    deadline = time.perf_counter() + ms / 1000
    scratch: dict[int, str] = {}
    while time.perf_counter() < deadline:
        for i in range(200):
            scratch[i] = str(i) * 3


def measure(
    statement: Callable[[], Any], calls: int, between: Callable[[], None] | None, postmaster: int
) -> tuple[float, float]:
    """(p50 ms of the statement, PostgreSQL CPU us per call)."""
    for _ in range(50):
        statement()
    samples = []
    cpu_before = h.process_tree_cpu(postmaster)
    for _ in range(calls):
        started = time.perf_counter()
        statement()
        samples.append(time.perf_counter() - started)
        if between is not None:
            between()
    pg_cpu = h.process_tree_cpu(postmaster) - cpu_before
    return statistics.median(samples) * 1000, pg_cpu / calls * 1e6


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    database_url = h.with_database(h.embedded_postgres_url(), bm.BENCH_DB)
    h.setup_django(database_url)
    postmaster = h.postmaster_pid()
    if postmaster is None:
        print("the embedded PostgreSQL is not running", file=sys.stderr)
        return 1

    from apps.identity.principal import Principal
    from apps.memories import selectors

    principal = Principal(user_id=bm.USER, client_id=None, roles=())
    floor = bm.Floor()
    with h.floor_connection(database_url) as conn:
        if conn.execute("SELECT count(*) FROM memories").fetchone()[0] == 0:
            print(f"{bm.BENCH_DB} is empty: run bench/memories.py first", file=sys.stderr)
            return 1
        # Scopes evaluated once, as the floors of bench/memories.py do.
        bob, narrow, everything = (
            selectors.scope_for(principal, prefix, None) for prefix in (bm.ROOT, bm.NARROW_PREFIX, [])
        )
        statements = {
            "search (user/bob)": lambda: floor.search(conn, bob),
            "search (narrow prefix)": lambda: floor.search(conn, narrow),
            "namespaces": lambda: floor.namespaces(conn, everything, 3),
            "events page": lambda: floor.events(conn, everything, 0),
        }
        pacings: list[tuple[str, Callable[[], None] | None]] = [("back to back", None)]
        pacings += [(f"{gap:g} ms work", lambda g=gap: busy(g)) for gap in args.gaps]
        pacings += [(f"{gap:g} ms sleep", lambda g=gap: time.sleep(g / 1000)) for gap in args.gaps]
        rows = []
        for name, statement in statements.items():
            baseline = None
            for label, between in pacings:
                p50, pg_us = measure(statement, args.calls, between, postmaster)
                baseline = baseline or pg_us
                rows.append([name, label, h.fmt(p50, 3), h.fmt(pg_us, 0), f"{pg_us / baseline:.2f}x"])
                h.log(f"{name}, {label}: p50 {p50:.3f} ms, PostgreSQL {pg_us:.0f} us per call")
    print(f"\nCommand: `{h.command_line()}`; load average at end {' '.join(f'{v:.2f}' for v in os.getloadavg())}\n")
    print(h.markdown_table(
        ["statement", "between calls", "p50 ms", "PostgreSQL CPU us per call", "vs back to back"], rows, "llrrr"
    ))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
