"""A loopback TCP proxy a test controls, standing in for a network path to PostgreSQL (or any server) that fails.

``freeze()`` stops forwarding in both directions while every connection stays open and new ones are still accepted
by the kernel: to the client the server is there but silent, as a stopped (SIGSTOP) PostgreSQL or a partitioned
network looks (the client's bytes are acknowledged, nothing comes back). ``thaw()`` forwards again, held bytes
included. ``stop()`` closes every connection and the listening socket (the server is gone: connections are
refused); ``start()`` listens again on the same port.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable


class PausableProxy:
    def __init__(self, connect_upstream: Callable[[], socket.socket]) -> None:
        self._connect_upstream = connect_upstream
        self._flowing = threading.Event()
        self._flowing.set()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.port = 0

    def start(self) -> PausableProxy:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True, name="proxy-accept").start()
        return self

    def freeze(self) -> None:
        self._flowing.clear()

    def thaw(self) -> None:
        self._flowing.set()

    def stop(self) -> None:
        """Refuse new connections and cut every open one."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            _close(sock)
        self._flowing.set()  # pumps held by a freeze see their sockets closed and end

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # stopped
            try:
                upstream = self._connect_upstream()
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:  # stopped meanwhile
                    client.close()
                    upstream.close()
                    return
                self._sockets.update((client, upstream))
            for source, target in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, target), daemon=True, name="proxy-pump").start()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        try:
            while True:
                self._flowing.wait()
                data = source.recv(65536)
                if not data:
                    break
                self._flowing.wait()  # a freeze that began during recv holds these bytes too
                target.sendall(data)
        except OSError:
            pass
        finally:
            _close(source)
            _close(target)
            with self._lock:
                self._sockets.discard(source)
                self._sockets.discard(target)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
