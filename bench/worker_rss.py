"""Web workers' memory under a long mixed load: RSS/PSS/USS of every web worker after N requests (issue 23).

The web server is started as the Procfile starts it (bench/_harness.web_server) on a private database, and a
closed loop of mixed requests from several users runs against it: memory GET/PUT/DELETE, attribute search,
namespaces, the events page, semantic search (query embedded in the web worker), conversation appends and reads,
/v1/me, and some 404 and 400 answers. After each checkpoint (cumulative request counts, default 1k, 10k, 30k, 100k)
every web worker's memory is read from /proc/PID/smaps_rollup. The key space is bounded (PUTs overwrite and DELETEs
remove a fixed set of keys), so the data a request touches stays about the same size while the timeline grows.

The goal of issue 23: a worker's RSS after 100k requests within 10% of its RSS after 1k.

Run: ``.venv/bin/python bench/worker_rss.py`` (about 10-15 minutes on 2 loaded cores); ``--quick`` for a smoke run
(checkpoints 500, 2000); ``--env NAME=VALUE`` sets a server environment variable for an A/B run (e.g.
``--env WSGI_THREADS=4`` or ``--env MALLOC_TUNING=off``). See bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import _harness as h

BENCH_DB = "memory_service_bench_rss"
USERS = ("bob", "charlie", "alice")  # dev IdP users (password = name); alice is an admin
AREAS = ("notes", "projects", "agents", "preferences", "journal")
KEYS_PER_USER = 2000
CONVERSATIONS_PER_USER = 50
WORDS = (
    "agent user context memory project deadline meeting prefers concise answers python rust deploy review budget "
    "travel kyoto coffee morning standup release notes customer feedback latency database index vector search"
).split()

# The mix: (operation, weight out of 100).
MIX: tuple[tuple[str, int], ...] = (
    ("GET", 26),
    ("GET missing (404)", 3),
    ("PUT", 20),
    ("DELETE", 4),
    ("search", 9),
    ("semantic search", 2),
    ("namespaces", 4),
    ("events page", 9),
    ("conversation append", 6),
    ("conversation entries", 5),
    ("conversation list", 4),
    ("me", 4),
    ("bad input (400)", 4),
)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--checkpoints", default="1000,10000,30000,100000",
                        help="cumulative request counts at which memory is read (default 1000,10000,30000,100000)")
    parser.add_argument("--concurrency", type=int, default=8, help="client connections (default 8)")
    parser.add_argument("--web-workers", type=int, default=2, help="gunicorn --workers (default 2, as the Procfile)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="server environment variable (repeatable), for A/B runs")
    parser.add_argument("--max-seconds", type=float, default=3600, help="time cap per checkpoint segment (default 3600)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="smoke run: checkpoints 500,2000")
    args = parser.parse_args(argv)
    if args.quick:
        args.checkpoints = "500,2000"
    args.checkpoints = sorted(int(value) for value in str(args.checkpoints).split(","))
    try:
        args.env = dict(item.split("=", 1) for item in args.env)
    except ValueError:
        parser.error("--env takes NAME=VALUE")
    return args


def _schedule(seed: int) -> list[str]:
    """One cycle of 100 operations in the MIX proportions, shuffled once: request i runs slot i % 100."""
    slots = [name for name, weight in MIX for _ in range(weight)]
    if len(slots) != 100:
        raise h.BenchError(f"MIX weights add up to {len(slots)}, not 100")
    random.Random(seed).shuffle(slots)
    return slots


class Mix:
    """Request i of the load: what it sends is a function of i (and a per-thread RNG for values)."""

    def __init__(self, tokens: dict[str, str], seed: int) -> None:
        self.tokens = tokens
        self.slots = _schedule(seed)
        self.seed = seed
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._local = threading.local()

    def rng(self) -> random.Random:
        rng = getattr(self._local, "rng", None)
        if rng is None:
            rng = self._local.rng = random.Random(f"{self.seed}-{threading.get_ident()}")
        return rng

    @staticmethod
    def address(user: str, n: int) -> tuple[list[str], str]:
        area = AREAS[n % len(AREAS)]
        namespace = ["user", user, area] if n % 3 == 0 else ["user", user, area, f"topic-{n % 7}"]
        return namespace, f"k{n:05d}"

    def call(self, session: h.HttpSession, i: int) -> None:
        operation = self.slots[i % len(self.slots)]
        rng = self.rng()
        user = USERS[i % len(USERS)]
        session.headers["Authorization"] = f"Bearer {self.tokens[user]}"
        n = rng.randrange(KEYS_PER_USER)
        namespace, key = self.address(user, n)
        address = urllib.parse.urlencode([*(("ns", s) for s in namespace), ("key", key)])
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 60)))
        conversation = uuid.uuid5(uuid.NAMESPACE_OID, f"{user}-{rng.randrange(CONVERSATIONS_PER_USER)}")
        if operation == "GET":
            # Half the key space is written early on; a 404 for a key not written yet is an answer too.
            session.request("GET", f"/v1/memories?{address}", expect_2xx=False)
        elif operation == "GET missing (404)":
            _expect(session.request("GET", f"/v1/memories?ns=user&ns={user}&ns=nowhere&key=k{i}", expect_2xx=False), 404)
        elif operation == "PUT":
            body: dict[str, Any] = {"namespace": namespace, "key": key,
                                    "value": {"text": text, "n": i, "tags": rng.sample(WORDS, 3)}}
            if rng.random() < 0.3:
                body["index"] = {"text": text}
            if rng.random() < 0.2:
                body["ttl_seconds"] = 3600
            session.request("PUT", "/v1/memories", body)
        elif operation == "DELETE":
            session.request("DELETE", f"/v1/memories?{address}")
        elif operation == "search":
            prefix = ["user", user] if rng.random() < 0.5 else ["user", user, rng.choice(AREAS)]
            session.request("POST", "/v1/memories/search",
                            {"namespace_prefix": prefix, "limit": rng.choice((10, 50)), "offset": rng.choice((0, 0, 20))})
        elif operation == "semantic search":
            session.request("POST", "/v1/memories/search",
                            {"namespace_prefix": ["user", user], "query": text[:200], "limit": 10})
        elif operation == "namespaces":
            session.request("GET", f"/v1/memories/namespaces?max_depth={rng.choice((3, 4))}")
        elif operation == "events page":
            kinds = rng.choice(("", "&kinds=add,update", "&kinds=delete"))
            session.request("GET", f"/v1/memories/events?limit={rng.choice((10, 50))}{kinds}")
        elif operation == "conversation append":
            session.request("POST", f"/v1/conversations/{conversation}/entries",
                            {"content": [{"role": "USER", "text": text}]})
        elif operation == "conversation entries":
            session.request("GET", f"/v1/conversations/{conversation}/entries?limit=20", expect_2xx=False)
        elif operation == "conversation list":
            session.request("GET", "/v1/conversations?limit=20")
        elif operation == "me":
            session.request("GET", "/v1/me")
        elif operation == "bad input (400)":
            _expect(session.request("PUT", "/v1/memories", {"namespace": [], "key": "", "value": 1}, expect_2xx=False), 400)
        else:  # pragma: no cover - MIX and this dispatch are edited together
            raise h.BenchError(f"unknown operation {operation}")


def _expect(answer: tuple[int, bytes], status: int) -> None:
    if answer[0] != status:
        raise h.BenchError(f"expected {status}, got {answer[0]}: {answer[1][:200]!r}")


def read_status(pid: int) -> dict[str, int]:
    values: dict[str, int] = {}
    try:
        for line in (Path("/proc") / str(pid) / "status").read_text().splitlines():
            name, _, rest = line.partition(":")
            if name in ("Threads", "VmHWM"):
                values[name] = int(rest.split()[0])
    except OSError:
        pass
    return values


def worker_memory(server: h.WebServer) -> list[dict[str, Any]]:
    """Memory of every web worker (the gunicorn master's children), in MB."""
    rows = []
    for pid in h.process_tree(server.process.pid):
        if pid == server.process.pid:
            continue
        rollup = h.smaps_rollup(pid)
        if not rollup:
            continue
        status = read_status(pid)
        rows.append({
            "pid": pid,
            "rss_mb": round(rollup.get("Rss", 0) / 1024, 1),
            "pss_mb": round(rollup.get("Pss", 0) / 1024, 1),
            "uss_mb": round((rollup.get("Private_Clean", 0) + rollup.get("Private_Dirty", 0)) / 1024, 1),
            "anon_mb": round(rollup.get("Anonymous", 0) / 1024, 1),
            "hwm_mb": round(status.get("VmHWM", 0) / 1024, 1),
            "threads": status.get("Threads"),
        })
    return sorted(rows, key=lambda row: row["pid"])


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    h.install_sigterm_handler()
    started = time.monotonic()
    database_url = h.recreate_database(h.embedded_postgres_url(), BENCH_DB)
    h.migrate(database_url)
    info: dict[str, Any] = {}
    checkpoints: list[dict[str, Any]] = []
    failure: str | None = None
    log_path = h.RESULTS_DIR / "worker-rss-server.log"
    with h.web_server(database_url, workers=args.web_workers, log_path=log_path, extra_env=args.env) as server:
        tokens = {user: h.mint_token(server.base_url, user, user) for user in USERS}
        mix = Mix(tokens, args.seed)
        cpu = h.CpuMeter({"web": server.process.pid, "postgres": h.postmaster_pid()})
        info = h.machine_info(database_url, web_workers=args.web_workers, concurrency=args.concurrency,
                              server_env=" ".join(f"{k}={v}" for k, v in args.env.items()) or "(defaults)")
        checkpoints.append({"requests": 0, "seconds": 0.0, "throughput": None, "workers": worker_memory(server)})
        done = 0
        try:
            for target in args.checkpoints:
                base = done

                def call(session: h.HttpSession, i: int, base: int = base) -> None:
                    mix.call(session, base + i)

                result = h.run_load(
                    f"mixed to {target}",
                    lambda _i, call=call: h.HttpWorker(server.base_url, {}, call),
                    concurrency=args.concurrency, requests=target - done, max_seconds=args.max_seconds, cpu=cpu,
                )
                done += result.completed
                if result.errors:
                    raise h.BenchError(f"{result.errors} failed requests, e.g. {result.error_samples}")
                workers = worker_memory(server)
                checkpoints.append({"requests": done, "seconds": round(result.wall, 1),
                                    "throughput": round(result.throughput, 1), "workers": workers})
                h.log(f"after {done:>7} requests ({result.throughput:.0f}/s): "
                      + ", ".join(f"pid {w['pid']} RSS {w['rss_mb']:.0f} / PSS {w['pss_mb']:.0f} / USS "
                                  f"{w['uss_mb']:.0f} MB" for w in workers))
                if result.timed_out:
                    raise h.BenchError(f"time cap hit at {done} requests (--max-seconds)")
        except h.BenchError as exc:
            failure = str(exc)
    info["load_avg_at_end"] = " ".join(f"{value:.2f}" for value in os.getloadavg())
    info["duration_s"] = round(time.monotonic() - started)
    verdict = goal(checkpoints)
    print(report(info, checkpoints, verdict))
    path = h.write_json("worker-rss", {"command": h.command_line(), "machine": info, "args": vars(args),
                                       "mix": dict(MIX), "checkpoints": checkpoints, "goal": verdict,
                                       "failure": failure})
    h.log(f"results written to {path.relative_to(h.REPO_ROOT)}; server log {log_path.relative_to(h.REPO_ROOT)}")
    if failure:
        print(f"\nFAILED: {failure}", file=sys.stderr)
        return 1
    return 0


def goal(checkpoints: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Issue 23: each worker's RSS at the last checkpoint within 10% of its RSS at the first non-zero one."""
    measured = [c for c in checkpoints if c["requests"]]
    if len(measured) < 2:
        return None
    first, last = measured[0], measured[-1]
    by_pid = {w["pid"]: w for w in first["workers"]}
    growth = {w["pid"]: round(w["rss_mb"] / by_pid[w["pid"]]["rss_mb"] - 1, 3) for w in last["workers"] if w["pid"] in by_pid}
    worst = max(growth.values()) if growth else None
    return {"from_requests": first["requests"], "to_requests": last["requests"], "rss_growth": growth,
            "worst": worst, "met": worst is not None and worst <= 0.10}


def report(info: dict[str, Any], checkpoints: list[dict[str, Any]], verdict: dict[str, Any] | None) -> str:
    out = [f"# Web worker memory under mixed load ({info.get('date', '?')})", ""]
    out.append(h.markdown_table(["", ""], [[k, v] for k, v in info.items() if k != "date"], align="ll"))
    out += ["", f"Command: `{h.command_line()}`", "",
            "Mix per 100 requests: " + ", ".join(f"{name} {weight}" for name, weight in MIX), ""]
    pids = sorted({w["pid"] for c in checkpoints for w in c["workers"]})
    first = next((c for c in checkpoints if c["requests"]), None)
    rows = []
    for checkpoint in checkpoints:
        by_pid = {w["pid"]: w for w in checkpoint["workers"]}
        base = {w["pid"]: w for w in first["workers"]} if first else {}
        for pid in pids:
            w = by_pid.get(pid)
            if w is None:
                continue
            vs_first = f"{100 * (w['rss_mb'] / base[pid]['rss_mb'] - 1):+.1f}%" if pid in base else "-"
            rows.append([checkpoint["requests"], h.fmt(checkpoint["throughput"], 0), pid, h.fmt(w["rss_mb"], 1), vs_first,
                         h.fmt(w["pss_mb"], 1), h.fmt(w["uss_mb"], 1), h.fmt(w["anon_mb"], 1), h.fmt(w["hwm_mb"], 1),
                         w["threads"]])
    out.append(h.markdown_table(
        ["requests", "req/s", "worker pid", "RSS MB", "RSS vs first checkpoint", "PSS MB", "USS MB", "anon MB",
         "peak RSS MB", "threads"], rows, align="rrrrrrrrrr"))
    if verdict:
        out += ["", f"Goal (issue 23): RSS after {verdict['to_requests']} requests within 10% of RSS after "
                f"{verdict['from_requests']}: worst worker {100 * verdict['worst']:+.1f}% -> "
                f"{'met' if verdict['met'] else 'NOT met'}."]
    return "\n".join(out)


if __name__ == "__main__":
    h.run_main(main)
