"""Indexing fairness between users with the real model (issue 28 item 1, D11).

While alice keeps ``--long-queued`` (10) memories of ``--long-bytes`` (250 KB) of index text queued (each costs the
local model seconds to embed on a CPU), bob writes a short memory and appends a short entry, ``--rounds`` times,
and each is timed from its write's answer until a search returns it (memory search by its text; conversation search,
semantic). Next to it, in the same run, the same probes with nothing else queued (the floor). Goal: bob's p95 within
5 s, and alice's long texts are indexed all the same (the report counts those indexed during the rounds).

The service runs as the Procfile runs it: the web server, the worker (threads pool, ``--worker-concurrency`` 2) and
beat, on a bench database of their own (``memory_service_bench_fairness``, re-created each run) and a private
database of the embedded Valkey, with ``EMBEDDING_PROVIDER=local``.

    .venv/bin/python bench/indexing_fairness.py                 # 20 rounds with 10 long texts queued
    .venv/bin/python bench/indexing_fairness.py --rounds 5 --long-queued 3 --max-round-seconds 600
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import _harness as h

BENCH_DB = "memory_service_bench_fairness"
REDIS_DB = 13  # a private database on the embedded Valkey: no other worker takes these indexing tasks
WORDS = "granary ledger entries for the autumn harvest with tallies of barley and oats "


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20, help="bob's probes with alice's texts queued")
    parser.add_argument("--floor-rounds", type=int, default=5, help="bob's probes with nothing queued")
    parser.add_argument("--long-queued", type=int, default=10, help="alice's long texts kept waiting")
    parser.add_argument("--long-bytes", type=int, default=250_000)
    parser.add_argument("--pause", type=float, default=2.0, help="seconds between two of bob's rounds")
    parser.add_argument("--max-round-seconds", type=float, default=300)
    parser.add_argument("--web-workers", type=int, default=2)
    parser.add_argument("--worker-concurrency", type=int, default=2, help="the Procfile's CELERY_CONCURRENCY")
    return parser.parse_args(argv)


def redis_url() -> str:
    from apps.runtime import embedded_services

    parts = urllib.parse.urlsplit(embedded_services.redis_url())
    return urllib.parse.urlunsplit(parts._replace(path=f"/{REDIS_DB}"))


@contextlib.contextmanager
def worker_and_beat(database_url: str, env_extra: dict[str, str], concurrency: int) -> Iterator[None]:
    """The Procfile's worker and beat lines on the bench database."""
    env = h.server_env(database_url, **env_extra)
    schedule = Path(tempfile.mkdtemp(prefix="bench-beat-")) / "schedule"
    commands = {
        "worker": [sys.executable, "-m", "config.worker", "--pool", "threads", "--loglevel", "INFO",
                   "--concurrency", str(concurrency)],
        "beat": [sys.executable, "-m", "config.beat", "--loglevel", "WARNING", "-s", str(schedule)],
    }  # fmt: skip
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for name, command in commands.items():
            with open(h.RESULTS_DIR / f"indexing-fairness-{name}.log", "wb") as log_file:
                processes.append(subprocess.Popen(command, env=env, cwd=h.REPO_ROOT, stdout=log_file,
                                                  stderr=subprocess.STDOUT, start_new_session=True))  # fmt: skip
            h.log(f"{name} started (pid {processes[-1].pid})")
        yield
    finally:
        for process in processes:
            h._stop(process)


def long_text(tag: str, size: int) -> str:
    return (f"{tag} " + WORDS * (size // len(WORDS) + 1))[:size]


class Alice:
    """Keeps ``queued`` of alice's long texts waiting: a new PUT whenever one is indexed."""

    def __init__(self, server: h.WebServer, token: str, database_url: str, queued: int, size: int) -> None:
        self.server, self.token = server, token
        self.db = h.floor_connection(database_url)
        self.queued, self.size = queued, size
        self.written = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="alice", daemon=True)

    def counts(self) -> tuple[int, int]:
        """(pending, indexed) long texts."""
        row = self.db.execute(
            "SELECT count(*) FILTER (WHERE index_status = 'pending'), count(*) FILTER (WHERE index_status = 'indexed') "
            "FROM memories WHERE namespace[2] = 'alice' AND state = 'active'"
        ).fetchone()
        return int(row[0]), int(row[1])

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                if self.counts()[0] < self.queued:
                    key = f"long{self.written}"
                    # A session per PUT: the server closes a keep-alive connection idle for 2 s.
                    session = h.HttpSession(self.server.host, self.server.port,
                                            {"Authorization": f"Bearer {self.token}"}, timeout=120)  # fmt: skip
                    try:
                        session.json("PUT", "/v1/memories", {
                            "namespace": ["user", "alice", "long"], "key": key, "value": {"n": self.written},
                            "index": {"text": long_text(key, self.size)},
                        })  # fmt: skip
                    finally:
                        session.close()
                    self.written += 1
                else:
                    self.stop.wait(0.2)
        except BaseException as exc:  # reported by the main thread
            self.error = exc

    def close(self) -> None:
        self.stop.set()
        self.thread.join(130)
        self.db.close()


def probe(server: h.WebServer, token: str, number: int, limit: float) -> tuple[float, float]:
    """Bob's short memory and short entry, written together; seconds until each is returned by a search. A session
    per round: the server closes a keep-alive connection idle for 2 s."""
    bob = h.HttpSession(server.host, server.port, {"Authorization": f"Bearer {token}"})
    try:
        return _probe(bob, number, limit)
    finally:
        bob.close()


def _probe(bob: h.HttpSession, number: int, limit: float) -> tuple[float, float]:
    word = uuid.uuid4().hex[:8]
    text = f"bob reminder {number} {word}: the ferry to the island leaves at nine"
    bob.json("PUT", "/v1/memories", {"namespace": ["user", "bob", "probes"], "key": f"p{number}-{word}",
                                     "value": {"n": number}, "index": {"text": text}})  # fmt: skip
    memory_written = time.monotonic()
    entry = bob.json("POST", f"/v1/conversations/{uuid.uuid4()}/entries", {"content": [{"role": "USER", "text": text}]})
    entry_written = time.monotonic()
    memory_seconds = entry_seconds = None
    while memory_seconds is None or entry_seconds is None:
        now = time.monotonic()
        if now - memory_written > limit:
            raise h.BenchError(f"round {number}: not searchable after {limit:.0f}s (see the worker's log)")
        if memory_seconds is None:
            items = bob.json("POST", "/v1/memories/search",
                             {"namespace_prefix": ["user", "bob", "probes"], "query": text, "limit": 5})["items"]
            if any(item["key"] == f"p{number}-{word}" for item in items):
                memory_seconds = time.monotonic() - memory_written
        if entry_seconds is None:
            data = bob.json("POST", "/v1/conversations/search", {"query": text, "searchType": "semantic", "limit": 5})
            if any(item["entryId"] == entry["id"] for item in data["data"]):
                entry_seconds = time.monotonic() - entry_written
        time.sleep(0.05)
    return memory_seconds, entry_seconds


def stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"n": len(ordered), "p50": round(h.percentile(ordered, 50), 2), "p95": round(h.percentile(ordered, 95), 2),
            "max": round(ordered[-1], 2)} if ordered else {"n": 0}  # fmt: skip


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    h.install_sigterm_handler()
    database_url = h.recreate_database(h.embedded_postgres_url(), BENCH_DB)
    h.migrate(database_url)
    env = {"REDIS_URL": redis_url(), "EMBEDDING_PROVIDER": "local", "WEB_CONCURRENCY": str(args.web_workers)}
    report: dict[str, Any] = {"machine": h.machine_info(database_url), "command": h.command_line(), "args": vars(args)}
    log_path = h.RESULTS_DIR / "indexing-fairness-server.log"
    alice: Alice | None = None
    try:
        with h.web_server(database_url, workers=args.web_workers, log_path=log_path, extra_env=env) as server, \
                worker_and_beat(database_url, env, args.worker_concurrency):  # fmt: skip
            bob = h.mint_token(server.base_url, "bob", "bob")
            probe(server, bob, -1, 600)  # unmeasured: the worker loads the model
            floor = [probe(server, bob, -2 - n, args.max_round_seconds) for n in range(args.floor_rounds)]
            h.log(f"floor (nothing queued): {floor}")
            alice = Alice(server, h.mint_token(server.base_url, "alice", "alice"), database_url, args.long_queued,
                          args.long_bytes)  # fmt: skip
            alice.thread.start()
            deadline = time.monotonic() + 600
            while alice.counts()[0] < args.long_queued and time.monotonic() < deadline and alice.error is None:
                time.sleep(0.5)
            indexed_before = alice.counts()[1]
            started = time.monotonic()
            rounds, pending_seen = [], []
            for number in range(args.rounds):
                if alice.error is not None:
                    raise h.BenchError(f"alice's writes failed: {alice.error!r}")
                pending_seen.append(alice.counts()[0])
                rounds.append(probe(server, bob, number, args.max_round_seconds))
                h.log(f"round {number}: memory {rounds[-1][0]:.2f}s, entry {rounds[-1][1]:.2f}s, "
                      f"alice's long texts pending {pending_seen[-1]}")  # fmt: skip
                time.sleep(args.pause)
            elapsed = time.monotonic() - started
            indexed_during = alice.counts()[1] - indexed_before
    except KeyboardInterrupt:
        h.log("interrupted")
        return 130
    finally:
        if alice is not None:
            alice.close()
    report["floor"] = {"memory": stats([m for m, _ in floor]), "entry": stats([e for _, e in floor])}
    report["with_backlog"] = {"memory": stats([m for m, _ in rounds]), "entry": stats([e for _, e in rounds])}
    report["alice"] = {"pending_min": min(pending_seen), "pending_max": max(pending_seen),
                       "indexed_during_rounds": indexed_during, "rounds_seconds": round(elapsed, 1),
                       "seconds_per_long_text": round(elapsed / indexed_during, 1) if indexed_during else None}  # fmt: skip
    report["load_avg_end"] = " ".join(f"{value:.2f}" for value in os.getloadavg())
    path = h.write_json("indexing-fairness", report)
    print_report(report)
    h.log(f"results in {path}")
    return 0


def print_report(report: dict[str, Any]) -> None:
    machine, args = report["machine"], report["args"]
    print(f"# Indexing fairness (issue 28 item 1)\n\n`{report['command']}`\n")
    print(f"{machine.get('cpu', '')}, load average {machine.get('load_avg_at_start', '')} at start, "
          f"{report['load_avg_end']} at end.\n")  # fmt: skip
    rows = []
    for case, label in (("floor", "nothing queued (floor)"),
                        ("with_backlog", f"alice keeps {args['long_queued']} x {args['long_bytes']:,} B queued")):
        for kind in ("memory", "entry"):
            s = report[case][kind]
            rows.append([label, f"bob's short {kind}", s["n"], s.get("p50"), s.get("p95"), s.get("max")])
    print(h.markdown_table(["case", "searchable after write", "n", "p50 s", "p95 s", "max s"], rows))
    alice = report["alice"]
    worst = max(report["with_backlog"]["memory"]["p95"], report["with_backlog"]["entry"]["p95"])
    print(f"\nGoal: bob's p95 <= 5 s with the backlog: {worst} s, {'met' if worst <= 5 else 'NOT met'}. Alice's long "
          f"texts pending during the rounds: {alice['pending_min']}-{alice['pending_max']}; indexed meanwhile: "
          f"{alice['indexed_during_rounds']} in {alice['rounds_seconds']} s "
          f"({alice['seconds_per_long_text']} s each).")  # fmt: skip


if __name__ == "__main__":
    h.run_main(main)
