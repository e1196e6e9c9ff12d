"""Benchmark of the live event stream (GET /v1/events, D8) over real HTTP.

Setup: the real server (gunicorn + uvicorn workers, as the Procfile starts it) on a private database and a private
Valkey on a fixed port (so it can be restarted in place); 50 dev-IdP users, each owning one conversation shared
with the next user as reader, so an append reaches 2 users.

1. **Appends without listeners**: --appends appends at --append-concurrency; latency p50/p95/p99.
2. **500 streams** across 50 users (10 each; SSE_MAX_CONNECTIONS_PER_USER=10 for the run), read by an asyncio client
   in its own process. Server memory per connection = growth of the web processes' RSS / streams.
3. **Appends with the 500 listeners** at a steady rate: append latency again, and delivery latency = receipt time
   minus the event's stream id (the millisecond Redis stored it, right after commit) for every (event, stream).
4. **Redis restart with 200 streams**: appends keep coming while Valkey is stopped and started again on the same
   port; afterwards every stream must have received an ``invalidate`` or every entry of its conversations.

Run: ``.venv/bin/python bench/events.py`` (``--quick`` for a smoke run). Results: bench/results/events-*.json.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import multiprocessing
import os
import queue
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import _harness as h

from apps.runtime.embedded_services import RestartableValkey

BENCH_DB = "memory_service_bench_events"
USERS = 50


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer appends, 100 streams, 40 on the restart")
    parser.add_argument("--streams", type=int, default=500)
    parser.add_argument("--restart-streams", type=int, default=200)
    parser.add_argument("--appends", type=int, default=600, help="appends per measured phase")
    parser.add_argument("--rate", type=float, default=30.0, help="appends per second with listeners attached")
    parser.add_argument("--append-concurrency", type=int, default=4)
    parser.add_argument("--web-workers", type=int, default=2)
    parser.add_argument("--stream-query", default="", help="query of the 500 streams, e.g. '?kinds=membership' "
                        "(then nothing is delivered: separates the cost of open connections from delivery)")
    args = parser.parse_args(argv)
    if args.quick:
        args.streams, args.restart_streams, args.appends = 100, 40, 150
    return args


# --- The stream readers (own process, asyncio) --------------------------------------------------------------------


async def _read_stream(host: str, port: int, token: str, index: int, out: list, ready: asyncio.Event, stop,
                       query: str = "") -> None:  # fmt: skip
    reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
    writer.write(
        f"GET /v1/events{query} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
        "Accept: text/event-stream\r\n\r\n".encode()
    )
    await writer.drain()
    status = await reader.readline()
    if b" 200 " not in status:
        out.append((index, "error", status.decode().strip(), 0.0))
        ready.set()
        return
    while (await reader.readline()) not in (b"\r\n", b""):
        pass
    ready.set()
    event_id = None
    try:
        while not stop.is_set():
            line = await reader.readline()
            if not line:
                out.append((index, "closed", "", time.time()))
                return
            if line.startswith(b"id: "):
                event_id = line[4:].strip().decode()
            elif line.startswith(b"data: "):
                received = time.time()
                data = json.loads(line[6:])
                out.append((index, event_id, data, received))
                event_id = None
    finally:
        writer.close()


def reader_process(host: str, port: int, tokens: list[str], results, ready_flag, stop_flag, query: str = "") -> None:
    """Open one stream per token, record (stream, id, data, receipt time) until told to stop."""
    out: list = []

    async def main() -> None:
        stop = asyncio.Event()
        readies = [asyncio.Event() for _ in tokens]
        tasks = [
            asyncio.create_task(_read_stream(host, port, token, i, out, readies[i], stop, query))
            for i, token in enumerate(tokens)
        ]
        for chunk in range(0, len(readies), 50):  # connect in waves, like clients arriving
            await asyncio.gather(*(r.wait() for r in readies[chunk : chunk + 50]))
        ready_flag.set()
        while not stop_flag.is_set():
            await asyncio.sleep(0.05)
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())
    results.put(out)


class Readers:
    def __init__(self, base_url: str, tokens: list[str], query: str = "") -> None:
        host, port = base_url.split("//")[1].split(":")
        context = multiprocessing.get_context("spawn")
        self.results = context.Queue()
        self.ready = context.Event()
        self.stop_flag = context.Event()
        self.process = context.Process(
            target=reader_process, args=(host, int(port), tokens, self.results, self.ready, self.stop_flag, query)
        )
        self.process.start()
        if not self.ready.wait(120):
            raise h.BenchError("streams did not open")

    def finish(self) -> list:
        self.stop_flag.set()
        try:
            out = self.results.get(timeout=60)
        except queue.Empty:
            out = []
        self.process.join(30)
        return out


# --- Helpers ------------------------------------------------------------------------------------------------------


def web_rss_bytes(root_pid: int) -> int:
    """RSS of the gunicorn master and its workers."""
    total = 0
    pids = [root_pid]
    try:
        children = Path(f"/proc/{root_pid}/task/{root_pid}/children").read_text().split()
        pids += [int(child) for child in children]
    except OSError:
        pass
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def append_load(base: str, tokens: list[str], conversations: list[str], count: int, concurrency: int,
                rate: float | None) -> tuple[list[float], list[tuple[str, str]]]:  # fmt: skip
    """``count`` appends spread over the conversations; returns latencies (ms) and (conversation, entry id)."""
    host, port = base.split("//")[1].split(":")
    latencies: list[float] = []
    appended: list[tuple[str, str]] = []
    lock = threading.Lock()
    counter = iter(range(count))
    started = time.monotonic()

    def worker() -> None:
        sessions = {}
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                break
            if rate:
                delay = started + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            owner = i % len(conversations)
            session = sessions.get(owner)
            if session is None:
                session = sessions[owner] = h.HttpSession(
                    host, int(port), {"Authorization": f"Bearer {tokens[owner]}", "Content-Type": "application/json"}
                )
            body = {"content": [{"role": "USER", "text": f"message {i}"}]}
            path = f"/v1/conversations/{conversations[owner]}/entries"
            t0 = time.perf_counter()
            try:
                status, raw = session.request("POST", path, body, expect_2xx=False)
            except (OSError, http.client.HTTPException):
                # The server closed an idle keep-alive before the request went out: reconnect and send once more.
                t0 = time.perf_counter()
                try:
                    status, raw = session.request("POST", path, body, expect_2xx=False)
                except (OSError, http.client.HTTPException):
                    continue
            elapsed = (time.perf_counter() - t0) * 1000
            if status == 201:
                with lock:
                    latencies.append(elapsed)
                    appended.append((conversations[owner], json.loads(raw)["id"]))
        for session in sessions.values():
            session.close()

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies, appended


def pct(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {"n": 0}
    return {
        "n": len(ordered),
        "p50": round(h.percentile(ordered, 50), 2),
        "p95": round(h.percentile(ordered, 95), 2),
        "p99": round(h.percentile(ordered, 99), 2),
    }


def cpu_pct(web: h.WebServer, cpu_before: float, wall_before: float) -> float:
    """The web server's CPU use since the snapshot, in % of one core."""
    return round(100 * (h.process_tree_cpu(web.process.pid) - cpu_before) / (time.monotonic() - wall_before), 1)


def stream_id_ms(event_id: str) -> int:
    return int(event_id.split("-")[0])


# --- Main ---------------------------------------------------------------------------------------------------------


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    h.install_sigterm_handler()
    database_url = h.recreate_database(h.embedded_postgres_url(), BENCH_DB)
    h.migrate(database_url)
    workdir = Path(tempfile.mkdtemp(prefix="bench-events-"))
    valkey = RestartableValkey(workdir)
    valkey.start()
    users = {f"u{i:02d}": {"password": f"pw{i:02d}", "roles": ["user"]} for i in range(USERS)}
    users_file = workdir / "users.json"
    users_file.write_text(json.dumps(users))
    names = sorted(users)
    per_user = max(1, args.streams // USERS)
    env = {
        "REDIS_URL": valkey.url,
        "DEV_IDP_USERS": str(users_file),
        "EMBEDDING_PROVIDER": "hash",
        "SSE_MAX_CONNECTIONS_PER_USER": str(per_user),
        "SSE_KEEPALIVE_SECONDS": "15",
    }
    results: dict[str, Any] = {"args": vars(args)}
    try:
        with h.web_server(database_url, workers=args.web_workers, log_path=workdir / "web.log", extra_env=env) as web:
            base = web.base_url
            tokens = [h.mint_token(base, name, users[name]["password"]) for name in names]
            conversations = []
            for i, name in enumerate(names):
                session = h.HttpSession(web.host, web.port, {"Authorization": f"Bearer {tokens[i]}",
                                                             "Content-Type": "application/json"})  # fmt: skip
                conversation = session.json("POST", "/v1/conversations", {"title": f"bench {name}"})["id"]
                session.request("POST", f"/v1/conversations/{conversation}/memberships",
                                {"userId": names[(i + 1) % USERS], "accessLevel": "reader"})  # fmt: skip
                session.close()
                conversations.append(conversation)
            h.log(f"{USERS} users and conversations ready")

            # 1. Appends without listeners.
            append_load(base, tokens, conversations, 100, args.append_concurrency, None)  # warm-up
            cpu0, wall0 = h.process_tree_cpu(web.process.pid), time.monotonic()
            quiet, _ = append_load(base, tokens, conversations, args.appends, args.append_concurrency, args.rate)
            results["append_ms_without_listeners"] = pct(quiet)
            results["web_cpu_pct_without_listeners"] = cpu_pct(web, cpu0, wall0)
            h.log(f"appends without listeners: {results['append_ms_without_listeners']}")

            # 2. Open the streams.
            rss_before = web_rss_bytes(web.process.pid)
            stream_tokens = [tokens[i % USERS] for i in range(per_user * USERS)]
            readers = Readers(base, stream_tokens, args.stream_query)
            time.sleep(2)
            rss_after = web_rss_bytes(web.process.pid)
            results["streams"] = len(stream_tokens)
            results["memory_per_connection_kib"] = round((rss_after - rss_before) / len(stream_tokens) / 1024, 1)
            h.log(f"{len(stream_tokens)} streams open; {results['memory_per_connection_kib']} KiB per connection")

            # 3. Appends with listeners attached: append latency and delivery latency.
            cpu0, wall0 = h.process_tree_cpu(web.process.pid), time.monotonic()
            loud, appended = append_load(base, tokens, conversations, args.appends, args.append_concurrency, args.rate)
            results["web_cpu_pct_with_listeners"] = cpu_pct(web, cpu0, wall0)
            time.sleep(2)
            out = readers.finish()
            results["append_ms_with_listeners"] = pct(loud)
            # Again without listeners, to see how much the machine's background load moved meanwhile.
            time.sleep(2)
            again, _ = append_load(base, tokens, conversations, args.appends, args.append_concurrency, args.rate)
            results["append_ms_without_listeners_after"] = pct(again)
            h.log(f"appends without listeners (after): {results['append_ms_without_listeners_after']}")
            delivery = [
                received * 1000 - stream_id_ms(event_id)
                for _i, event_id, data, received in out
                if isinstance(data, dict) and data.get("kind") == "entry" and event_id
            ]
            opened = sum(1 for o in out if o[1] == "error")
            # Every append reaches 2 users x their streams (minus streams that failed to open).
            expected = len(appended) * 2 * per_user - opened * len(appended) // USERS * 2
            results["delivery_ms"] = pct(delivery)
            results["deliveries"] = {"expected": expected, "received": len(delivery)}
            results["stream_errors"] = [o for o in out if o[1] in ("error", "closed")][:5]
            h.log(f"appends with listeners: {results['append_ms_with_listeners']}")
            h.log(f"delivery latency (commit to receipt): {results['delivery_ms']} ({len(delivery)}/{expected})")

            # 4. Redis restart with streams open.
            results["redis_restart"] = redis_restart(base, web, valkey, tokens, conversations, names, args)
            h.log(f"redis restart: {results['redis_restart']}")
    finally:
        valkey.stop()
    results["machine"] = h.machine_info(database_url)
    results["load_average"] = os.getloadavg()
    path = h.write_json("events", results)
    print(json.dumps({k: v for k, v in results.items() if k != "machine"}, indent=2))
    h.log(f"results in {path}")
    return 0


def redis_restart(base, web, valkey, tokens, conversations, names, args) -> dict[str, Any]:
    per_user = max(1, args.restart_streams // USERS)
    stream_users = [i % USERS for i in range(per_user * USERS)]
    readers = Readers(base, [tokens[i] for i in stream_users])
    stop = threading.Event()
    appended: list[tuple[str, str]] = []
    failures = [0]

    def keep_appending() -> None:
        while not stop.is_set():
            _lat, done = append_load(base, tokens, conversations, 20, 2, 20.0)
            appended.extend(done)
            failures[0] += 20 - len(done)

    thread = threading.Thread(target=keep_appending)
    thread.start()
    time.sleep(2)
    valkey.stop()
    h.log("valkey stopped")
    time.sleep(2)
    valkey.start()
    h.log("valkey started again (empty)")
    time.sleep(5)
    stop.set()
    thread.join()
    time.sleep(2)
    out = readers.finish()

    # Who should have seen what: conversation i is owned by user i and read by user i+1.
    audience: dict[str, set[int]] = {}
    for i, conversation in enumerate(conversations):
        audience[conversation] = {i, (i + 1) % USERS}
    per_stream_entries: dict[int, set[str]] = {s: set() for s in range(len(stream_users))}
    invalidated: set[int] = set()
    for index, _event_id, data, _received in out:
        if not isinstance(data, dict):
            continue
        if data.get("event") == "invalidate":
            invalidated.add(index)
        elif data.get("kind") == "entry":
            per_stream_entries[index].add(data["data"]["entryId"])
    complete = 0
    broken = 0
    for index, user in enumerate(stream_users):
        wanted = {entry for conversation, entry in appended if user in audience[conversation]}
        if index in invalidated:
            continue
        if wanted <= per_stream_entries[index]:
            complete += 1
        else:
            broken += 1
    return {
        "streams": len(stream_users),
        "invalidated": len(invalidated),
        "complete_without_invalidate": complete,
        "lost_events_without_invalidate": broken,
        "appends_ok": len(appended),
        "appends_failed": failures[0],
    }


if __name__ == "__main__":
    raise SystemExit(main(os.sys.argv[1:]))
