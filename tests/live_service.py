"""The one way tests run the service over HTTP: the production web stack in a process of its own.

It is the web process of the Procfile (gunicorn + uvicorn workers + config.asgi: the REST API through the WSGI
bridge, ``/v1/events`` through the Channels consumer) on the embedded settings with DEBUG off, pointed at this
pytest session's test database, Valkey and data directory (the same signing and encryption keys), and accepting
the tokens this process mints (``mint_token``, ``client_for``).

- ``live_service`` (tests/conftest.py) is the session's shared instance: two workers, as in production. Concurrency
  tests, the fuzzer, the README example and the bridge tests all talk to it; start nothing else for them.
- A test that needs the server configured otherwise starts its own ``LiveService(extra_env=...)`` (the event stream's
  fast clocks, gunicorn's listeners, a database behind a proxy), module-scoped where it can be.

Whatever it writes is committed: a test that drives it is ``django_db(transaction=True)`` (emptied afterwards by
tests.database.empty_tables), or empties the tables once after its module.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests
from django.conf import settings

# What a process a test starts inherits from the test's environment, nothing else: the system's basics, and where
# bytecode is cached (the Makefile's BYTECODE: without it each process compiles every module it imports again).
INHERITED_ENV = ("PATH", "HOME", "USER", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "XDG_RUNTIME_DIR",
                 "PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")  # fmt: skip


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# /proc/net/tcp socket states.
LISTEN, ESTABLISHED = "0A", "01"


def children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets ``pid`` holds open (none once it has exited: a worker gunicorn is replacing)."""
    inodes = set()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except FileNotFoundError:  # the process is gone
        return inodes
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:  # closed since the listing
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def tcp_inodes(port: int, state: str) -> list[str]:
    """The inodes of the IPv4 TCP sockets on local ``port`` in ``state`` (LISTEN, ESTABLISHED)."""
    inodes = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port and fields[3] == state:
            inodes.append(fields[9])
    return inodes


def listening_addresses(port: int) -> set[str]:
    """The IPv4 addresses listening on local ``port`` (``"127.0.0.1"``, ``"0.0.0.0"``)."""
    addresses = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        address, _, local_port = fields[1].partition(":")
        if int(local_port, 16) == port and fields[3] == LISTEN:
            addresses.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return addresses


def database_url(settings_dict: Mapping) -> str:
    """A libpq URL for a Django DATABASES entry (the test database once pytest-django created it)."""
    user = quote(settings_dict.get("USER") or "", safe="")
    password = quote(settings_dict.get("PASSWORD") or "", safe="")
    credentials = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = settings_dict.get("HOST") or ""
    port = settings_dict.get("PORT") or ""
    name = quote(settings_dict["NAME"], safe="")
    if host.startswith("/"):  # a Unix socket directory
        return f"postgresql://{credentials}/{name}?host={quote(host, safe='')}" + (f"&port={port}" if port else "")
    return f"postgresql://{credentials}{host}{':' + str(port) if port else ''}/{name}"


def raised_rate_limits() -> dict[str, str]:
    """The test settings' rates (far above what the suite sends) and rate-check timeout for a live server: tests
    of the limits pass the real ones in ``extra_env``."""
    from apps.limits.definitions import RATES

    env = {}
    for rate in RATES.values():
        env[rate.per_minute_setting] = str(settings.TEST_RATE_LIMIT_PER_MINUTE)
        env[rate.burst_setting] = str(settings.TEST_RATE_LIMIT_BURST)
    env["RATE_LIMIT_TIMEOUT_SECONDS"] = str(settings.RATE_LIMIT_TIMEOUT_SECONDS)
    return env


class LiveService:
    """``start()`` → ``base_url``; ``request()`` and ``token(user)``; ``stop()``; ``log_tail()`` for failures.

    ``db_settings`` defaults to the test database, ``log_path`` to a temporary file removed by ``stop()``.
    ``extra_env`` overrides the environment below (settings are read from it). ``send_buffer`` gives the listening
    socket (and so every accepted connection) a small, fixed send buffer: a client that stops reading then
    back-pressures the server after that many bytes instead of the megabytes loopback autotuning absorbs."""

    def __init__(
        self,
        *,
        db_settings: Mapping | None = None,
        log_path: Path | None = None,
        extra_env: Mapping[str, str] | None = None,
        workers: int = 1,
        send_buffer: int | None = None,
    ) -> None:
        if db_settings is None:
            from django.db import connection

            db_settings = connection.settings_dict
        # Never let a live server (and the table resets after it) near any other database than pytest-django's.
        assert db_settings["NAME"].startswith("test_"), db_settings["NAME"]
        from apps.identity.dev_idp import keys

        keys.signing_key()  # on disk before the server looks for it: it may not generate one (issue 32.4)
        self.workers = workers
        self.send_buffer = send_buffer
        self._listener: socket.socket | None = None
        if send_buffer is not None:
            self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer)
            self._listener.bind(("127.0.0.1", 0))
            self._listener.listen(512)
            self.port = self._listener.getsockname()[1]
        else:
            self.port = free_port()
        self._own_log = log_path is None
        if log_path is None:
            handle, name = tempfile.mkstemp(prefix="live-service-", suffix=".log")
            os.close(handle)
            log_path = Path(name)
        self.log_path = log_path
        # A clean environment: only what a process needs to run, then the service's settings. Inheriting all of
        # os.environ would hand the server whatever an earlier test left there (a SERVICE_POLICY_DIR that no
        # longer exists stopped it from booting).
        self.env = {
            **{name: value for name, value in os.environ.items() if name in INHERITED_ENV},
            "DJANGO_SETTINGS_MODULE": "config.settings.embedded",
            "DATABASE_URL": database_url(db_settings),
            "REDIS_URL": settings.REDIS_URL,
            "SSE_REDIS_PREFIX": settings.SSE_REDIS_PREFIX,  # this test process's streams (one per xdist worker)
            "DATA_DIR": str(settings.DATA_DIR),  # the same dev IdP key and encryption keys as this process
            "PORT": str(self.port),
            # The issuer of the tokens this process mints (mint_token, client_for): the server accepts them, and
            # its own dev IdP (token()) issues the same.
            "DEV_IDP_ISSUER": settings.DEV_IDP_ISSUER,
            "DEBUG": "false",  # production error handling: DEBUG pages would hide HTML-vs-JSON defects
            "DEV_IDP_ENABLED": "true",
            "API_KEYS": settings.API_KEYS,
            "EMBEDDING_PROVIDER": "hash",  # no torch in the server: semantic search still runs end to end
            "LOG_LEVEL": "WARNING",
            "WSGI_THREADS": "4",
            **raised_rate_limits(),
            **(extra_env or {}),
        }
        self.process: subprocess.Popen | None = None
        self._log = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> LiveService:
        return self.launch().wait_ready(timeout)

    @classmethod
    def start_all(cls, services: list[LiveService], timeout: float = 60.0) -> list[LiveService]:
        """Boot several at once (each boot is mostly waiting for imports): launched together, then awaited."""
        for service in services:
            service.launch()
        for service in services:
            service.wait_ready(timeout)
        return services

    def launch(self) -> LiveService:
        """Start the process without waiting for it to serve (``wait_ready``)."""
        gunicorn = Path(sys.executable).with_name("gunicorn")
        bind = f"fd://{self._listener.fileno()}" if self._listener is not None else f"127.0.0.1:{self.port}"
        argv = [
            str(gunicorn),
            "-c",
            "config/gunicorn.conf.py",
            "config.asgi:application",
            "-k",
            "apps.runtime.http_server.ServiceUvicornWorker",
            "--bind",
            bind,
            "--workers",
            str(self.workers),
            "--graceful-timeout",
            "5",
        ]
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            argv,
            env=self.env,
            cwd=settings.BASE_DIR,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=(self._listener.fileno(),) if self._listener is not None else (),
        )
        return self

    def wait_ready(self, timeout: float = 60.0) -> LiveService:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the service exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                # /healthz answers once one worker serves; gunicorn forks the others after it, and with a socket
                # per worker (config/gunicorn.conf.py) a connection hashed to one still booting would wait for it.
                if self.workers_listening() and requests.get(f"{self.base_url}/healthz", timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"the service did not serve with all its workers within {timeout:.0f} s:\n{self.log_tail()}")

    def worker_pids(self) -> list[int]:
        """The gunicorn master's child processes: its workers."""
        return children(self.process.pid)

    def workers_listening(self) -> bool:
        """Every worker is up and holds a listening socket on the port (its own, or the master's shared one)."""
        workers = self.worker_pids()
        listening = set(tcp_inodes(self.port, LISTEN))
        return len(workers) == self.workers and all(socket_inodes(pid) & listening for pid in workers)

    def request(
        self, method: str, path: str, json: Any = None, headers: Mapping[str, str] | None = None, timeout: float = 30
    ) -> tuple[int, Any]:
        """One request on a connection of its own; returns the status and the decoded JSON body (None if empty)."""
        response = requests.request(method, self.base_url + path, json=json, headers=headers, timeout=timeout)
        return response.status_code, (response.json() if response.content else None)

    def token(self, username: str) -> str:
        """An access token from the live service's own dev IdP (the password grant; password = user name)."""
        response = requests.post(
            f"{self.base_url}/dev-idp/token",
            data={
                "grant_type": "password",
                "client_id": settings.DEV_IDP_CLIENT_ID,
                "client_secret": settings.DEV_IDP_CLIENT_SECRET,
                "username": username,
                "password": username,
            },
            timeout=10,
        )
        response.raise_for_status()
        return response.json()["access_token"]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            # The process group: gunicorn's master and its workers.
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=5)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._own_log:
            self.log_path.unlink(missing_ok=True)

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
