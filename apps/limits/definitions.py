"""Every rate and quota (D11), with its default, its setting and its override field: the one list the settings,
the override model, the admin, ``manage.py limits``, the OpenAPI text and the README table follow.

A **rate** is a GCRA limiter per user in Valkey (apps.limits.rates): ``per_minute`` sustained, ``burst`` at once.
Every authenticated API request takes one token of ``requests``; an expensive operation also takes one of its own
class. A **quota** caps a stored total per user, enforced by PostgreSQL in the write's own transaction
(apps.limits.quotas). The defaults are meant never to be met by an agent at work and soon by a runaway loop.
"""

from __future__ import annotations

from dataclasses import dataclass

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


@dataclass(frozen=True)
class Rate:
    kind: str  # the metric label and `details.rate` of a 429
    per_minute: int
    burst: int
    covers: str

    @property
    def per_minute_setting(self) -> str:
        return f"RATE_LIMIT_{self.kind.upper()}_PER_MINUTE"

    @property
    def burst_setting(self) -> str:
        return f"RATE_LIMIT_{self.kind.upper()}_BURST"

    @property
    def per_minute_field(self) -> str:
        return f"{self.kind}_per_minute"

    @property
    def burst_field(self) -> str:
        return f"{self.kind}_burst"


@dataclass(frozen=True)
class Quota:
    name: str  # `details.quota` of a 403 quota_exceeded, the metric label, the override field
    default: int
    unit: str  # "count" | "bytes"
    covers: str

    @property
    def setting(self) -> str:
        return f"QUOTA_{self.name.upper()}"


REQUESTS = "requests"
SEARCHES = "searches"
CREATES = "creates"
MEMBERSHIPS = "memberships"
UPLOADS = "uploads"

RATES: dict[str, Rate] = {
    rate.kind: rate
    for rate in (
        Rate(REQUESTS, 1200, 200, "every authenticated API request"),
        Rate(SEARCHES, 300, 60, "memory searches and conversation searches (also counted in requests)"),
        Rate(CREATES, 60, 30, "conversations created: POST /v1/conversations, an append that creates a "
             "conversation or a fork"),
        Rate(MEMBERSHIPS, 60, 30, "membership adds and changes, ownership transfers started"),
        Rate(UPLOADS, 60, 10, "attachment uploads"),
    )
}

MEMORIES = "memories"
MEMORY_BYTES = "memory_bytes"
CONVERSATIONS = "conversations"
ENTRY_BYTES = "entry_bytes"
ATTACHMENTS = "attachments"
ATTACHMENT_BYTES = "attachment_bytes"
MEMBERS_PER_CONVERSATION = "members_per_conversation"

QUOTAS: dict[str, Quota] = {
    quota.name: quota
    for quota in (
        Quota(MEMORIES, 100_000, "count", 'active memories in the user\'s namespace ["user", <id>, ...]'),
        Quota(MEMORY_BYTES, 512 * MiB, "bytes", "stored (encrypted) size of those memories' values"),
        Quota(CONVERSATIONS, 10_000, "count", "live conversations the user owns (forks count against the tree's "
              "owner, whoever forked)"),
        Quota(ENTRY_BYTES, 1 * GiB, "bytes", "stored (encrypted) size of the entries the user wrote, in live "
              "conversations"),
        Quota(ATTACHMENTS, 10_000, "count", "attachments the user uploaded (uploading or ready)"),
        Quota(ATTACHMENT_BYTES, 2 * GiB, "bytes", "size of those attachments"),
        Quota(MEMBERS_PER_CONVERSATION, 100, "count", "members of one conversation (its fork tree); the owner's "
              "limit applies"),
    )
}

# The quotas kept as a running total per user (the table limits_usage). members_per_conversation is counted under
# the conversation's lock instead (it is per conversation, and the memberships table is indexed for it).
COUNTED_QUOTAS = (MEMORIES, MEMORY_BYTES, CONVERSATIONS, ENTRY_BYTES, ATTACHMENTS, ATTACHMENT_BYTES)
