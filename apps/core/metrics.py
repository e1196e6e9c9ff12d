"""Prometheus metrics (D9). One registry per process, or the multiprocess directory when
PROMETHEUS_MULTIPROC_DIR is set (gunicorn with several workers), so /metrics shows the whole server."""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess

REQUEST_LATENCY = Histogram(
    "http_request_duration_seconds",
    "HTTP request latency by route.",
    ["method", "route", "status"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
POLICY_DECISIONS = Counter(
    "policy_decisions_total", "Memory policy evaluations by policy and outcome.", ["policy", "outcome"]
)
POLICY_LATENCY = Histogram(
    "policy_evaluation_seconds",
    "Policy evaluation latency.",
    ["policy"],
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05),
)
INDEXER_BACKLOG = Gauge(
    "memory_indexer_backlog", "Memory versions waiting to be embedded.", multiprocess_mode="livemax"
)
INDEXER_LAG = Gauge(
    "memory_indexer_lag_seconds", "Age of the oldest memory version waiting to be embedded.", multiprocess_mode="livemax"
)
CONVERSATION_INDEXER_BACKLOG = Gauge(
    "conversation_indexer_backlog", "Conversation entries waiting for index text or vectors.", multiprocess_mode="livemax"
)
CONVERSATION_INDEXER_LAG = Gauge(
    "conversation_indexer_lag_seconds", "Age of the oldest conversation entry waiting to be indexed.",
    multiprocess_mode="livemax",
)
# Both indexers (apps.retrieval.indexing), labelled ``indexer`` = memory | conversation.
INDEXER_QUARANTINED = Gauge(
    "indexer_quarantined_rows", "Rows an indexer gave up on after repeated failures (manage.py indexing retry).",
    ["indexer"], multiprocess_mode="livemax",
)
INDEXER_ROW_FAILURES = Counter(
    "indexer_row_failures_total", "Rows that failed to index, by reason (embedding, decrypt, prepare).",
    ["indexer", "reason"],
)
SSE_CONNECTIONS = Gauge("sse_connections", "Open server-sent-event streams.", multiprocess_mode="livesum")
SSE_EVENTS_SENT = Counter("sse_events_sent_total", "Events written to server-sent-event streams.")
SSE_DISCONNECTS = Counter(
    "sse_closed_by_server_total", "Streams the server closed (evicted, connection limit).", ["reason"]
)
UNDECRYPTABLE_VALUES = Counter(
    "undecryptable_values_total",
    "Stored values a read could not decrypt (key id not in MEMORY_ENCRYPTION_KEYS, or a damaged row), by column "
    "(purpose) and the key id the envelope names; the log line 'stored value cannot be decrypted' names the row.",
    ["purpose", "key_id"],
)
SSE_PUBLISH_FAILURES = Counter("sse_publish_failures_total", "Committed events that could not be sent to Redis.")
# Rates and quotas (apps.limits): refusals by kind, and the rate checks that let a request through unlimited because
# Valkey did not answer in time (fail open).
RATE_LIMITED = Counter("rate_limited_total", "Requests refused with 429 rate_limited, by rate kind.", ["kind"])
RATE_LIMIT_UNAVAILABLE = Counter(
    "rate_limit_unavailable_total",
    "Rate checks Valkey did not answer (down, frozen, slow); the process then lets requests through unlimited until "
    "its Redis circuit closes (apps.core.redis_client).",
)
QUOTA_EXCEEDED = Counter("quota_exceeded_total", "Writes refused with 403 quota_exceeded, by quota.", ["quota"])

REDIS_CIRCUIT_OPEN = Gauge(
    "redis_circuit_open", "1 while request paths skip Redis after it failed to answer (apps.core.redis_client).",
    multiprocess_mode="livemax",
)
REDIS_CIRCUIT_TRIPS = Counter("redis_circuit_trips_total", "Times request paths stopped waiting on Redis.")


def observe_request(method: str, route: str, status: int, seconds: float) -> None:
    REQUEST_LATENCY.labels(method, route, str(status)).observe(seconds)


def render() -> bytes:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry)
    from prometheus_client import REGISTRY

    return generate_latest(REGISTRY)
