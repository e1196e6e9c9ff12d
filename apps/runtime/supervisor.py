"""The process supervisor behind `make run` (`manage.py up`): runs the Procfile's processes, restarts one that dies
with exponential backoff while the others keep serving, and stops them all (process groups included) on the way out.

Each process runs in its own session (process group), so a crash leaves no orphans behind (gunicorn's workers, the
Celery pool): the whole group is killed before the process is started again, and on shutdown. Children also get
SIGTERM from the kernel if the supervisor itself dies (PR_SET_PDEATHSIG), so even ``kill -9`` of `make run` leaves
no web server or worker running.

It also keeps servers running that are daemons rather than its children (``Server``: the embedded PostgreSQL and
Valkey `make run` started): one found down is started again with the same backoff, at the same address, so the
URLs the children were given stay valid.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def read_procfile(path: Path) -> dict[str, str]:
    """``name: command`` lines, in order (blank lines and ``#`` comments skipped)."""
    processes: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, command = line.partition(":")
        if name.strip() and command.strip():
            processes[name.strip()] = command.strip()
    return processes


try:
    # Loaded here, in the parent: the child between fork and exec should only make the one system call.
    _LIBC = ctypes.CDLL(None, use_errno=True) if os.uname().sysname == "Linux" else None
except OSError:
    _LIBC = None


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: ask the kernel to SIGTERM it when the supervisor dies.
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def stop_with_parent() -> None:
    """Have the kernel send this process SIGTERM when its parent dies (Linux): `make run` killed by a process
    manager or `timeout` (which signal make, not us) then shuts the service down in order instead of leaving it
    running with no one to stop it."""
    _die_with_parent()


@dataclass
class Child:
    name: str
    command: str
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    restarts: int = 0
    failures_in_a_row: int = 0
    restart_at: float | None = None  # when a crashed child is due to start again

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None


@dataclass
class Server:
    """A server the supervisor keeps running without being its parent: ``is_up()`` is polled, ``start()`` brings it
    back (on the same address) and raises when it cannot, to be tried again after the backoff."""

    name: str
    is_up: Callable[[], bool]
    start: Callable[[], object]
    up_since: float = field(default_factory=time.monotonic)
    restarts: int = 0
    failures_in_a_row: int = 0
    restart_at: float | None = None  # when a server found down is due to start again
    check_failing: bool = False  # is_up() raised at the last poll


@dataclass
class Supervisor:
    """Start with ``run()`` (blocks until ``stop()``, a signal, or an error); children restart on exit."""

    processes: Mapping[str, str]
    env: Mapping[str, str]
    cwd: Path
    backoff_initial: float = 1.0
    backoff_max: float = 30.0
    # A child that ran this long before dying counts as healthy: its next restart starts from the initial backoff.
    stable_after: float = 60.0
    stop_timeout: float = 15.0
    poll_interval: float = 0.2
    servers: Mapping[str, Server] = field(default_factory=dict)
    children: dict[str, Child] = field(default_factory=dict)
    _stopping: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.children = {name: Child(name, command) for name, command in self.processes.items()}

    # --- lifecycle --------------------------------------------------------------------------------------------

    def run(self) -> None:
        try:
            for child in self.children.values():
                self._start(child)
            while not self._stopping.is_set():
                self._check_servers()
                self._check_children()
                self._stopping.wait(self.poll_interval)
        finally:
            self.shutdown()

    def stop(self) -> None:
        """Ask ``run()`` to return (signal handlers call this; safe from any thread)."""
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def shutdown(self) -> None:
        """SIGTERM every child's process group, wait for them, SIGKILL what is left. Idempotent."""
        self._stopping.set()
        running = [child for child in self.children.values() if child.process is not None]
        for child in running:
            if child.process.poll() is None:
                logger.info("stopping process", extra={"program": child.name, "pid": child.pid})
            _signal_group(child.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout
        for child in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.process.wait(max(0.0, deadline - time.monotonic()))
            # The leader may be gone while members of its group (workers, pool processes) are not.
            _signal_group(child.process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.process.wait(5)
        for child in running:
            child.process = None

    # --- supervision ------------------------------------------------------------------------------------------

    def _backoff(self, failures_in_a_row: int) -> float:
        return min(self.backoff_max, self.backoff_initial * 2 ** (failures_in_a_row - 1))

    def _start(self, child: Child) -> None:
        child.process = subprocess.Popen(
            ["/bin/sh", "-c", f"exec {child.command}"],
            env=dict(self.env),
            cwd=self.cwd,
            start_new_session=True,  # its own process group, killed as a whole
            preexec_fn=_die_with_parent,
        )
        child.started_at = time.monotonic()
        child.restart_at = None
        logger.info(
            "process started", extra={"program": child.name, "pid": child.pid, "restarts": child.restarts}
        )

    def _check_children(self) -> None:
        now = time.monotonic()
        for child in self.children.values():
            if self._stopping.is_set():
                return
            if child.process is None:
                if child.restart_at is not None and now >= child.restart_at:
                    child.restarts += 1
                    self._start(child)
                continue
            code = child.process.poll()
            if code is None:
                continue
            # Whatever the leader left behind in its group (gunicorn workers, Celery pool processes) goes too.
            _signal_group(child.process.pid, signal.SIGKILL)
            ran = now - child.started_at
            child.failures_in_a_row = 1 if ran >= self.stable_after else child.failures_in_a_row + 1
            delay = self._backoff(child.failures_in_a_row)
            logger.warning(
                "process exited; restarting after backoff",
                extra={
                    "program": child.name,
                    "pid": child.pid,
                    "exit_code": code,
                    "signal": signal.Signals(-code).name if code < 0 else None,
                    "ran_seconds": round(ran, 1),
                    "restart_in_seconds": delay,
                    "failures_in_a_row": child.failures_in_a_row,
                },
            )
            child.process = None
            child.restart_at = now + delay

    def _check_servers(self) -> None:
        for server in self.servers.values():
            if self._stopping.is_set():
                return
            now = time.monotonic()
            if server.restart_at is None:
                if self._is_up(server):
                    continue
                ran = now - server.up_since
                server.failures_in_a_row = 1 if ran >= self.stable_after else server.failures_in_a_row + 1
                delay = self._backoff(server.failures_in_a_row)
                logger.warning(
                    "embedded server down; restarting after backoff",
                    extra={"server": server.name, "restart_in_seconds": delay, "failures_in_a_row": server.failures_in_a_row},
                )
                server.restart_at = now + delay
            elif now >= server.restart_at:
                try:
                    server.start()
                except Exception as exc:  # tried again after a longer backoff; the service answers 503 meanwhile
                    server.failures_in_a_row += 1
                    delay = self._backoff(server.failures_in_a_row)
                    server.restart_at = time.monotonic() + delay
                    logger.error(
                        "embedded server did not start; retrying after backoff",
                        extra={"server": server.name, "error": f"{type(exc).__name__}: {exc}", "restart_in_seconds": delay},
                    )
                    continue
                server.restart_at = None
                server.restarts += 1
                server.up_since = time.monotonic()
                logger.info("embedded server restarted", extra={"server": server.name, "restarts": server.restarts})


    @staticmethod
    def _is_up(server: Server) -> bool:
        """``server.is_up()``, where a check that raises (a pid file caught half-written, a process it cannot
        inspect) counts as up: it says nothing either way, and an exception here would end ``run()``, stopping every
        child with it. Logged once per run of failing checks."""
        try:
            up = server.is_up()
        except Exception as exc:
            if not server.check_failing:
                logger.warning(
                    "embedded server check failed; taken as up until it answers",
                    extra={"server": server.name, "error": f"{type(exc).__name__}: {exc}"},
                )
            server.check_failing = True
            return True
        server.check_failing = False
        return up


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
