"""Shared machinery for the HTTP benchmarks in bench/ (memories.py, semantic_search.py).

What lives here is deliberately generic: a private benchmark database on the embedded PostgreSQL, the real web
server started the way the Procfile starts it, dev-IdP tokens, a thread-per-connection load generator with
latency percentiles, CPU accounting for client / web server / PostgreSQL, per-call timing of in-process code
(policy evaluation), markdown tables, machine info and the JSON result file. A benchmark script composes these;
anything that knows about one endpoint belongs in that script instead.

Every loop here is bounded twice, by a count and by a deadline, so a slow or wedged server makes a run short
and visibly incomplete instead of endless.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "bench" / "results"
VENV_BIN = Path(sys.executable).parent
SETTINGS_MODULE = "config.settings.embedded"

# The scripts run as `python bench/x.py`, so sys.path[0] is bench/; the project packages (config, apps) live one
# level up.
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


class BenchError(RuntimeError):
    """A benchmark cannot produce trustworthy numbers (setup failed, the server answered non-2xx...)."""


def run_main(main: Callable[[list[str]], int | None]) -> None:
    """A bench script's ``if __name__ == "__main__"``: exits with ``main(argv)``'s status; a :class:`BenchError` is
    one ``FAILED`` line on stderr and status 1 (no traceback)."""
    try:
        raise SystemExit(main(sys.argv[1:]))
    except BenchError as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


def log(message: str) -> None:
    """Progress goes to stderr so stdout carries only the report (pipe-friendly)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def install_sigterm_handler() -> None:
    """Turn SIGTERM into KeyboardInterrupt so the same `finally` blocks that handle Ctrl-C stop the server."""

    def _raise(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _raise)


# --- PostgreSQL ---------------------------------------------------------------------------------------------------


def embedded_postgres_url() -> str:
    """Start the embedded PostgreSQL if needed; the URL of the service's (dev) database, which we never write to.

    It is a shared daemon (web, worker, tests use it too), so we leave it running when we are done.
    """
    import warnings

    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR")
    from apps.runtime import embedded_services

    return embedded_services.postgres_url()


def with_database(url: str, dbname: str) -> str:
    """The same server URL naming another database (keeps ?host=/socket/dir and credentials)."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path=f"/{dbname}"))


def recreate_database(server_url: str, dbname: str) -> str:
    """DROP (forcing out leftover sessions of an interrupted run) and CREATE ``dbname``; returns its URL."""
    import psycopg
    from psycopg import sql

    from apps.runtime import embedded_services

    if dbname == embedded_services.DATABASE_NAME:
        raise BenchError(f"refusing to drop the service's own database {dbname!r}")
    with psycopg.connect(with_database(server_url, "postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
    return with_database(server_url, dbname)


def unmet_limits_env() -> dict[str, str]:
    """Every rate and quota of apps.limits far above what a benchmark sends or stores: the limiter and the quota
    checks run on every request as in production (their cost is measured), but never refuse one. A benchmark that
    wants the real limits passes them in ``extra``."""
    from apps.limits.definitions import QUOTAS, RATES

    env = {}
    for rate in RATES.values():
        env[rate.per_minute_setting] = "6000000"
        env[rate.burst_setting] = "1000000"
    for quota in QUOTAS.values():
        env[quota.setting] = str(10**15)
    return env


def server_env(database_url: str, **extra: str) -> dict[str, str]:
    """Environment for manage.py / gunicorn against the bench database: production-like logging and DEBUG off, the
    limits out of reach (unmet_limits_env)."""
    env = os.environ.copy()
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": SETTINGS_MODULE,
            "DATABASE_URL": database_url,
            "DEBUG": "false",
            "LOG_LEVEL": "WARNING",
            # gunicorn/celery are resolved from PATH by the Procfile; use this interpreter's virtualenv.
            "PATH": os.pathsep.join([str(VENV_BIN), env.get("PATH", "")]),
            **unmet_limits_env(),
        }
    )
    env.update(extra)
    return env


def migrate(database_url: str, timeout: float = 300, hnsw_indexes: bool = True) -> None:
    """`manage.py migrate` in a subprocess, so this process never holds Django's connection to a half-built schema.
    Migrate also creates the HNSW indexes of the configured provider; ``hnsw_indexes=False`` drops them again, for a
    benchmark that bulk-loads vectors first and builds (and times) the index after."""
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "manage.py"), "migrate", "--noinput", "-v", "0"],
        env=server_env(database_url),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if result.returncode != 0:
        raise BenchError(f"manage.py migrate failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    if not hnsw_indexes:
        import psycopg

        with psycopg.connect(database_url, autocommit=True) as conn:
            names = conn.execute(
                "SELECT indexname FROM pg_indexes WHERE indexname LIKE 'memory\\_vectors\\_hnsw\\_%' "
                "OR indexname LIKE 'conv\\_entry\\_vectors\\_hnsw\\_%'"
            ).fetchall()
            for (name,) in names:
                conn.execute(f'DROP INDEX IF EXISTS "{name}"')
    log(f"migrated in {time.monotonic() - started:.1f}s")


def postgres_version(database_url: str) -> str:
    import psycopg

    with psycopg.connect(database_url) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else "?"


def postmaster_pid() -> int | None:
    """PID of the embedded PostgreSQL's postmaster (first line of postmaster.pid), for CPU accounting."""
    from apps.runtime import embedded_services

    try:
        return int((embedded_services.data_dir() / "postgres" / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def setup_django(database_url: str, **extra_env: str) -> None:
    """Import Django in this process on the bench database (for in-process policy timing and SQL helpers)."""
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS_MODULE
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ.update({**unmet_limits_env(), **extra_env})
    import django

    django.setup()


def fresh_django_database(dbname: str) -> str:
    """The usual start of a benchmark: ``dbname`` dropped and created on the embedded server, migrated, and Django
    set up on it in this process; returns its URL."""
    database_url = recreate_database(embedded_postgres_url(), dbname)
    log(f"database {dbname} created")
    migrate(database_url)
    setup_django(database_url)
    return database_url


# --- The web server -----------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class WebServer:
    host: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""


@contextlib.contextmanager
def web_server(
    database_url: str,
    *,
    workers: int,
    log_path: Path,
    extra_env: dict[str, str] | None = None,
    ready_timeout: float = 90,
    app: str = "config.asgi:application",
    gunicorn_args: Sequence[str] = ("-c", "config/gunicorn.conf.py"),
) -> Iterator[WebServer]:
    """The Procfile's web line on a free loopback port; yields once /readyz answers 200, always stops it.

    The dev IdP signs tokens with its issuer URL, which must be the address clients reach, so DEV_IDP_ISSUER is
    derived from the port chosen here.
    """
    host, port = "127.0.0.1", free_port()
    metrics_dir = Path(tempfile.mkdtemp(prefix="bench-prometheus-"))  # per-worker metric files, as `manage.py up`
    env = server_env(
        database_url,
        PORT=str(port),
        DEV_IDP_ENABLED="true",
        DEV_IDP_ISSUER=f"http://{host}:{port}/dev-idp",
        PROMETHEUS_MULTIPROC_DIR=str(metrics_dir),
        **(extra_env or {}),
    )
    command = [
        str(VENV_BIN / "gunicorn"), *gunicorn_args, app,
        "-k", "apps.runtime.http_server.ServiceUvicornWorker",
        "--bind", f"{host}:{port}",
        "--workers", str(workers),
        "--graceful-timeout", "10",
    ]  # fmt: skip
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log_file:
        # Own session: a Ctrl-C in the terminal reaches only us, and we stop the server in order (finally below).
        process = subprocess.Popen(
            command, env=env, cwd=REPO_ROOT, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
    server = WebServer(host, port, process, log_path)
    try:
        _wait_ready(server, ready_timeout)
        log(f"web server ready at {server.base_url} (pid {process.pid}, {workers} workers)")
        yield server
    finally:
        _stop(process)
        shutil.rmtree(metrics_dir, ignore_errors=True)


def _wait_ready(server: WebServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise BenchError(f"web server exited with {server.process.returncode}:\n{server.log_tail()}")
        try:
            conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
            conn.request("GET", "/readyz")
            response = conn.getresponse()
            body = response.read()
            conn.close()
            if response.status == 200:
                return
            last = f"{response.status} {body[:300]!r}"
        except OSError as exc:
            last = repr(exc)
        time.sleep(0.25)
    raise BenchError(f"web server not ready after {timeout:.0f}s (last: {last}):\n{server.log_tail()}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the gunicorn master (it stops its workers gracefully); SIGKILL its process group if it hangs."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # the group we created with start_new_session
        process.wait(timeout=10)
    log(f"web server stopped (exit {process.returncode})")


# --- HTTP ---------------------------------------------------------------------------------------------------------


class HttpStatusError(BenchError):
    def __init__(self, method: str, path: str, status: int, body: bytes) -> None:
        super().__init__(f"{method} {path.split('?')[0]} -> {status}: {body[:200].decode(errors='replace')}")
        self.status = status


class HttpSession:
    """One persistent keep-alive connection (one per load thread, like a pooled client). Not thread-safe."""

    # The server closes a keep-alive connection idle for 2 s (gunicorn's ``keepalive``, which uvicorn_worker hands to
    # uvicorn): one idle for longer than this is reopened before it is used, or the request is written into a closed
    # socket (BrokenPipeError).
    IDLE_SECONDS = 1.0

    def __init__(self, host: str, port: int, headers: dict[str, str] | None = None, timeout: float = 30) -> None:
        self.conn = http.client.HTTPConnection(host, port, timeout=timeout)
        self.headers = dict(headers or {})
        self.last_used = time.monotonic()

    def request(self, method: str, path: str, body: Any = None, *, expect_2xx: bool = True) -> tuple[int, bytes]:
        if time.monotonic() - self.last_used > self.IDLE_SECONDS:
            self.conn.close()  # http.client reconnects on the next request
        headers = dict(self.headers)
        payload: bytes | None = None
        if body is not None:
            payload = body if isinstance(body, bytes) else json.dumps(body, separators=(",", ":")).encode()
            headers.setdefault("Content-Type", "application/json")
        try:
            self.conn.request(method, path, body=payload, headers=headers)
            response = self.conn.getresponse()
            data = response.read()  # must drain the body to reuse the connection
            self.last_used = time.monotonic()
        except (http.client.HTTPException, OSError):
            self.conn.close()  # http.client reconnects on the next request
            raise
        if response.will_close:
            self.conn.close()
        if expect_2xx and not 200 <= response.status < 300:
            raise HttpStatusError(method, path, response.status, data)
        return response.status, data

    def json(self, method: str, path: str, body: Any = None) -> Any:
        return json.loads(self.request(method, path, body)[1])

    def close(self) -> None:
        self.conn.close()


def mint_token(
    base_url: str, username: str, password: str, *, client_id: str = "memory-service-client",
    client_secret: str = "dev-client-secret",
) -> str:
    """An access token from the dev IdP's password grant (POST /dev-idp/token)."""
    parts = urllib.parse.urlsplit(base_url)
    session = HttpSession(parts.hostname or "127.0.0.1", parts.port or 80)
    form = urllib.parse.urlencode(
        {"grant_type": "password", "client_id": client_id, "client_secret": client_secret,
         "username": username, "password": password}
    ).encode()
    session.headers["Content-Type"] = "application/x-www-form-urlencoded"
    try:
        _, body = session.request("POST", "/dev-idp/token", form)
    finally:
        session.close()
    return str(json.loads(body)["access_token"])


def unverified_claims(token: str) -> dict[str, Any]:
    """The JWT's claims, to hand in-process policy evaluation the same context the server builds."""
    import jwt

    return dict(jwt.decode(token, options={"verify_signature": False}))


# --- CPU accounting -----------------------------------------------------------------------------------------------

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _proc_stat(pid: int) -> tuple[int, float] | None:
    """(ppid, cpu seconds incl. reaped children) from /proc/<pid>/stat, or None when gone/unavailable."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # after "(comm)", which may hold spaces
    ppid = int(fields[1])
    utime, stime, cutime, cstime = (int(value) for value in fields[11:15])
    return ppid, (utime + stime + cutime + cstime) / _CLOCK_TICKS


def process_tree(root: int) -> list[int]:
    """``root`` and all its descendants (from /proc), for memory accounting."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, stack = [], [root]
    while stack:
        pid = stack.pop()
        tree.append(pid)
        stack.extend(children.get(pid, []))
    return tree


def smaps_rollup(pid: int) -> dict[str, int]:
    """/proc/PID/smaps_rollup in kB (Pss counts shared pages once across the processes sharing them)."""
    with contextlib.suppress(OSError):
        text = (Path("/proc") / str(pid) / "smaps_rollup").read_text()
        return {key: int(value) for key, value in re.findall(r"^(\w+):\s+(\d+) kB", text, re.M)}
    return {}


def pss_alone_mb(pids: Sequence[int]) -> dict[int, float] | None:
    """Each process's PSS in MB as if ``pids`` were alone on the machine: every physical page they map counts once,
    split between those of them that map it (from /proc/PID/pagemap; None without the privilege to read frame
    numbers). smaps_rollup's Pss also splits a page with every other process mapping it, so its file-backed part
    moves with whatever else runs: other checkouts' servers mapping the same virtualenv's libtorch took 40-90 MB off
    one run's total here. The sum of these is the number of distinct pages the processes use."""
    import numpy as np

    present, frame = np.uint64(1 << 63), np.uint64((1 << 55) - 1)
    frames: dict[int, Any] = {}
    try:
        for pid in pids:
            chunks = []
            with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/pagemap", "rb") as pagemap:
                for line in maps:
                    start, end = (int(x, 16) for x in line.split()[0].split("-"))
                    if start >= 1 << 47:  # [vsyscall]: not in pagemap
                        continue
                    pagemap.seek(start // 4096 * 8)
                    entries = np.frombuffer(pagemap.read((end - start) // 4096 * 8), dtype=np.uint64)
                    chunks.append(entries[(entries & present) != 0] & frame)
            frames[pid] = np.unique(np.concatenate(chunks)) if chunks else np.empty(0, np.uint64)
    except OSError:
        return None
    if any(f.size and not f.any() for f in frames.values()):
        return None  # frame numbers read as 0: not privileged
    everything, counts = np.unique(np.concatenate(list(frames.values())), return_counts=True)
    return {
        pid: round(float((1.0 / counts[np.searchsorted(everything, f)]).sum()) * 4096 / 2**20, 1)
        for pid, f in frames.items()
    }


def maps_library(pid: int, name: str) -> bool:
    with contextlib.suppress(OSError):
        return name in (Path("/proc") / str(pid) / "maps").read_text()
    return False


def process_tree_cpu(root: int) -> float:
    """CPU seconds used by ``root`` and its live descendants (+ children they reaped). Linux /proc only; 0 elsewhere.

    Exited children are counted through their parent's cutime/cstime once reaped, which is how PostgreSQL backends
    and gunicorn workers end, so the total is close to exact over a run.
    """
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit() and (stat := _proc_stat(int(entry))) is not None:
            stats[int(entry)] = stat
    if root not in stats:
        return 0.0
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        total += stats[pid][1]
        stack.extend(children.get(pid, []))
    return total


def own_cpu() -> float:
    """CPU seconds of this (client) process: all its threads, user + system."""
    times = os.times()
    return times.user + times.system


@dataclass
class CpuMeter:
    """Snapshots CPU seconds of named process trees; a run reports each as % of one core over its wall time."""

    roots: dict[str, int | None] = field(default_factory=dict)

    def sample(self) -> dict[str, float]:
        values = {"client": own_cpu()}
        for name, pid in self.roots.items():
            if pid is not None:
                values[name] = process_tree_cpu(pid)
        return values


# --- Load generation ----------------------------------------------------------------------------------------------


class Worker(Protocol):
    """What a load thread runs: ``call(i)`` performs request number i (0-based, unique across threads) and raises
    on failure; ``close()`` releases the thread's connection."""

    def call(self, i: int) -> None: ...

    def close(self) -> None: ...


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), q in [0, 100]."""
    if not sorted_values:
        return float("nan")
    position = (len(sorted_values) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


@dataclass
class RunResult:
    label: str
    concurrency: int
    planned: int
    latencies: list[float]  # seconds, successful calls only
    errors: int
    error_samples: list[str]
    wall: float
    cpu_percent: dict[str, float]
    timed_out: bool

    @property
    def completed(self) -> int:
        return len(self.latencies)

    @property
    def throughput(self) -> float:
        return self.completed / self.wall if self.wall > 0 else 0.0

    def ms(self, q: float) -> float:
        return percentile(sorted(self.latencies), q) * 1000

    def summary(self) -> dict[str, Any]:
        ordered = sorted(self.latencies)
        return {
            "label": self.label,
            "concurrency": self.concurrency,
            "planned": self.planned,
            "completed": self.completed,
            "errors": self.errors,
            "error_samples": self.error_samples,
            "timed_out": self.timed_out,
            "wall_s": round(self.wall, 3),
            "throughput_per_s": round(self.throughput, 1),
            "p50_ms": round(percentile(ordered, 50) * 1000, 3),
            "p95_ms": round(percentile(ordered, 95) * 1000, 3),
            "p99_ms": round(percentile(ordered, 99) * 1000, 3),
            "max_ms": round(ordered[-1] * 1000, 3) if ordered else None,
            "cpu_percent_of_one_core": {name: round(value, 1) for name, value in self.cpu_percent.items()},
        }


def run_load(
    label: str,
    make_worker: Callable[[int], Worker],
    *,
    concurrency: int,
    requests: int,
    max_seconds: float,
    cpu: CpuMeter | None = None,
    max_errors: int = 20,
) -> RunResult:
    """``requests`` calls spread over ``concurrency`` threads (each with its own connection from ``make_worker``),
    stopping early at ``max_seconds`` or after ``max_errors`` failures. Connections are opened before the clock
    starts; throughput is completed calls over the wall time between the start barrier and the last thread's end.
    """
    lock = threading.Lock()
    next_index = 0
    errors: list[str] = []
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    stop = threading.Event()
    deadline = 0.0
    timed_out = False
    workers: list[Worker] = []
    for index in range(concurrency):
        workers.append(make_worker(index))
    barrier = threading.Barrier(concurrency + 1)

    def claim() -> int | None:
        nonlocal next_index, timed_out
        with lock:
            if stop.is_set() or next_index >= requests:
                return None
            if time.perf_counter() >= deadline:
                timed_out = True
                return None
            next_index += 1
            return next_index - 1

    def loop(index: int) -> None:
        worker, mine = workers[index], latencies[index]
        barrier.wait()
        while (i := claim()) is not None:
            started = time.perf_counter()
            try:
                worker.call(i)
            except Exception as exc:  # recorded and reported; the run fails afterwards
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}")
                    if len(errors) >= max_errors:
                        stop.set()
                continue
            mine.append(time.perf_counter() - started)

    threads = [threading.Thread(target=loop, args=(i,), name=f"{label}-{i}", daemon=True) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    cpu_before = cpu.sample() if cpu else {}
    deadline = time.perf_counter() + max_seconds
    started = time.perf_counter()
    barrier.wait()
    for thread in threads:
        # Each call has its own (HTTP/socket) timeout, so joining cannot hang past deadline + that timeout.
        thread.join()
    wall = time.perf_counter() - started
    cpu_after = cpu.sample() if cpu else {}
    for worker in workers:
        with contextlib.suppress(Exception):
            worker.close()
    cpu_percent = {name: 100 * (cpu_after[name] - cpu_before[name]) / wall for name in cpu_before if wall > 0}
    merged = [value for chunk in latencies for value in chunk]
    return RunResult(label, concurrency, requests, merged, len(errors), errors[:5], wall, cpu_percent, timed_out)


def time_calls(fn: Callable[[], Any], *, calls: int, max_seconds: float, warmup: int = 50) -> list[float]:
    """Per-call wall times (seconds) of an in-process function, after a short warm-up (caches, lazy imports)."""
    for _ in range(min(warmup, calls)):
        fn()
    samples: list[float] = []
    deadline = time.perf_counter() + max_seconds
    for _ in range(calls):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
        if started >= deadline:
            break
    return samples


# --- Reporting ----------------------------------------------------------------------------------------------------


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """A GitHub markdown table; ``align`` is one char per column ("l" or "r"), default left then right."""
    align = align or "l" + "r" * (len(headers) - 1)
    cells = [[str(cell) for cell in row] for row in rows]
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join(":---" if a == "l" else "---:" for a in align) + "|",
    ]
    lines.extend("| " + " | ".join(row) + " |" for row in cells)
    return "\n".join(lines)


def fmt(value: float | None, digits: int = 2) -> str:
    if value is None or value != value:  # None or NaN
        return "-"
    return f"{value:,.{digits}f}"


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "?"


def machine_info(database_url: str, **extra: Any) -> dict[str, Any]:
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "host": platform.node(),
        "nproc": affinity,
        "cpu": cpu_model(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "postgres": postgres_version(database_url),
        "load_avg_at_start": " ".join(f"{value:.2f}" for value in os.getloadavg()),
        **extra,
    }


def command_line() -> str:
    """The command as typed, relative to the repository (what to paste to reproduce)."""
    executable = Path(sys.executable)
    with contextlib.suppress(ValueError):
        executable = executable.relative_to(REPO_ROOT) if executable.is_relative_to(REPO_ROOT) else executable
    return " ".join([str(executable), *sys.argv])


def write_json(name: str, payload: dict[str, Any]) -> Path:
    """bench/results/<name>-<UTC timestamp>.json (the directory is git-ignored)."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return path


# --- Workers and the floor ----------------------------------------------------------------------------------------


class HttpWorker:
    """A load thread's keep-alive connection; ``fn(session, i)`` performs request i."""

    def __init__(self, base_url: str, headers: dict[str, str], fn: Callable[[HttpSession, int], None]) -> None:
        parts = urllib.parse.urlsplit(base_url)
        self.session = HttpSession(parts.hostname or "127.0.0.1", parts.port or 80, headers)
        self.session.conn.connect()  # TCP connect before the clock starts
        self.fn = fn

    def call(self, i: int) -> None:
        self.fn(self.session, i)

    def close(self) -> None:
        self.session.close()


def floor_connection(database_url: str, cursor_factory: Any = None) -> Any:
    """A psycopg connection shaped like the service's: autocommit (Django's atomic() issues BEGIN/COMMIT),
    client-side parameter binding (Django's default cursor for psycopg 3), server-side binding where the service
    binds so (execute_bound), and prepared statements only where the service prepares them (``prepare=True``, as
    apps.core.db.prepared; config.env sets the same threshold)."""
    import psycopg

    return psycopg.connect(
        database_url, autocommit=True, cursor_factory=cursor_factory or psycopg.ClientCursor, prepare_threshold=2**31 - 1
    )


def _trace(conn: Any, sql: str, params: Any) -> None:
    """Record the statement as the service's query log would show it, when the connection traces (SQL parity)."""
    import psycopg

    sink = getattr(conn.cursor_factory, "sink", None)
    if sink is not None:
        sink.append(psycopg.ClientCursor(conn).mogrify(sql, params))


def execute_bound(conn: Any, sql: str, params: Sequence[Any], *, prepare: bool = False) -> Any:
    """A statement the service binds server-side: through apps.core.db.prepared.bound_cursor (never prepared) or,
    with ``prepare``, prepared_cursor (prepared on first use)."""
    import psycopg

    _trace(conn, sql, params)
    return psycopg.Cursor(conn).execute(sql, params, prepare=prepare)


class BoundCursor:
    """For a service function that takes a cursor (selectors.read_horizon): each statement through execute_bound,
    so it is bound as the service binds it and traced for the SQL parity check."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.cursor: Any = None

    def execute(self, sql: str, params: Sequence[Any]) -> Any:
        self.cursor = execute_bound(self.conn, sql, params)
        return self.cursor

    def fetchone(self) -> Any:
        return self.cursor.fetchone()

    def fetchall(self) -> list[Any]:
        return self.cursor.fetchall()


def execute_pipelined(conn: Any, statements: Sequence[str], params: Any) -> list[tuple]:
    """Statements the service runs through apps.core.db.prepared.run_pipelined: one round trip, one implicit
    transaction, prepared; the rows of the last."""
    import psycopg

    cursors = []
    with conn.pipeline():
        for sql in statements:
            _trace(conn, sql, params)
            cursors.append(psycopg.Cursor(conn).execute(sql, params, prepare=True))
    return cursors[-1].fetchall()


class PgWorker:
    """A floor thread's own database connection; ``fn(conn, i)`` performs operation i."""

    def __init__(self, database_url: str, fn: Callable[[Any, int], None]) -> None:
        self.conn = floor_connection(database_url)
        self.fn = fn

    def call(self, i: int) -> None:
        self.fn(self.conn, i)

    def close(self) -> None:
        self.conn.close()


# --- SQL parity: does the floor still run what the service runs? ----------------------------------------------------

_SQL_STRING = re.compile(r"'(?:[^']|'')*'")
_SQL_NUMBER = re.compile(r"(?<![\w.\"])-?\d+(?:\.\d+)?(?![\w])")
_SQL_SPACE = re.compile(r"\s+")


def normalize_sql(statement: str) -> str:
    """A statement with every literal replaced by ?: two statements compare equal when only values differ."""
    statement = _SQL_STRING.sub("?", statement)
    statement = _SQL_NUMBER.sub("?", statement)
    return _SQL_SPACE.sub(" ", statement).strip()


def tracing_cursor_class(sink: list[str]) -> type:
    """A ClientCursor that records each statement as sent (parameters merged), for comparing with Django's."""
    import psycopg

    class TracingCursor(psycopg.ClientCursor):  # type: ignore[type-arg]
        sink = None  # set below; _trace records into it too

        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            sink.append(self.mogrify(query, params))
            return super().execute(query, params, **kwargs)

    TracingCursor.sink = sink
    return TracingCursor


def django_statements(fn: Callable[[], Any]) -> list[str]:
    """SQL statements Django sends while ``fn`` runs, without the BEGIN/COMMIT the floor issues through
    ``conn.transaction()`` (the floor replicates the transaction, not those two lines of text)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        fn()
    return [query["sql"] for query in captured.captured_queries if query["sql"] not in ("BEGIN", "COMMIT")]


def compare_statements(service: list[str], floor: list[str]) -> str | None:
    """None when both lists are the same statements up to literal values; else the first difference."""
    for index in range(max(len(service), len(floor))):
        ours = normalize_sql(floor[index]) if index < len(floor) else "(nothing)"
        theirs = normalize_sql(service[index]) if index < len(service) else "(nothing)"
        if ours != theirs:
            return f"statement {index + 1}: service runs\n    {theirs}\n  floor runs\n    {ours}"
    return None
