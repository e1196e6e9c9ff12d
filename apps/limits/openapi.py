"""The rates and quotas in /openapi.json (a SPECTACULAR_SETTINGS postprocessing hook, after
apps.core.openapi.document_errors): 429 ``rate_limited`` with ``Retry-After`` on every operation that takes credentials, and
403 ``quota_exceeded`` on every operation that can add to a stored total."""

from __future__ import annotations

from typing import Any

from apps.core.openapi import ERROR_REF, api_operations

# (method, path) → the quotas the operation can meet.
QUOTA_OPERATIONS: dict[tuple[str, str], tuple[str, ...]] = {
    ("put", "/v1/memories"): ("memories", "memory_bytes"),
    ("post", "/v1/conversations"): ("conversations",),
    ("post", "/v1/conversations/{conversationId}/entries"): ("conversations", "entry_bytes"),
    ("post", "/v1/conversations/{conversationId}/memberships"): ("members_per_conversation",),
    ("post", "/v1/ownership-transfers/{transferId}/accept"): ("conversations",),
    ("post", "/v1/attachments"): ("attachments", "attachment_bytes"),
}

RATE_LIMITED = {
    "description": "rate_limited: over the caller's request rate (details.rate names which; the README's 'Limits "
    "and quotas'). Retry after Retry-After seconds.",
    "headers": {
        "Retry-After": {"description": "Seconds until the request would be taken", "schema": {"type": "integer"}}
    },
    "content": {"application/json": {"schema": ERROR_REF}},
}


def postprocess_schema(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    default_security = result.get("security")
    for path, method, operation in api_operations(result):
        responses = operation.setdefault("responses", {})
        # The event stream is not a REST request: its connections are bounded per user instead
        # (SSE_MAX_CONNECTIONS_PER_USER).
        if any(operation.get("security", default_security) or []) and path != "/v1/events":
            responses.setdefault("429", RATE_LIMITED)
        quotas = QUOTA_OPERATIONS.get((method, path))
        if quotas:
            text = (
                f"quota_exceeded: the write would pass one of the owner's stored-total quotas ({', '.join(quotas)}); "
                "details: {quota, limit, used}"
            )
            existing = responses.get("403")
            if existing is None:
                responses["403"] = {"description": text, "content": {"application/json": {"schema": ERROR_REF}}}
            elif "quota_exceeded" not in existing.get("description", ""):
                existing["description"] = f"{existing.get('description', '')}; or {text}".lstrip("; ")
    return result
