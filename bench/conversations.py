"""Benchmark of the conversation endpoints over real HTTP, each next to its psycopg floor, in one run.

Operations (issue 8): append an entry, a page of 50 entries, a page of 20 conversations for a user who is a member
of ~200 fork trees, get one conversation (the access check included), add a membership. At each concurrency
(default 1 and 16):

* HTTP: the real server (gunicorn + uvicorn workers, as the Procfile starts it) on a private database holding
  --conversations conversations and --entries entries across --users users; threads with one keep-alive connection.
* floor: the *same statements* the service runs for that request, through psycopg alone, same concurrency, same
  database. They are captured from the service's own code in this process (services / selectors, Django's SQL as
  sent) for every target the HTTP run uses, and replayed: reads verbatim, writes with their fresh ids (entry id,
  membership id, new member) substituted per call and in the same transaction shape. No HTTP, auth, DRF, JSON or
  encryption around them.

Run: ``.venv/bin/python bench/conversations.py`` (or ``make bench-conversations``); ``--quick`` for a smoke run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import _harness as h

BENCH_DB = "memory_service_bench_conversations"
USER, PASSWORD = "bob", "bob"  # a dev-IdP user, so the token comes from the real password grant
EXTRA_MEMBERS = 3  # members of every conversation besides its owner
LONG_CONVERSATIONS = 20  # bob's conversations that hold --long-entries entries each (the entries-page targets)
TARGETS = 64  # distinct targets per read operation (HTTP and floor cycle through the same ones)
WORDS = (
    "agent user context memory project deadline meeting prefers concise answers python rust deploy review budget "
    "travel kyoto coffee morning standup release notes customer feedback latency database index vector search"
).split()
# Django's psycopg backend sends a uuid parameter as '<32 hex digits>'::uuid.
UUID_RE = re.compile(r"'([0-9a-f]{32})'::uuid")

FULL = {"conversations": 10_000, "entries": 200_000, "users": 200, "long_entries": 1000, "requests": "500,2000",
        "max_seconds": 20.0}
QUICK = {"conversations": 1000, "entries": 20_000, "users": 20, "long_entries": 200, "requests": "50,200",
         "max_seconds": 8.0}


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--web-workers", type=int, default=2, help="gunicorn --workers (default 2, as the Procfile)")
    parser.add_argument("--concurrency", default="1,16", help="client threads per run, comma-separated (default 1,16)")
    parser.add_argument("--requests", help=f"requests per operation, one per --concurrency (default {FULL['requests']})")
    parser.add_argument("--conversations", type=int, help=f"conversations (default {FULL['conversations']})")
    parser.add_argument("--entries", type=int, help=f"entries in all (default {FULL['entries']})")
    parser.add_argument("--users", type=int, help=f"users owning the conversations (default {FULL['users']})")
    parser.add_argument("--long-entries", type=int, help=f"entries of each of bob's {LONG_CONVERSATIONS} long conversations")
    parser.add_argument("--max-seconds", type=float, help=f"time cap per measured run (default {FULL['max_seconds']:.0f})")
    parser.add_argument("--seed", type=int, default=1, help="data generator seed")
    parser.add_argument("--members", default="1,100,2000",
                        help="member counts of the 'append, N members' runs (default 1,100,2000: issue 28 item 3)")
    parser.add_argument("--only", help="comma-separated operations to run (e.g. 'append, N members'); default all")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1k conversations, 20k entries")
    args = parser.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.concurrency = [int(value) for value in str(args.concurrency).split(",")]
    args.members = [int(value) for value in str(args.members).split(",") if value]
    args.only = {value.strip() for value in args.only.split(",")} if args.only else None
    args.requests = [int(value) for value in str(args.requests).split(",")]
    if len(args.requests) == 1:
        args.requests *= len(args.concurrency)
    if len(args.requests) != len(args.concurrency) or min(args.concurrency) < 1 or min(args.requests) < 1:
        parser.error("--requests needs one positive count per --concurrency value")
    if args.entries < LONG_CONVERSATIONS * args.long_entries + args.conversations:
        parser.error("--entries must cover the long conversations and one entry for every other conversation")
    return args


# --- Data ---------------------------------------------------------------------------------------------------------


@dataclass
class Data:
    users: list[str]
    owned: list[str]  # bob's conversations (roots), the write targets
    long: list[str]  # bob's conversations with many entries, the entries-page targets
    member_of: list[str]  # conversations bob is a member of but does not own, the get targets
    crowds: dict[int, str] = field(default_factory=dict)  # member count -> a conversation of bob's with that many


def load(args: argparse.Namespace, database_url: str) -> Data:
    """COPY the data set in: conversations spread over the users, each with its owner and EXTRA_MEMBERS other
    members (so every user is a member of ~(1 + EXTRA_MEMBERS) x conversations/users trees), entries encrypted
    exactly as the service encrypts them (apps.encryption.crypto, AAD bound to the row)."""
    from apps.conversations import selectors
    from apps.encryption import crypto

    rng = random.Random(args.seed)
    users = [USER] + [f"user{i:03d}" for i in range(1, args.users)]
    now = datetime.now(UTC)
    conversation_ids = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(args.conversations)]
    owners = [users[i % len(users)] for i in range(args.conversations)]
    owned = [cid for cid, owner in zip(conversation_ids, owners, strict=True) if owner == USER]
    long = owned[:LONG_CONVERSATIONS]
    entry_counts = dict.fromkeys(conversation_ids, 0)
    for cid in long:
        entry_counts[cid] = args.long_entries
    rest = [cid for cid in conversation_ids if cid not in set(long)]
    remaining = args.entries - sum(entry_counts.values())
    for index in range(remaining):
        entry_counts[rest[index % len(rest)]] += 1

    member_of: list[str] = []
    started = time.monotonic()
    with h.floor_connection(database_url) as conn, conn.transaction(), conn.cursor() as cur:
        with cur.copy("COPY conversations (id, root_id, owner_user_id, title, metadata, created_at, updated_at) "
                      "FROM STDIN") as copy:
            for index, (cid, owner) in enumerate(zip(conversation_ids, owners, strict=True)):
                created = now - timedelta(days=30) + timedelta(seconds=index * 200)
                updated = created + timedelta(seconds=entry_counts[cid])
                title = " ".join(rng.choice(WORDS) for _ in range(4))
                copy.write_row((cid, cid, owner, title, "{}", created, updated))
        with cur.copy("COPY conversation_memberships (id, root_id, user_id, access_level, created_at) "
                      "FROM STDIN") as copy:
            for cid, owner in zip(conversation_ids, owners, strict=True):
                copy.write_row((str(uuid.uuid4()), cid, owner, "owner", now - timedelta(days=31)))
                others = rng.sample([u for u in users if u != owner], min(EXTRA_MEMBERS, len(users) - 1))
                for user, level in zip(others, ("manager", "writer", "reader"), strict=False):
                    copy.write_row((str(uuid.uuid4()), cid, user, level, now - timedelta(days=31)))
                    if user == USER:
                        member_of.append(cid)
        h.log(f"conversations and memberships copied in {time.monotonic() - started:.1f}s")
        written = 0
        with cur.copy("COPY conversation_entries (id, conversation_id, user_id, channel, content_type, content, "
                      "created_at) FROM STDIN") as copy:
            for index, cid in enumerate(conversation_ids):
                base = now - timedelta(days=30) + timedelta(seconds=index * 200)
                owner = owners[index]
                for n in range(entry_counts[cid]):
                    entry_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
                    role = "USER" if n % 2 == 0 else "AI"
                    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(15, 45)))
                    sealed = crypto.encrypt_json([{"role": role, "text": text}], purpose=selectors.CONTENT_PURPOSE,
                                                 row_id=selectors.content_row_id(cid, entry_id))
                    copy.write_row((entry_id, cid, owner, "history", "history", sealed,
                                    base + timedelta(milliseconds=n)))
                    written += 1
                if index % 1000 == 999:
                    h.log(f"  {written} entries ({index + 1} conversations)")
    crowds = load_crowds(args, database_url, now)
    with h.floor_connection(database_url) as conn:
        conn.execute("ANALYZE")
    h.log(f"loaded {args.conversations} conversations, {written} entries, {len(users)} users in "
          f"{time.monotonic() - started:.1f}s; bob owns {len(owned)} and is a member of {len(member_of)} more")
    return Data(users, owned, long, member_of, crowds)


def load_crowds(args: argparse.Namespace, database_url: str, now: datetime) -> dict[int, str]:
    """For each --members count N, a conversation of bob's with N members (bob and N - 1 readers: invented user
    ids, as issue 28 item 3 added them; copied in past the members quota) and one entry."""
    crowds: dict[int, str] = {}
    with h.floor_connection(database_url) as conn, conn.transaction(), conn.cursor() as cur:
        for members in args.members:
            cid = str(uuid.uuid4())
            cur.execute("INSERT INTO conversations (id, root_id, owner_user_id, title, metadata, created_at, updated_at) "
                        "VALUES (%s, %s, %s, 'crowd', '{}', %s, %s)", (cid, cid, USER, now, now))
            with cur.copy("COPY conversation_memberships (id, root_id, user_id, access_level, created_at) "
                          "FROM STDIN") as copy:
                copy.write_row((str(uuid.uuid4()), cid, USER, "owner", now))
                for index in range(1, members):
                    copy.write_row((str(uuid.uuid4()), cid, f"invented-{members}-{index}", "reader", now))
            crowds[members] = cid
    return crowds


# --- The floor: the service's own statements, captured and replayed -------------------------------------------------


@dataclass
class Captured:
    """The statements one service call sent, and the uuids in them that must be fresh on every replay."""

    statements: list[str]
    transaction: bool
    fresh: set[str] = field(default_factory=set)
    fresh_text: dict[str, Callable[[int], str]] = field(default_factory=dict)

    def replay(self, conn: Any, i: int) -> None:
        statements = self.statements
        if self.fresh or self.fresh_text:
            substitutes = {old: uuid.uuid4().hex for old in self.fresh}
            substitutes.update({old: make(i) for old, make in self.fresh_text.items()})
            pattern = re.compile("|".join(re.escape(old) for old in substitutes))
            statements = [pattern.sub(lambda m: substitutes[m.group(0)], s) for s in statements]
        if self.transaction:
            with conn.transaction(), conn.cursor() as cur:
                for statement in statements:
                    cur.execute(statement)
                    if cur.description:
                        cur.fetchall()
        else:
            with conn.cursor() as cur:
                for statement in statements:
                    cur.execute(statement)
                    if cur.description:
                        cur.fetchall()


def capture(fn: Callable[[], Any], *, transaction: bool, keep: Sequence[str] = ()) -> tuple[Captured, Any]:
    """The statements ``fn`` sends (without BEGIN/COMMIT: the replay opens its own transaction when the service
    does); for writes every uuid in them but ``keep`` (the target conversation) is renewed on each replay."""
    result: list[Any] = []
    statements = h.django_statements(lambda: result.append(fn()))
    captured = Captured(statements, transaction)
    if transaction:
        found = {match for statement in statements for match in UUID_RE.findall(statement)}
        captured.fresh = found - {uuid.UUID(k).hex for k in keep}
        if not captured.fresh:
            raise h.BenchError(f"no fresh id found in the captured write:\n{statements}")
    return captured, result[0]


# --- The benchmark ------------------------------------------------------------------------------------------------


@dataclass
class Row:
    operation: str
    concurrency: int
    http: h.RunResult
    floor: h.RunResult
    statements: int


@dataclass
class Bench:
    args: argparse.Namespace
    database_url: str
    server: h.WebServer
    token: str
    cpu: h.CpuMeter
    rows: list[Row] = field(default_factory=list)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def run(self, label: str, statements: int, http_call: Callable[[h.HttpSession, int], None],
            floor_call: Callable[[Any, int], None]) -> None:
        """HTTP then floor, back to back at every concurrency; any failed call stops the benchmark."""
        if self.args.only is not None and label not in self.args.only and label.split(",")[0] not in self.args.only:
            return
        for concurrency, requests in zip(self.args.concurrency, self.args.requests, strict=True):
            results = []
            for kind, call in (("HTTP", http_call), ("floor", floor_call)):
                def make(_index: int, kind: str = kind, call: Any = call) -> h.Worker:
                    if kind == "HTTP":
                        return h.HttpWorker(self.server.base_url, self.headers, call)
                    return h.PgWorker(self.database_url, call)

                result = h.run_load(f"{label} {kind}", make, concurrency=concurrency, requests=requests,
                                    max_seconds=self.args.max_seconds, cpu=self.cpu)
                h.log(f"{label:<28} c{concurrency:<3} {kind:<5} n={result.completed:<6} p50={result.ms(50):7.2f} ms "
                      f"p99={result.ms(99):7.2f} ms {result.throughput:8.1f}/s"
                      f"{'  (time cap hit)' if result.timed_out else ''}")
                if result.errors:
                    raise h.BenchError(f"{label} c{concurrency} {kind}: {result.errors} failed call(s), e.g.\n  "
                                       + "\n  ".join(result.error_samples))
                results.append(result)
            self.rows.append(Row(label, concurrency, results[0], results[1], statements))


def measure(bench: Bench, data: Data, principal: Any) -> None:
    from apps.conversations import selectors, services
    from apps.core.pagination import Window
    from apps.sharing import services as sharing

    text = " ".join(WORDS[:30])
    append_body = json.dumps({"content": [{"role": "USER", "text": text}]}).encode()

    # Get one conversation (bob is a member, not the owner), the access level read with it.
    targets = data.member_of[:TARGETS]
    captured = [capture(lambda c=c: selectors.get_conversation(principal, uuid.UUID(c)), transaction=False)
                for c in targets]
    for (_, result), target in zip(captured, targets, strict=True):
        if result["id"] != target or result["accessLevel"] == "owner":
            raise h.BenchError(f"get conversation: unexpected {result}")
    bench.run("get conversation", len(captured[0][0].statements),
              lambda s, i: s.request("GET", f"/v1/conversations/{targets[i % len(targets)]}"),
              lambda c, i: captured[i % len(captured)][0].replay(c, i))

    # A page of 50 entries from the middle of a long conversation (keyset from a cursor).
    long = data.long[: min(TARGETS, len(data.long))]
    pages = []
    for conversation in long:
        middle = selectors.list_entries(principal, uuid.UUID(conversation), channel=None,
                                        window=Window(min(200, bench.args.long_entries // 2)))["afterCursor"]
        pages.append((conversation, middle))
    captured = [capture(lambda c=c, m=m: selectors.list_entries(principal, uuid.UUID(c), channel=None,
                                                                   window=Window(50, after=m)), transaction=False)
                for c, m in pages]
    if any(len(result["data"]) != 50 for _, result in captured):
        raise h.BenchError("entries page: a target returned fewer than 50 entries")
    bench.run("entries page (50)", len(captured[0][0].statements),
              lambda s, i: s.request("GET", f"/v1/conversations/{pages[i % len(pages)][0]}/entries?limit=50&"
                                            f"afterCursor={pages[i % len(pages)][1]}"),
              lambda c, i: captured[i % len(captured)][0].replay(c, i))

    # A page of 20 conversations (default mode latest-fork) for bob, member of ~200 trees.
    listing, result = capture(lambda: selectors.list_conversations(principal, mode="latest-fork", query=None,
                                                                    cursor=None, limit=20), transaction=False)
    if len(result["data"]) != 20:
        raise h.BenchError(f"conversation list: {len(result['data'])} items")
    bench.run("conversation list (20)", len(listing.statements),
              lambda s, i: s.request("GET", "/v1/conversations?limit=20"),
              lambda c, i: listing.replay(c, i))

    # Append an entry to one of bob's conversations (spread over them: one conversation serialises its appends).
    owned = data.owned[LONG_CONVERSATIONS:] or data.owned
    captured = []
    for conversation in owned[:TARGETS]:
        template, _ = capture(
            lambda c=conversation: services.append_entry(
                principal, uuid.UUID(c), {"channel": "history", "contentType": "history",
                                          "content": [{"role": "USER", "text": text}]}),
            transaction=True, keep=[conversation])
        captured.append(template)
    bench.run("append entry", len(captured[0].statements),
              lambda s, i: s.request("POST", f"/v1/conversations/{owned[i % len(owned[:TARGETS])]}/entries",
                                     append_body),
              lambda c, i: captured[i % len(captured)].replay(c, i))

    # Append to a conversation of 1, 100 (the default members quota) and 2,000 members (issue 28 item 3): the event
    # goes to every member's stream, so this is what an append's cost does with the member count.
    for members, conversation in data.crowds.items():
        template, _ = capture(
            lambda c=conversation: services.append_entry(
                principal, uuid.UUID(c), {"channel": "history", "contentType": "history",
                                          "content": [{"role": "USER", "text": text}]}),
            transaction=True, keep=[conversation])
        bench.run(f"append, {members} members", len(template.statements),
                  lambda s, i, c=conversation: s.request("POST", f"/v1/conversations/{c}/entries", append_body),
                  lambda c, i, t=template: t.replay(c, i))

    # Add a membership (a new reader each time) to one of bob's conversations.
    run_tag = uuid.uuid4().hex[:8]
    captured = []
    for conversation in owned[:TARGETS]:
        template, _ = capture(
            lambda c=conversation: sharing.add_membership(principal, uuid.UUID(c), user_id=f"cap-{c}",
                                                          access_level="reader"),
            transaction=True, keep=[conversation])
        template.fresh_text = {f"'cap-{conversation}'": lambda i: f"'floor-{run_tag}-{i}-{uuid.uuid4().hex[:6]}'"}
        captured.append(template)
    counter = iter(range(10**9))
    bench.run("membership add", len(captured[0].statements),
              lambda s, i: s.request("POST", f"/v1/conversations/{owned[i % len(owned[:TARGETS])]}/memberships",
                                     {"userId": f"guest-{run_tag}-{next(counter)}", "accessLevel": "reader"}),
              lambda c, i: captured[i % len(captured)].replay(c, i))


# --- Report -------------------------------------------------------------------------------------------------------


def _count(result: h.RunResult) -> str:
    return f"{result.completed}*" if result.timed_out else str(result.completed)


def report(info: dict[str, Any], rows: list[Row]) -> str:
    out = [f"# Conversation endpoints benchmark ({info['date']})", ""]
    out.append(h.markdown_table(["", ""], [[k, v] for k, v in info.items() if k != "date"], align="ll"))
    out += ["", f"Command: `{h.command_line()}`", ""]
    out.append(h.markdown_table(
        ["operation", "concurrency", "SQL statements", "n HTTP / floor", "HTTP p50 / p95 / p99 ms", "HTTP req/s",
         "floor p50 / p95 / p99 ms", "floor ops/s", "p50 ratio (HTTP/floor)"],
        [[row.operation, row.concurrency, row.statements, f"{_count(row.http)} / {_count(row.floor)}",
          " / ".join(h.fmt(row.http.ms(q)) for q in (50, 95, 99)), h.fmt(row.http.throughput, 0),
          " / ".join(h.fmt(row.floor.ms(q), 3) for q in (50, 95, 99)), h.fmt(row.floor.throughput, 0),
          h.fmt(row.http.ms(50) / row.floor.ms(50), 1) + "x"] for row in rows],
        align="lrrrrrrrr"))
    out += ["", "CPU during each run, % of one core (client = this process; web = gunicorn + workers; pg = all of "
                "PostgreSQL):", ""]
    out.append(h.markdown_table(
        ["operation", "concurrency", "HTTP: client / web / pg", "floor: client / pg"],
        [[row.operation, row.concurrency,
          " / ".join(h.fmt(row.http.cpu_percent.get(k), 0) for k in ("client", "web", "postgres")),
          " / ".join(h.fmt(row.floor.cpu_percent.get(k), 0) for k in ("client", "postgres"))] for row in rows],
        align="lrrr"))
    goal = [row for row in rows if row.concurrency == 1]
    if goal:
        out += ["", "Goal (issue 8): p50 within 4x of the floor at concurrency 1: " + ", ".join(
            f"{row.operation} {h.fmt(row.http.ms(50) / row.floor.ms(50), 1)}x"
            f"{'' if row.http.ms(50) <= 4 * row.floor.ms(50) else ' (over)'}" for row in goal) + "."]
    if any(row.http.timed_out or row.floor.timed_out for row in rows):
        out += ["", "- n marked * stopped at the time cap (--max-seconds) before its --requests count."]
    return "\n".join(out)


# --- Main ---------------------------------------------------------------------------------------------------------


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    h.install_sigterm_handler()
    started = time.monotonic()
    database_url = h.fresh_django_database(BENCH_DB)
    data = load(args, database_url)

    from apps.identity.principal import Principal

    info: dict[str, Any] = {}
    rows: list[Row] = []
    failure: str | None = None
    log_path = h.RESULTS_DIR / "conversations-server.log"
    try:
        with h.web_server(database_url, workers=args.web_workers, log_path=log_path) as server:
            token = h.mint_token(server.base_url, USER, PASSWORD)
            claims = h.unverified_claims(token)
            principal = Principal(user_id=USER, client_id=None, roles=tuple(claims.get("roles", ())), raw_claims=claims)
            cpu = h.CpuMeter({"web": server.process.pid, "postgres": h.postmaster_pid()})
            info = h.machine_info(
                database_url, web_workers=args.web_workers, conversations=args.conversations, entries=args.entries,
                users=args.users, bob_owns=len(data.owned), bob_member_of=len(data.owned) + len(data.member_of),
                long_conversation_entries=args.long_entries,
            )
            bench = Bench(args, database_url, server, token, cpu)
            h.run_load(  # warm every worker's DB connection and token cache before anything is timed
                "warm-up",
                lambda _i: h.HttpWorker(server.base_url, bench.headers,
                                        lambda s, i: s.request("GET", "/v1/conversations?limit=1")),
                concurrency=max(args.concurrency), requests=20 * max(args.concurrency), max_seconds=30,
            )
            try:
                measure(bench, data, principal)
            except h.BenchError as exc:
                failure = str(exc)
            rows = bench.rows
    except KeyboardInterrupt:
        h.log("interrupted; server stopped")
        return 130
    info["load_avg_at_end"] = " ".join(f"{value:.2f}" for value in os.getloadavg())
    info["duration_s"] = round(time.monotonic() - started)
    print(report(info, rows))
    path = h.write_json("conversations", {
        "command": h.command_line(), "machine": info, "args": dict(vars(args)),
        "rows": [{"operation": r.operation, "concurrency": r.concurrency, "statements": r.statements,
                  "http": r.http.summary(), "floor": r.floor.summary()} for r in rows],
        "failure": failure,
    })
    h.log(f"results written to {path.relative_to(h.REPO_ROOT)}; server log {log_path.relative_to(h.REPO_ROOT)}")
    if failure:
        print(f"\nFAILED: {failure}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    h.run_main(main)
