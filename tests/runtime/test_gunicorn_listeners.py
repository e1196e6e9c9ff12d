"""The web server's listening sockets (config/gunicorn.conf.py): one per worker, a port in use refused, and no
control socket unless asked for.

With one socket shared by all workers, the worker that woke first accepted every pending connection, so a burst of
keep-alive connections could all land on one worker and leave the other core idle (issue 12).
"""

from __future__ import annotations

import http.client
import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from django.db import connection

from tests.live_service import ESTABLISHED, LISTEN, LiveService, socket_inodes, tcp_inodes

# gunicorn started and stopped by each test; the servers read nothing a test wrote.
pytestmark = [pytest.mark.django_db, pytest.mark.live, pytest.mark.slow]


def test_each_worker_listens_on_its_own_socket_and_a_burst_of_connections_reaches_both(tmp_path) -> None:
    service = LiveService(db_settings=connection.settings_dict, log_path=tmp_path / "web.log", workers=2).start()
    clients = []
    try:
        workers = service.worker_pids()
        # 16 keep-alive connections opened back to back, as a benchmark or an upstream proxy's pool does.
        for _ in range(16):
            client = http.client.HTTPConnection("127.0.0.1", service.port, timeout=10)
            client.request("GET", "/healthz")
            assert client.getresponse().read() == b'{"status":"ok"}'
            clients.append(client)

        owner = {inode: pid for pid in [service.process.pid, *workers] for inode in socket_inodes(pid)}
        listeners = Counter(owner.get(inode) for inode in tcp_inodes(service.port, LISTEN))
        served = Counter(owner[inode] for inode in tcp_inodes(service.port, ESTABLISHED) if inode in owner)
        assert listeners == {workers[0]: 1, workers[1]: 1}, service.log_tail()
        assert sum(served.values()) == 16
        # The kernel hashes connections over the two sockets: all 16 on one worker has odds of 1 in 32,768.
        assert set(served) == set(workers), served
    finally:
        for client in clients:
            client.close()
        service.stop()


def test_a_second_server_on_a_port_in_use_refuses_to_start(tmp_path) -> None:
    first = LiveService(db_settings=connection.settings_dict, log_path=tmp_path / "first.log").start()
    try:
        second = LiveService(db_settings=connection.settings_dict, log_path=tmp_path / "second.log")
        second.port = first.port
        with pytest.raises(RuntimeError, match="exited with"):
            second.start()
        assert f"Address 127.0.0.1:{first.port} is already in use" in second.log_tail()
        # The first server still answers every connection: the second never joined its port.
        for _ in range(8):
            client = http.client.HTTPConnection("127.0.0.1", first.port, timeout=10)
            client.request("GET", "/healthz")
            assert client.getresponse().status == 200
            client.close()
    finally:
        first.stop()
        if second.process is not None and second.process.poll() is None:
            os.killpg(second.process.pid, signal.SIGKILL)


def test_no_control_socket_unless_one_is_asked_for(tmp_path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    environment = {"HOME": str(home), "XDG_RUNTIME_DIR": str(home)}

    def control_sockets(within: float) -> list[Path]:
        """The master opens its control socket shortly after the workers answer, and removes it when it stops."""
        deadline = time.monotonic() + within
        while not (found := [path for path in home.rglob("*") if path.is_socket()]) and time.monotonic() < deadline:
            time.sleep(0.1)
        return found

    asked = LiveService(
        db_settings=connection.settings_dict,
        log_path=tmp_path / "asked.log",
        extra_env={**environment, "GUNICORN_CONTROL_SOCKET": str(home / "web.ctl")},
    ).start()
    try:
        assert control_sockets(within=10) == [home / "web.ctl"], asked.log_tail()
    finally:
        asked.stop()
    assert control_sockets(within=0) == []

    # gunicorn's debug log says when the master skipped the control socket: from then on none will appear.
    quiet = {**environment, "GUNICORN_CMD_ARGS": "--log-level debug"}
    service = LiveService(db_settings=connection.settings_dict, log_path=tmp_path / "web.log", extra_env=quiet)
    service.start()
    try:
        deadline = time.monotonic() + 30
        while "Control socket disabled" not in service.log_tail(lines=200):
            assert time.monotonic() < deadline, service.log_tail()
            time.sleep(0.05)
        assert control_sockets(within=0) == [], service.log_tail()
    finally:
        service.stop()
