"""Fixtures of the conversation tests live in support.py (shared with tests/sharing)."""

from tests.conversations.support import actor_client, http, shared

__all__ = ["actor_client", "http", "shared"]
