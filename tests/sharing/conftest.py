"""Fixtures of the sharing tests live in tests/conversations/support.py."""

from tests.conversations.support import actor_client, http, shared

__all__ = ["actor_client", "http", "shared"]
