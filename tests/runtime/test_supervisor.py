"""`make run` under crashes (issue 7, item 5): the supervisor restarts a process that dies, with backoff, while the
others keep serving, and every way out of `manage.py up` stops the children and the embedded servers it started.

The first tests drive apps.runtime.supervisor with stand-in programs (fast); the last ones run the real
`manage.py up` (web, worker, beat on its own embedded PostgreSQL and Valkey) as a subprocess.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from django.conf import settings

from apps.runtime.supervisor import Server, Supervisor, read_procfile
from tests.conftest import service_env
from tests.live_service import listening_addresses


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) is not running.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait(condition, timeout: float, what: str) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if condition():
            return time.monotonic() - started
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout}s waiting for {what}")


def _group_pids(pgid: int) -> list[int]:
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().split(")")[-1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids


@pytest.fixture
def supervised(tmp_path):
    """``supervised(processes, **options)`` runs a Supervisor in a thread; it is shut down after the test."""
    started: list[tuple[Supervisor, threading.Thread]] = []

    def start(processes: dict[str, str], **options) -> Supervisor:
        supervisor = Supervisor(processes=processes, env=dict(os.environ), cwd=tmp_path, poll_interval=0.02, **options)
        thread = threading.Thread(target=supervisor.run, daemon=True)
        thread.start()
        started.append((supervisor, thread))
        _wait(lambda: all(child.pid for child in supervisor.children.values()), 10, "children to start")
        return supervisor

    yield start
    for supervisor, thread in started:
        supervisor.stop()
        thread.join(30)


def test_procfile_is_read_in_order():
    assert list(read_procfile(Path(settings.BASE_DIR) / "Procfile")) == ["web", "worker", "beat"]


def _web_bind(**env: str) -> str:
    """The address the Procfile's web command binds, expanded by /bin/sh as the supervisor runs it."""
    command = read_procfile(Path(settings.BASE_DIR) / "Procfile")["web"]
    argv = subprocess.run(
        ["/bin/sh", "-c", f'set -- {command}; printf "%s\\n" "$@"'], env=service_env(**env),
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()
    return argv[argv.index("--bind") + 1]


def test_web_binds_loopback_unless_host_says_otherwise():
    assert _web_bind() == "127.0.0.1:8080"
    assert _web_bind(HOST="") == "127.0.0.1:8080"
    assert _web_bind(HOST="0.0.0.0", PORT="9000") == "0.0.0.0:9000"


@pytest.mark.slow
def test_a_crashed_process_is_restarted_with_exponential_backoff_and_the_others_keep_running(supervised, caplog):
    caplog.set_level(logging.INFO, logger="apps.runtime.supervisor")
    supervisor = supervised({"steady": "sleep 600", "flaky": "sh -c 'sleep 0.05; exit 3'"}, backoff_initial=0.1)
    steady = supervisor.children["steady"].pid
    _wait(lambda: supervisor.children["flaky"].restarts >= 4, 20, "four restarts")
    exits = [r for r in caplog.records if r.getMessage() == "process exited; restarting after backoff"]
    delays = [r.restart_in_seconds for r in exits if r.program == "flaky"][:4]
    assert delays == [0.1, 0.2, 0.4, 0.8]  # doubling: a crash loop does not spin
    assert all(r.exit_code == 3 for r in exits)
    assert supervisor.children["steady"].pid == steady and _alive(steady)  # untouched by the other's crashes


def test_a_killed_process_is_restarted_and_its_orphans_are_reaped(supervised, tmp_path):
    # The leader starts a "pool" child in its group, like gunicorn and Celery do.
    supervisor = supervised({"pool": "sh -c 'sleep 600 & sleep 600 & wait'"}, backoff_initial=0.1)
    first = supervisor.children["pool"].pid
    _wait(lambda: len(_group_pids(first)) == 3, 10, "the pool to start")
    members = _group_pids(first)
    os.kill(first, signal.SIGKILL)
    _wait(lambda: supervisor.children["pool"].pid not in (None, first), 10, "the restart")
    _wait(lambda: not any(_alive(pid) for pid in members), 10, "the old pool to be killed")
    assert _alive(supervisor.children["pool"].pid)


def test_a_server_found_down_is_started_again_with_backoff_and_a_failed_start_is_retried(supervised, caplog):
    """The embedded servers are daemons, not children: the supervisor polls them and starts one found down again
    (issue 21 item 14), retrying a start that fails (its port still taken) after a longer backoff."""
    caplog.set_level(logging.INFO, logger="apps.runtime.supervisor")
    state = {"up": True, "starts": 0}

    def start() -> None:
        state["starts"] += 1
        if state["starts"] == 1:
            raise RuntimeError("port taken")
        state["up"] = True

    server = Server("fake", lambda: state["up"], start)
    supervisor = supervised({"steady": "sleep 600"}, backoff_initial=0.1, servers={"fake": server})
    steady = supervisor.children["steady"].pid
    state["up"] = False
    _wait(lambda: server.restarts == 1, 10, "the server to be started again")
    assert state == {"up": True, "starts": 2}
    messages = [(r.getMessage(), r.restart_in_seconds) for r in caplog.records if getattr(r, "server", None) == "fake"
                and hasattr(r, "restart_in_seconds")]  # fmt: skip
    assert messages == [
        ("embedded server down; restarting after backoff", 0.1),
        ("embedded server did not start; retrying after backoff", 0.2),
    ]
    assert supervisor.children["steady"].pid == steady  # the children are left alone


def test_a_server_check_that_raises_stops_nothing(supervised, caplog):
    """A check that fails says nothing about the server: the supervisor keeps running its children (an exception
    used to end run(), and with it web, worker and beat), logs it once, and restarts nothing."""
    caplog.set_level(logging.INFO, logger="apps.runtime.supervisor")
    state = {"checks": 0, "starts": 0}

    def is_up() -> bool:
        state["checks"] += 1
        if state["checks"] <= 3:
            raise OverflowError("postmaster.pid half-written")
        return True

    server = Server("fake", is_up, lambda: state.__setitem__("starts", state["starts"] + 1))
    supervisor = supervised({"steady": "sleep 600"}, backoff_initial=0.1, servers={"fake": server})
    steady = supervisor.children["steady"].pid
    _wait(lambda: state["checks"] > 10, 10, "the checks to go on")
    assert not supervisor.stopping and supervisor.children["steady"].pid == steady and _alive(steady)
    assert state["starts"] == 0 and server.restarts == 0 and not server.check_failing
    failed = [r for r in caplog.records if getattr(r, "server", None) == "fake" and "check failed" in r.getMessage()]
    assert len(failed) == 1


@pytest.mark.slow
def test_shutdown_stops_every_process_group_and_kills_what_ignores_sigterm(tmp_path):
    supervisor = Supervisor(
        processes={"polite": "sleep 600", "stubborn": "sh -c 'trap \"\" TERM; sleep 600 & wait; sleep 600'"},
        env=dict(os.environ), cwd=tmp_path, poll_interval=0.02, stop_timeout=1.0,
    )
    thread = threading.Thread(target=supervisor.run, daemon=True)
    thread.start()
    _wait(lambda: all(child.pid for child in supervisor.children.values()), 10, "children to start")
    groups = [child.pid for child in supervisor.children.values()]
    _wait(lambda: len(_group_pids(groups[1])) == 2, 10, "the stubborn child's own child")
    members = [pid for group in groups for pid in _group_pids(group)]
    supervisor.stop()
    thread.join(20)
    assert not thread.is_alive()
    # SIGKILL lands asynchronously on the group's other members (orphans reaped by init): give it a moment.
    _wait(lambda: not any(_alive(pid) for pid in members), 10, "every member of both groups to die")


def test_children_die_with_a_killed_supervisor(tmp_path):
    """Even kill -9 of `make run` (no handler can run) leaves no web server or worker behind (PR_SET_PDEATHSIG)."""
    pids = tmp_path / "pids"
    script = textwrap.dedent(
        f"""
        import os, sys, threading, time
        sys.path.insert(0, {str(settings.BASE_DIR)!r})
        from pathlib import Path
        from apps.runtime.supervisor import Supervisor
        s = Supervisor(processes={{"a": "sleep 600", "b": "sleep 600"}}, env=dict(os.environ), cwd=Path("."))
        def report():
            while not all(c.pid for c in s.children.values()):
                time.sleep(0.02)
            Path({str(pids)!r}).write_text(" ".join(str(c.pid) for c in s.children.values()))
        threading.Thread(target=report, daemon=True).start()
        s.run()
        """
    )
    process = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path)
    try:
        _wait(pids.exists, 20, "the supervisor to start its children")
        children = [int(pid) for pid in pids.read_text().split()]
        assert all(_alive(pid) for pid in children)
        process.kill()
        process.wait(10)
        _wait(lambda: not any(_alive(pid) for pid in children), 10, "the orphans to get SIGTERM")
    finally:
        process.kill()
        process.wait(10)


def test_up_stops_what_it_started_when_it_fails(monkeypatch):
    """A fatal error in `manage.py up` (here: the supervisor raising) still stops the embedded servers."""
    from django.core.management import call_command

    from apps.runtime import embedded_services
    from apps.runtime import supervisor as supervisor_module
    from apps.runtime.management.commands import up

    stopped = []
    monkeypatch.setattr(embedded_services, "started_here", {"postgres", "valkey"})
    monkeypatch.setattr(embedded_services, "stop", lambda only=None: stopped.append(only))
    monkeypatch.setattr(up, "call_command", lambda *args, **kwargs: None)  # no migrate
    monkeypatch.setattr(up.atexit, "register", lambda function: None)  # not in the test process
    monkeypatch.setattr(up, "stop_with_parent", lambda: None)

    def broken(self):
        raise RuntimeError("boom")

    monkeypatch.setattr(supervisor_module.Supervisor, "run", broken)
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        with pytest.raises(RuntimeError, match="boom"):
            call_command("up", port=_free_port())
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    assert stopped == [{"postgres", "valkey"}]
    up.stop_embedded_services()  # atexit's later call finds nothing left to stop
    assert stopped == [{"postgres", "valkey"}]


@pytest.mark.django_db
@pytest.mark.parametrize("flag", [[], ["--no-migrate"]])
def test_up_migrates_unless_told_not_to(monkeypatch, flag, capsys):
    """Several hosts on one database migrate it once (issue 32): `up --no-migrate` leaves that to a one-off job."""
    from django.core.management import call_command

    from apps.runtime import supervisor as supervisor_module
    from apps.runtime.management.commands import up

    commands = []

    class Started(Exception):
        pass

    def run(self):
        raise Started

    monkeypatch.setattr(up, "call_command", lambda name, *args, **kwargs: commands.append(name))
    monkeypatch.setattr(up.Command, "_prepare_embeddings", lambda self: None)
    monkeypatch.setattr(up.atexit, "register", lambda function: None)
    monkeypatch.setattr(up, "stop_with_parent", lambda: None)
    monkeypatch.setattr(up, "stop_embedded_services", lambda: None)
    monkeypatch.setattr(supervisor_module.Supervisor, "run", run)
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        with pytest.raises(Started):
            call_command("up", *flag, port=_free_port())
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    out = capsys.readouterr().out
    if flag:
        assert commands == [] and "database ready (not migrated here: --no-migrate)" in out
    else:
        assert commands == ["migrate"] and "database ready (" in out


@pytest.mark.django_db
def test_up_no_migrate_warns_when_migrations_are_missing(monkeypatch):
    from django.db.migrations.executor import MigrationExecutor

    from apps.runtime.management.commands import up

    monkeypatch.setattr(MigrationExecutor, "migration_plan", lambda self, targets: [(SimpleMigration, False)])
    assert "WARNING: --no-migrate and 1 migration(s) not applied" in up.Command._unmigrated_warning()
    assert "memories.0042_future" in up.Command._unmigrated_warning()


class SimpleMigration:
    app_label, name = "memories", "0042_future"


# --- The real `manage.py up` ------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


class Up:
    """`manage.py up` in a subprocess with its own data directory (its own embedded PostgreSQL and Valkey);
    ``via_parent`` starts it under a shell standing in for `make`."""

    def __init__(self, data_dir: Path, *, via_parent: bool = False, **extra_env: str) -> None:
        self.data_dir = data_dir
        self.port = _free_port()
        self.log = data_dir.parent / f"up-{self.port}.log"
        env = service_env(
            DJANGO_SETTINGS_MODULE="config.settings.embedded", DATA_DIR=str(data_dir), EMBEDDING_PROVIDER="hash",
            WEB_CONCURRENCY="1", CELERY_CONCURRENCY="1", LOG_LEVEL="INFO", LOG_FORMAT="json",
            **extra_env,
        )
        command = [sys.executable, "manage.py", "up", "--port", str(self.port)]
        pidfile = data_dir.parent / f"up-{self.port}.pid"
        if via_parent:
            command = ["/bin/sh", "-c", f'"$@" & echo $! > {pidfile}; wait', "sh", *command]
        with open(self.log, "wb") as output:
            self.process = subprocess.Popen(
                command, cwd=settings.BASE_DIR, env=env, stdout=output, stderr=subprocess.STDOUT
            )
        if via_parent:
            _wait(lambda: pidfile.exists() and pidfile.read_text().strip(), 10, "the shell to start up")
            self.pid = int(pidfile.read_text())
        else:
            self.pid = self.process.pid

    def running(self) -> bool:
        return _alive(self.pid)

    def events(self, message: str) -> list[dict]:
        found = []
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith("{") and f'"message": "{message}"' in line:
                found.append(json.loads(line))
        return found

    def pid_of(self, program: str) -> int | None:
        started = [e for e in self.events("process started") if e["program"] == program]
        return started[-1]["pid"] if started else None

    def members(self) -> list[int]:
        """Every process of web, worker and beat (their whole process groups)."""
        return [pid for name in ("web", "worker", "beat") for pid in _group_pids(self.pid_of(name))]

    def embedded_pids(self) -> tuple[int, int]:
        postgres = int((self.data_dir / "postgres" / "postmaster.pid").read_text().split()[0])
        valkey = int((self.data_dir / "valkey" / "valkey.pid").read_text().strip())
        return postgres, valkey

    def wait_healthy(self, timeout: float = 150) -> None:
        try:
            _wait(lambda: _healthy(self.port) or not self.running(), timeout, "/healthz")
        except pytest.fail.Exception:
            pytest.fail(f"manage.py up did not answer /healthz\n{self.tail()}")
        assert self.running(), self.tail()

    def wait_stopped(self, timeout: float = 60) -> None:
        try:
            _wait(lambda: not self.running(), timeout, "manage.py up to exit")
        except pytest.fail.Exception:
            pytest.fail(f"manage.py up did not exit\n{self.tail()}")

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def kill(self) -> None:
        for pid in (self.pid, self.process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait(10)


@pytest.fixture(scope="module")
def up_data_dir():
    """One data directory for the module: the first `up` creates the embedded servers' data, later ones reuse it.

    Not under pytest's tmp_path: run as root, the embedded PostgreSQL runs as its own user and opens the path up
    for it, and every pytest session that starts meanwhile (another checkout's) resets pytest's root to 0700."""
    root = Path(tempfile.mkdtemp(prefix="memory-service-up-"))
    path = root / "data"
    yield path
    # A test that failed half-way may leave the servers running: stop them by data directory.
    subprocess.run(
        [sys.executable, "-m", "apps.runtime.embedded_services", "stop"], env=service_env(DATA_DIR=str(path)),
        cwd=settings.BASE_DIR, capture_output=True, timeout=60, check=False,
    )
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.live
@pytest.mark.slow
def test_up_restarts_a_killed_worker_keeps_serving_and_sigterm_stops_everything(up_data_dir):
    up = Up(up_data_dir)
    try:
        up.wait_healthy()
        postgres, valkey = up.embedded_pids()
        worker = up.pid_of("worker")
        web = up.pid_of("web")
        assert worker and web and _alive(postgres) and _alive(valkey)
        # No HOST in its environment: loopback only (the dev IdP hands out admin tokens to whoever reaches it).
        assert listening_addresses(up.port) == {"127.0.0.1"}

        os.kill(worker, signal.SIGKILL)
        answered = []
        restart = _wait(
            lambda: answered.append(_healthy(up.port)) or (up.pid_of("worker") not in (None, worker)),
            30, "the worker to be restarted",
        )
        assert all(answered), "the web server stopped answering while the worker was down"
        exit_event = next(e for e in up.events("process exited; restarting after backoff") if e["program"] == "worker")
        assert exit_event["signal"] == "SIGKILL" and exit_event["restart_in_seconds"] == 1.0
        assert up.pid_of("web") == web and _alive(web)
        assert _alive(up.pid_of("worker")) and up.running()
        assert restart < 10

        members = up.members()
        up.process.send_signal(signal.SIGTERM)
        assert up.process.wait(60) == 0, up.tail()
        _wait(lambda: not any(_alive(pid) for pid in members), 10, "web, worker and beat to die")
        _wait(lambda: not _alive(postgres) and not _alive(valkey), 10, "embedded PostgreSQL and Valkey to stop")
    finally:
        up.kill()


@pytest.mark.live
@pytest.mark.slow
def test_up_stops_the_embedded_servers_on_ctrl_c(up_data_dir):
    up = Up(up_data_dir)
    try:
        up.wait_healthy()
        postgres, valkey = up.embedded_pids()
        members = up.members()
        up.process.send_signal(signal.SIGINT)
        assert up.process.wait(60) == 0, up.tail()
        _wait(lambda: not any(_alive(pid) for pid in members), 10, "web, worker and beat to die")
        _wait(lambda: not _alive(postgres) and not _alive(valkey), 10, "embedded PostgreSQL and Valkey to stop")
    finally:
        up.kill()


@pytest.mark.live
@pytest.mark.slow
def test_up_stops_everything_when_make_is_killed(up_data_dir):
    """kill -9 of `make run`'s make (a process manager, `timeout`): `up` gets SIGTERM from the kernel and stops."""
    up = Up(up_data_dir, via_parent=True)
    try:
        up.wait_healthy()
        postgres, valkey = up.embedded_pids()
        members = up.members()
        up.process.kill()  # the shell standing in for make
        up.process.wait(10)
        up.wait_stopped()
        _wait(lambda: not any(_alive(pid) for pid in members), 30, "web, worker and beat to stop")
        _wait(lambda: not _alive(postgres) and not _alive(valkey), 10, "embedded PostgreSQL and Valkey to stop")
        assert up.events("embedded services stopped"), up.tail()
    finally:
        up.kill()


# --- Outages under `make run` (issue 21 items 13 and 14) -------------------------------------------------------


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def _bind_and_listen(sock: socket.socket, port: int) -> bool:
    """Hold ``port`` so nothing else can listen on it, hanging up on whoever connects (as a port nobody serves
    would refuse them: a listener that never answered would look like a frozen Redis instead)."""
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        return False
    sock.listen(16)

    def hang_up() -> None:
        while True:
            try:
                client, _ = sock.accept()
            except OSError:
                return  # closed: the port is released
            client.close()

    threading.Thread(target=hang_up, daemon=True).start()
    return True


def _release(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
    sock.close()


def _call(method: str, url: str, token: str, body=None) -> tuple[int, dict]:
    import requests

    try:
        response = requests.request(method, url, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    except requests.RequestException:
        return 0, {}
    return response.status_code, (response.json() if response.content else {})


@pytest.mark.live
@pytest.mark.slow
def test_up_restarts_killed_valkey_and_stopped_postgres_in_place_and_nothing_stays_unindexed(up_data_dir):
    """Valkey killed (and the worker with it): writes still succeed; Valkey comes back on its port and the restarted
    worker uses it (no second Valkey); the open event stream gets one ``invalidate``; every memory and entry written
    meanwhile is indexed without anyone doing anything. PostgreSQL stopped (SIGTERM, a smart shutdown the service's
    sessions would hold up forever): restarted on the same socket, and the service answers 200 again by itself."""
    import requests

    from tests.events.conftest import SSEClient

    # A search shows only what the restarted worker indexed, none of what is still waiting for it (read your writes).
    up = Up(up_data_dir, MEMORY_EPISODIC_INDEXING_INTERVAL="1", CONVERSATION_INDEXING_INTERVAL="1",
            MEMORY_SEARCH_PENDING_LIMIT="0")
    stream = blocker = None
    try:
        up.wait_healthy()
        base = f"http://127.0.0.1:{up.port}"
        token = requests.post(
            f"{base}/dev-idp/token", timeout=10,
            data={"grant_type": "password", "client_id": settings.DEV_IDP_CLIENT_ID,
                  "client_secret": settings.DEV_IDP_CLIENT_SECRET, "username": "alice", "password": "alice"},
        ).json()["access_token"]  # fmt: skip
        # Only `up` starts embedded servers: web, worker and beat get its URLs.
        urls = {name: _environ(up.pid_of(name)) for name in ("web", "worker", "beat")}
        redis_url = urls["web"]["REDIS_URL"]
        assert {env["REDIS_URL"] for env in urls.values()} == {redis_url}
        assert len({env["DATABASE_URL"] for env in urls.values()}) == 1
        valkey_port = int((up_data_dir / "valkey" / "port").read_text())
        assert redis_url.endswith(f":{valkey_port}/0")
        postgres, valkey = up.embedded_pids()
        stream = SSEClient(type("Server", (), {"port": up.port})(), "/v1/events", {"Authorization": f"Bearer {token}"})
        assert stream.status == 200
        status, conversation = _call("POST", f"{base}/v1/conversations", token, {"title": "outage"})
        assert status == 201, conversation
        # The stream is live: it gets the new conversation's two events (the conversation, the owner's membership).
        assert {stream.next(timeout=10).data["kind"] for _ in range(2)} == {"conversation", "membership"}

        worker = up.pid_of("worker")
        os.kill(valkey, signal.SIGKILL)
        os.kill(worker, signal.SIGKILL)
        # Valkey's port is held (as another program might take it) until every write below is done, so they all
        # happen while it is down (a supervisor's retry meanwhile meets a taken port and backs off).
        blocker = socket.socket()
        blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        _wait(lambda: _bind_and_listen(blocker, valkey_port), 10, "Valkey's port to be released")
        texts = [f"outage note {index} about lighthouses" for index in range(5)]
        for index, text in enumerate(texts):
            status, body = _call("PUT", f"{base}/v1/memories", token, {
                "namespace": ["user", "alice", "outage"], "key": f"k{index}", "value": {"text": text},
                "index": {"text": text}})  # fmt: skip
            assert status == 200, body
            status, body = _call("POST", f"{base}/v1/conversations/{conversation['id']}/entries", token,
                                 {"content": [{"role": "USER", "text": text}]})
            assert status == 201, body
        # The premise of "one invalidate": every missed write precedes Valkey's return by more than the 0.5 s the
        # hub allows between clocks (a write after it would rightly get an invalidate of its own).
        last_write = time.monotonic()
        _wait(lambda: time.monotonic() - last_write > 0.6, 5, "the clock margin to pass")
        _release(blocker)

        _wait(lambda: any(e["server"] == "valkey" for e in up.events("embedded server restarted")), 60, "Valkey back")
        assert int((up_data_dir / "valkey" / "port").read_text()) == valkey_port
        assert up.embedded_pids()[1] != valkey
        _wait(lambda: up.pid_of("worker") not in (None, worker), 30, "the worker to be restarted")
        assert _environ(up.pid_of("worker"))["REDIS_URL"] == redis_url  # the same Valkey, never a second one

        invalidate = stream.next(timeout=30)
        assert invalidate.data == {"event": "invalidate", "kind": "stream", "data": {}}

        def all_indexed() -> bool:
            status, found = _call("POST", f"{base}/v1/memories/search", token, {
                "namespace_prefix": ["user", "alice", "outage"], "query": "lighthouses", "search_type": "semantic",
                "limit": 10})  # fmt: skip
            status_u, unindexed = _call("GET", f"{base}/v1/conversations/unindexed?limit=200", token)
            pending = [item for item in unindexed.get("data", []) if item["conversationId"] == conversation["id"]]
            return status == 200 and len(found["items"]) == len(texts) and status_u == 200 and not pending

        _wait(all_indexed, 60, "every memory and entry written while Valkey was down to be indexed")

        # The stream goes on with exactly that one invalidate before the next event.
        status, entry = _call("POST", f"{base}/v1/conversations/{conversation['id']}/entries", token,
                              {"content": [{"role": "USER", "text": "after the outage"}]})
        assert status == 201
        following = []
        while not following or following[-1].data.get("kind") != "entry":
            try:
                following.append(stream.next(timeout=10))
            except TimeoutError:
                pytest.fail(f"no entry event after the outage; got {[m.data for m in following]}\n{up.tail()}")
        assert [m.data["event"] for m in following[:-1]] == [], [m.data for m in following]
        assert following[-1].data["data"]["entryId"] == entry["id"]

        os.kill(postgres, signal.SIGTERM)  # a smart shutdown: it waits for every session to end
        statuses = []

        def postgres_back() -> bool:
            statuses.append(_call("GET", f"{base}/v1/memories?ns=user&ns=alice&ns=outage&key=k0", token)[0])
            return any(e["server"] == "postgres" for e in up.events("embedded server restarted"))

        _wait(postgres_back, 60, "PostgreSQL back")
        assert 503 in statuses and set(statuses) <= {200, 503}, statuses  # unavailable meanwhile, never a 500
        assert up.embedded_pids()[0] != postgres
        _wait(lambda: _call("GET", f"{base}/readyz", token)[0] == 200, 30, "/readyz 200 again")
        status, body = _call("GET", f"{base}/v1/memories?ns=user&ns=alice&ns=outage&key=k0", token)
        assert status == 200 and body["value"] == {"text": texts[0]}
    finally:
        if stream is not None:
            stream.close()
        if blocker is not None:
            _release(blocker)
        up.process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            up.process.wait(60)
        up.kill()
