"""A loopback HTTP server for tests that stand in for a peer (identity provider, OPA, embedding endpoint)."""

from __future__ import annotations

import sys
from http.server import ThreadingHTTPServer


class LocalHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer that stays quiet when a client hangs up on purpose (timeout tests)."""

    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)
