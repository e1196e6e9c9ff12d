"""The background indexing framework: what the memory indexer and the conversation indexer share.

An app subclasses :class:`Indexer` and says only what is pending (SQL over its own table), how to re-read a leased
row, how to turn a row into text (:meth:`Indexer.work`) and where the vectors go (:meth:`Indexer.store`). The
framework does the rest, the same way for both:

* **Leases.** A cycle takes a batch with session-level advisory locks held by the worker's connection
  (apps.retrieval.leases): live workers never embed the same row at once, a slow model never blocks a write on the row,
  and a worker killed mid-batch holds nothing once PostgreSQL sees its connection close, so the next cycle of any
  worker (beat runs one every interval) takes those rows again. More candidates are asked for than the batch, so
  rows other workers hold do not leave this one idle, and the leased rows are re-read (a row finished by another
  worker between the query and the lease is not done twice).
* **Fairness between users** (D11). Candidates are each owner's oldest due rows, taken in turn, in a rotation that
  resumes after the last owner served (``Indexer.claim``), so one user's backlog gets one share of a batch. The
  model gets at most INDEXING_SLICE_BYTES of text per call (a longer text a slice of its chunks at a time); between
  two slices the thread indexes the short texts waiting on every indexer (``Indexer._turns``), and each row is
  stored as soon as its own text is embedded, shortest first: one user's long texts never hold up another user's
  short ones for longer than a slice or two. A cycle starts no batch after INDEXING_CYCLE_MAX_SECONDS.
* **Per-row failures.** A row that cannot be turned into text (:class:`RowError`, e.g. a value the key ring cannot
  decrypt) or whose text fails to embed while the provider embeds other text fine is that row's failure alone: the
  rest of its batch is embedded (the failing rows are found by halving the batch), and the row is retried after
  ``5 s * 2**(failures - 1)`` (at most INDEXING_MAX_BACKOFF_SECONDS). After INDEXING_MAX_ATTEMPTS failures it is
  **quarantined**: never taken again automatically, counted apart from the backlog, logged with its id and reason
  (never its content), and shown by ``manage.py indexing quarantined``; ``manage.py indexing retry`` puts it back.
  So one poison row never blocks the queue, and never loops forever.
* **Provider outages.** When the provider cannot embed even a probe text, nothing is the rows' fault: the cycle stops
  and the rows stay pending, untouched, for the next cycle (beat's, within the interval).
* **Wake-ups.** Writes ask for a run after commit (one Celery task per burst, through a Redis flag); beat's periodic
  run is the safety net and sweeps the whole backlog, whether or not a wake-up got through (Redis down, broker
  lost): the work list is the database, never the queue.
* **Visibility.** Backlog, age of the oldest pending row and quarantined rows go to /readyz and /metrics after
  every cycle; failures are counted per reason.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import redis
from celery import current_app
from django.conf import settings
from django.db import connection
from kombu.exceptions import OperationalError as KombuOperationalError
from prometheus_client import Gauge

from apps.core import metrics, readiness
from apps.core.redis_client import RedisUnavailable, get_client, guarded
from apps.retrieval import leases, vectors
from apps.retrieval.embeddings import EmbeddingError, EmbeddingProvider, get_provider

logger = logging.getLogger(__name__)

# What the provider embeds to tell "this row's text fails" from "the provider fails": plain, short, always valid.
PROBE_TEXT = "indexer probe"
RETRY_BASE_SECONDS = 5

# Appended to the app's UPDATE that stores a row's vectors: a row that indexes has no failure left.
CLEARED_STATE_SQL = "index_failures = 0, index_error = NULL, index_retry_at = NULL"
# Written with every new text of a row (a quarantined text replaced by another deserves a fresh start).
RESET_STATE_SQL = f"{CLEARED_STATE_SQL}, index_quarantined_at = NULL"


def due_sql(alias: str = "t") -> str:
    """The rows a cycle may take now: not quarantined, not waiting out a failure's backoff."""
    return (
        f"{alias}.index_quarantined_at IS NULL "
        f"AND ({alias}.index_retry_at IS NULL OR {alias}.index_retry_at <= now())"
    )


@dataclass
class CycleReport:
    indexed: int = 0  # rows whose vectors are now stored
    failed: int = 0  # rows that failed this cycle (their own failure, or the provider's)
    quarantined: int = 0  # rows quarantined this cycle
    removed: int = 0  # what Indexer.before_cycle cleaned up (the memory indexer: vectors of ended versions)
    stalled: bool = False  # the provider failed as a whole: the cycle stopped, the rows stay pending
    unfinished: bool = False  # INDEXING_CYCLE_MAX_SECONDS ran out with work left (the task asks for another run)


@dataclass
class Work:
    """One leased row, ready to embed: ``texts`` are ``(field, text)`` pairs (blank texts get no vector, long ones are
    chunked to the model's window); ``data`` is whatever :meth:`Indexer.store` needs besides the vectors."""

    id: Any
    texts: list[tuple[Any, str]]
    data: Any = None


# (field, chunk number, vector) of one row.
Vector = tuple[Any, int, list[float]]


class _Candidate(NamedTuple):
    id: Any
    size: int | None  # bytes of text (size_sql)
    position: int  # its owner's place in this rotation
    rank: int  # 1 for its owner's oldest due row, 2 for the next, ...
    arm: int  # which of ``pending()``
    owner: Any


class _StoreFailed(Exception):
    """Carries an exception of ``Indexer.store`` out of ``_embed`` as itself (``__cause__``)."""


class _Here(threading.local):
    """What this thread is doing: the rows it holds per lease kind (a turn between slices must not take them
    again: session locks are re-entrant), and whether it is inside such a turn (turns do not nest)."""

    def __init__(self) -> None:
        self.held: dict[int, set[Any]] = {}
        self.in_turn = False


_here = _Here()


@contextmanager
def _holding(kind: int, ids: list[Any]) -> Iterator[None]:
    """Work on the leased ``ids``; released on the way out, whatever happens."""
    held = _here.held.setdefault(kind, set())
    held.update(ids)
    try:
        yield
    finally:
        held.difference_update(ids)
        leases.release_quietly(kind, ids)


class RowError(Exception):
    """Raised by :meth:`Indexer.work` when this row cannot be turned into text. ``reason`` is a short word
    ("decrypt") and ``details`` small identifiers (a key id); both are logged and stored, so neither may hold
    content."""

    def __init__(self, reason: str, **details: Any) -> None:
        super().__init__(reason)
        self.reason = reason
        self.details = details


@dataclass(frozen=True)
class Status:
    pending: int  # rows waiting (including those backing off after a failure), quarantined ones not counted
    oldest_pending_seconds: float
    quarantined: int


class Indexer(ABC):
    """One background indexer. Subclasses set the class attributes and implement the abstract methods; the table
    named by ``table`` has an ``id`` primary key and the columns of apps.retrieval.models.IndexState."""

    name: ClassVar[str]  # "memory", "conversation": logs, the metrics' ``indexer`` label, ``manage.py indexing``
    lease_kind: ClassVar[int]  # apps.retrieval.leases kind
    table: ClassVar[str]  # the table holding the rows (and their IndexState columns)
    from_sql: ClassVar[str]  # FROM clause of the rows this indexer looks at: ``table`` as ``t``, plus any joins
    # Whose row it is, for fairness (SQL over ``t``): each arm of ``pending()`` needs an index on
    # ``(owner_sql, created_at, id)`` with the arm and ``index_quarantined_at IS NULL`` as its predicate.
    owner_sql: ClassVar[str]
    # What the joins of ``from_sql`` demand of a row, as a condition over ``t`` alone, for the candidate query: kept
    # a subquery evaluated per row, so PostgreSQL walks the owner index in order instead of joining its way there.
    live_sql: ClassVar[str] = "TRUE"
    size_sql: ClassVar[str] = "NULL"  # bytes of text a row brings to a batch (for batch_text_bytes_setting)
    readiness_key: ClassVar[str]  # its entry in /readyz
    backlog_gauge: ClassVar[Gauge]
    lag_gauge: ClassVar[Gauge]
    interval_setting: ClassVar[str]  # beat's period, in seconds
    # The Celery task that runs a cycle (the app's tasks.py defines it under this name). Sent by name, so a write
    # path asks for a run through its indexer without importing the tasks module that imports its services.
    task_name: ClassVar[str]
    batch_size_setting: ClassVar[str]
    batch_text_bytes_setting: ClassVar[str | None] = None  # a batch also ends at this much text (at least one row)

    def __init__(self) -> None:
        # (small lane?, arm) -> the owner the last batch ended with: the next one starts after it.
        self._cursors: dict[tuple[bool, int], Any] = {}

    # --- What an app supplies ----------------------------------------------------------------------------------

    @abstractmethod
    def pending(self) -> list[str]:
        """SQL predicates over ``t`` (and the joins of ``from_sql``): a row needs work when one of them holds. One per
        partial index: the candidate query is a UNION ALL of them, each walked oldest first."""

    def pending_sql(self) -> str:
        """``pending()`` as one SQL condition: any of its predicates."""
        return " OR ".join(f"({arm})" for arm in self.pending())

    @abstractmethod
    def load(self, ids: list[Any]) -> list[tuple]:
        """Re-read the leased ``ids`` that are still pending and due (``due_sql()``); ``row[0]`` is the id."""

    @abstractmethod
    def work(self, row: tuple) -> Work:
        """The texts to embed for one loaded row; raise :class:`RowError` when the row cannot give any."""

    @abstractmethod
    def store(self, done: list[tuple[Work, list[Vector]]], model: str) -> int:
        """Write the vectors of the rows that are still pending (re-checked under a row lock, in one transaction)
        and mark them done (with ``CLEARED_STATE_SQL``); returns how many rows were stored."""

    @abstractmethod
    def check_index(self, dimension: int) -> None:
        """Look up the vector index for ``dimension`` (a warning when missing): ``manage.py migrate`` creates it,
        never a worker, which may run as a database role without DDL rights (apps.retrieval.vectors)."""

    def same_text_sql(self, row: tuple) -> tuple[str, list[Any]]:
        """SQL over ``t`` (with its params) that holds while the row still has the text it had when ``row`` was
        loaded: a failure of that text is not counted against a text that replaced it meanwhile. The default suits
        rows whose text never changes (a new text is a new row)."""
        return "TRUE", []

    def before_cycle(self, batch_size: int) -> int:
        """Work done before embedding (e.g. removing vectors of ended rows); returns how many rows it touched."""
        return 0

    # --- The cycle ---------------------------------------------------------------------------------------------

    def run_cycle(self, batch_size: int | None = None, max_batches: int = 50) -> CycleReport:
        """One run: ``before_cycle``, then lease, embed and store batches until nothing is due, ``max_batches`` ran,
        the provider failed, or INDEXING_CYCLE_MAX_SECONDS passed (``report.unfinished``: the task asks for
        another run, which waits its turn behind the other indexer's)."""
        batch_size = batch_size or getattr(settings, self.batch_size_setting)
        report = CycleReport(removed=self.before_cycle(batch_size))
        provider = get_provider()
        model = vectors.model_tag(provider)
        self.check_index(provider.dimension)
        started = time.monotonic()
        for _ in range(max_batches):
            if time.monotonic() - started > settings.INDEXING_CYCLE_MAX_SECONDS:
                report.unfinished = True
                break
            rows = self.claim(batch_size)
            if not rows:
                break
            with _holding(self.lease_kind, [row[0] for row in rows]):
                self._index_batch(rows, provider, model, report)
            if report.stalled:
                break
        self.update_metrics()
        return report

    def claim(self, batch_size: int, *, small: bool = False) -> list[tuple]:
        """Lease and load up to ``batch_size`` due rows for this worker; the caller must ``release`` them.

        Fair between owners (``owner_sql``): the candidates are each owner's oldest due rows, taken in turn (one of
        each owner, then a second of each, ...), owners in a rotating order that resumes after the last owner this
        indexer served, and no owner brings more than its share. The batch also ends at its text budget
        (``batch_text_bytes_setting``; with ``small``, INDEXING_SLICE_BYTES and only rows that fit one slice).
        Rows this thread already holds (the batch a turn interrupted) are never taken again."""
        slice_bytes = settings.INDEXING_SLICE_BYTES
        candidates = self._candidates(batch_size * 4, max_size=slice_bytes if small else None)
        held = _here.held.get(self.lease_kind, set())
        mine = leases.try_take(self.lease_kind, [c.id for c in candidates if c.id not in held], limit=batch_size)
        if not mine:
            return []
        if small:
            cap: int | None = slice_bytes
        else:
            cap = getattr(settings, self.batch_text_bytes_setting) if self.batch_text_bytes_setting else None
        by_id = {c.id: c for c in candidates}
        if cap is not None:
            # A few rows with 256 KiB of text each take minutes to embed, and the rotation moves on only when a
            # batch ends. A row that does not fit is left for a later batch; smaller ones behind it still go.
            kept, left, total = [], [], 0
            for row_id in mine:
                size = by_id[row_id].size or 0
                if kept and total + size > cap:
                    left.append(row_id)
                    continue
                kept.append(row_id)
                total += size
            if left:
                leases.release_quietly(self.lease_kind, left)
            mine = kept
        self._advance_cursors([by_id[row_id] for row_id in mine], small)
        try:
            rows = self.load(mine)
        except BaseException:
            leases.release_quietly(self.lease_kind, mine)
            raise
        done_meanwhile = set(mine) - {row[0] for row in rows}
        if done_meanwhile:
            leases.release_quietly(self.lease_kind, done_meanwhile)
        return rows

    def release(self, ids: Sequence[Any]) -> None:
        leases.release_quietly(self.lease_kind, ids)

    def _candidates(self, limit: int, *, max_size: int | None = None) -> list[_Candidate]:
        """Up to about ``limit`` due rows in the order a fair batch takes them (see ``claim``)."""
        found: list[_Candidate] = []
        for arm_index, arm in enumerate(self.pending()):
            after = self._cursors.get((max_size is not None, arm_index))
            rows = self._owners_rows(arm, arm_index, limit, max_size, after=after)
            if after is not None and len({row.position for row in rows}) < limit:
                # The rotation wraps around: the owners up to the cursor come after those beyond it.
                offset = max((row.position for row in rows), default=0)
                more = self._owners_rows(arm, arm_index, limit, max_size, upto=after)
                rows += [row._replace(position=row.position + offset) for row in more]
            found += rows
        found.sort(key=lambda row: (row.rank, row.position, row.arm))
        return found

    def _owners_rows(
        self, arm: str, arm_index: int, limit: int, max_size: int | None, *, after: Any = None, upto: Any = None
    ) -> list[_Candidate]:
        """One pass of the rotation: the owners with due rows of ``arm`` in owner order (beyond ``after``, or up to
        ``upto``), at most ``limit`` of them, found by a walk of the arm's ``(owner, created_at, id)`` index that
        jumps from one owner to the next (a recursive CTE: the cost grows with the owners, not the backlog); then
        each one's oldest due rows, at most ``limit`` / owners each."""
        owner = self.owner_sql
        where = f"({arm}) AND {due_sql()} AND {self.live_sql}"
        table = f"{self.table} t"
        bound, params = "", {"limit": limit}
        if after is not None:
            bound, params["bound"] = f"AND {owner} > %(bound)s", after
        elif upto is not None:
            bound, params["bound"] = f"AND {owner} <= %(bound)s", upto
        size_filter = ""
        if max_size is not None:
            size_filter, params["max_size"] = f"AND {self.size_sql} <= %(max_size)s", max_size
        sql = f"""
            WITH RECURSIVE owners(owner, n) AS (
                (SELECT {owner}, 1 FROM {table} WHERE {where} {bound} ORDER BY {owner} LIMIT 1)
                UNION ALL
                SELECT (SELECT {owner} FROM {table} WHERE {where} {bound} AND {owner} > owners.owner
                        ORDER BY {owner} LIMIT 1), owners.n + 1
                FROM owners WHERE owners.owner IS NOT NULL AND owners.n < %(limit)s
            ), found AS MATERIALIZED (SELECT owner, n FROM owners WHERE owner IS NOT NULL)
            SELECT candidate.id, candidate.size, found.n, candidate.rank, found.owner
            FROM found CROSS JOIN LATERAL (
                SELECT t.id, {self.size_sql} AS size, row_number() OVER (ORDER BY t.created_at, t.id) AS rank
                FROM {table} WHERE {where} {size_filter} AND {owner} = found.owner
                ORDER BY t.created_at, t.id
                LIMIT (SELECT greatest(1, ceil(%(limit)s::numeric / count(*)))::int FROM found)
            ) AS candidate
        """  # noqa: S608 - code's SQL
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return [
                _Candidate(row_id, size, int(position), int(rank), arm_index, owner_value)
                for row_id, size, position, rank, owner_value in cursor.fetchall()
            ]

    def _advance_cursors(self, taken: list[_Candidate], small: bool) -> None:
        """The next batch starts after the last owner (in this rotation's order) this one took rows of."""
        last: dict[int, _Candidate] = {}
        for candidate in taken:
            if candidate.arm not in last or candidate.position > last[candidate.arm].position:
                last[candidate.arm] = candidate
        for arm, candidate in last.items():
            self._cursors[(small, arm)] = candidate.owner

    def _index_batch(self, rows: list[tuple], provider: EmbeddingProvider, model: str, report: CycleReport) -> None:
        started = time.perf_counter()
        works: list[Work] = []
        loaded = {row[0]: row for row in rows}
        for row in rows:
            try:
                works.append(self.work(row))
            except RowError as exc:
                self._row_failed(row, exc.reason, exc.details, report)
            except Exception as exc:  # a bug in deriving one row's text must not stall the queue either
                self._row_failed(row, "prepare", {"error": type(exc).__name__}, report)
        if not works:
            return
        failed: list[tuple[Work, Exception]] = []
        between = self._turns(provider, model)
        stored: list[tuple[Work, list[Vector]]] = []

        def store(finished: list[tuple[Work, list[Vector]]]) -> None:
            # Each row as soon as its own text is embedded: a short row never waits for a long one of its batch.
            try:
                report.indexed += self.store(finished, model)
            except Exception as exc:
                raise _StoreFailed from exc
            stored.extend(finished)

        try:
            _embed(provider, works, between, store)
        except _StoreFailed as exc:
            raise exc.__cause__ from None  # the database's failure, not the provider's nor a row's
        except Exception as exc:
            left = [work for work in works if work.id not in {done.id for done, _vectors in stored}]
            if not _provider_works(provider):
                logger.warning(
                    "embedding provider failed; the cycle stops and the rows stay pending",
                    extra={"indexer": self.name, "rows": len(left)}, exc_info=True,
                )  # fmt: skip
                report.failed += len(left)
                report.stalled = True
                if isinstance(exc, EmbeddingError):
                    return
                raise
            done, failed = _isolate(provider, left, exc, between)
            if done:
                store(done)
        for work, exc in failed:
            self._row_failed(loaded[work.id], "embedding", {"error": type(exc).__name__}, report)
        logger.info(
            "rows indexed",
            extra={
                "indexer": self.name, "rows": len(stored), "failed": len(rows) - len(stored),
                "vectors": sum(len(vectors_of_row) for _work, vectors_of_row in stored),
                "seconds": round(time.perf_counter() - started, 3),
            },
        )  # fmt: skip

    def _turns(self, provider: EmbeddingProvider, model: str) -> Callable[[], None]:
        """What runs between two slices of a batch's text: a turn for every indexer's small rows (this one's
        included), so a batch of long texts never holds up anyone's short ones, on either indexer, for longer than
        a slice takes; the turns' rows are leased like any batch, and their rows leave the rotation at the owners
        they took."""

        def between() -> None:
            if _here.in_turn:
                return
            _here.in_turn = True
            try:
                indexers = dict(_registry)
                indexers.setdefault(self.name, self)
                for indexer in indexers.values():
                    indexer._small_turn(provider, model)
            finally:
                _here.in_turn = False

        return between

    def _small_turn(self, provider: EmbeddingProvider, model: str) -> None:
        try:
            rows = self.claim(getattr(settings, self.batch_size_setting), small=True)
            if rows:
                with _holding(self.lease_kind, [row[0] for row in rows]):
                    self._index_batch(rows, provider, model, CycleReport())
        except Exception:
            # The batch the turn interrupted goes on; these rows stay pending for the next cycle.
            logger.warning("a turn for small texts failed", extra={"indexer": self.name}, exc_info=True)

    def _row_failed(self, row: tuple, reason: str, details: dict[str, Any], report: CycleReport) -> None:
        """Count one failure of this row's text (``row`` as loaded): back off, or quarantine it at
        INDEXING_MAX_ATTEMPTS. Nothing is counted when the row is no longer pending or its text was replaced since
        it was loaded: the failure was the old text's, and the new one deserves its own attempts."""
        row_id = row[0]
        described = reason + "".join(f" {key}={value}" for key, value in details.items())
        same_text, same_text_params = self.same_text_sql(row)
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {self.table} t SET index_failures = t.index_failures + 1, index_error = %s, "  # noqa: S608
                "index_retry_at = now() + make_interval(secs => least(%s, %s * power(2, t.index_failures))), "
                "index_quarantined_at = CASE WHEN t.index_failures + 1 >= %s THEN now() END "
                f"WHERE t.id = %s AND ({self.pending_sql()}) AND ({same_text}) "
                "RETURNING t.index_failures, t.index_quarantined_at IS NOT NULL",
                [described, settings.INDEXING_MAX_BACKOFF_SECONDS, RETRY_BASE_SECONDS,
                 settings.INDEXING_MAX_ATTEMPTS, row_id, *same_text_params],
            )  # fmt: skip
            counted = cursor.fetchone()
        report.failed += 1
        if counted is None:
            logger.info("row failed to index, but its text changed meanwhile; nothing counted",
                        extra={"indexer": self.name, "row_id": str(row_id), "reason": reason})
            return
        failures, quarantined = counted
        metrics.INDEXER_ROW_FAILURES.labels(self.name, reason).inc()
        # Ids, the reason and identifiers such as a key id: never the row's text.
        log = {"indexer": self.name, "row_id": str(row_id), "reason": reason, "failures": failures, **details}
        if quarantined:
            report.quarantined += 1
            logger.error("row quarantined after repeated failures; `manage.py indexing retry` retries it", extra=log)
        else:
            logger.warning("row failed to index; retrying it after a backoff", extra=log)

    # --- Backlog, readiness, metrics ---------------------------------------------------------------------------

    def status(self) -> Status:
        quarantined = "t.index_quarantined_at IS NOT NULL"
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT count(*) FILTER (WHERE NOT ({quarantined})), "  # noqa: S608 - code's SQL
                f"coalesce(extract(epoch FROM now() - min(t.created_at) FILTER (WHERE NOT ({quarantined}))), 0), "
                f"count(*) FILTER (WHERE {quarantined}) "
                f"FROM {self.from_sql} WHERE {self.pending_sql()}"
            )
            pending, lag, quarantined_count = cursor.fetchone()
        return Status(int(pending), float(lag), int(quarantined_count))

    def update_metrics(self) -> Status:
        status = self.status()
        self.backlog_gauge.set(status.pending)
        self.lag_gauge.set(status.oldest_pending_seconds)
        metrics.INDEXER_QUARANTINED.labels(self.name).set(status.quarantined)
        return status

    def readiness_info(self) -> dict:
        status = self.update_metrics()
        return {
            "backlog": status.pending,
            "oldest_pending_seconds": round(status.oldest_pending_seconds, 3),
            "quarantined": status.quarantined,
        }

    # --- Quarantine (operators) --------------------------------------------------------------------------------

    def quarantined_rows(self, limit: int = 100) -> list[dict]:
        """The quarantined rows, oldest first: id, failures, reason, since when. No content."""
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT t.id, t.index_failures, t.index_error, t.index_quarantined_at FROM {self.from_sql} "  # noqa: S608
                f"WHERE t.index_quarantined_at IS NOT NULL AND ({self.pending_sql()}) ORDER BY t.index_quarantined_at, t.id LIMIT %s",
                [limit],
            )
            return [
                {"id": row_id, "failures": failures, "error": error, "quarantined_at": since}
                for row_id, failures, error, since in cursor.fetchall()
            ]

    def retry_quarantined(self, ids: Sequence[Any] | None = None) -> int:
        """Put quarantined rows (all, or those of ``ids``) back in the queue with no failure counted."""
        where = "index_quarantined_at IS NOT NULL" + (" AND id = ANY(%s)" if ids is not None else "")
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {self.table} SET {RESET_STATE_SQL} WHERE {where}",  # noqa: S608 - code's SQL
                [list(ids)] if ids is not None else [],
            )
            count = cursor.rowcount
        self.update_metrics()
        return count

    # --- Wake-ups ----------------------------------------------------------------------------------------------

    def _requested_key(self) -> str:
        # Per database, so services (and test runs) sharing one Redis do not suppress each other's requests.
        return f"memory-service:{connection.settings_dict['NAME']}:{self.name}-indexing-requested"

    def request_run(self) -> None:
        """Ask a worker to run this indexer's task (``task_name``) soon, publishing at most one task while one is
        already waiting: the flag is set with NX, so a burst of writes publishes one task, not one per write (a
        publish costs more than the write's own SQL). The task clears the flag before it leases rows, so a write
        committed after that asks again; the TTL only guards against a task lost with its broker."""
        interval = getattr(settings, self.interval_setting)
        # The broker is Redis too: while either does not answer, a write does not wait on it (redis_client.guarded);
        # beat's periodic run indexes the row. No publish retries either, for the same reason.
        with guarded(KombuOperationalError):
            if get_client().set(self._requested_key(), "1", nx=True, ex=interval * 2):
                current_app.send_task(self.task_name, retry=False)

    def request_run_quietly(self) -> None:
        """``request_run`` for ``transaction.on_commit`` hooks: a broker hiccup must not fail a committed write
        (beat's periodic run picks the row up)."""
        try:
            self.request_run()
        except RedisUnavailable:
            pass  # said once, when the circuit opened (apps.core.redis_client)
        except Exception:
            logger.warning("could not request an indexer run; the periodic run will pick the write up",
                           extra={"indexer": self.name})

    def run_requested(self) -> CycleReport:
        """The Celery task's body: clear the request, then run a cycle. A Redis that is down right then does not
        stop the cycle: the database holds the work, and leaving the flag only delays wake-ups until it expires."""
        try:
            get_client().delete(self._requested_key())
        except redis.RedisError:
            logger.warning("could not clear the indexer's wake-up flag", extra={"indexer": self.name})
        report = self.run_cycle()
        if report.unfinished:
            self.request_run_quietly()  # queued behind the tasks that waited meanwhile (the other indexer's)
        return report


def _embed(
    provider: EmbeddingProvider,
    works: list[Work],
    between: Callable[[], None] | None = None,
    finished: Callable[[list[tuple[Work, list[Vector]]]], None] | None = None,
) -> list[tuple[Work, list[Vector]]]:
    """Every text of ``works`` chunked and embedded, handed back per row, in slices of about INDEXING_SLICE_BYTES
    of text, ``between`` running between two slices and ``finished`` getting the rows whose texts are all embedded
    after each slice. Shortest rows first, so a batch's short rows are done with its first slice. A text longer than
    a slice is cut into the model's chunks first (``provider.chunk``), which are then embedded whole, a slice of them
    at a time (the vectors are those of embedding the text in one call); shorter texts go to ``embed_chunked`` as
    they are, many to a call."""
    budget = max(1, settings.INDEXING_SLICE_BYTES)
    order = sorted(works, key=lambda work: sum(len(text) for _name, text in work.texts))
    # One unit per text that fits a slice, one per chunk of a longer one: (row id, field, text, is a chunk).
    units: list[tuple[Any, Any, str, bool]] = []
    for work in order:
        for name, text in work.texts:
            if not text.strip():
                continue
            if len(text) <= budget:
                units.append((work.id, name, text, False))
            else:
                units.extend((work.id, name, piece, True) for piece in provider.chunk(text))
    slices: list[list[tuple[Any, Any, str, bool]]] = []
    size = budget
    for unit in units:
        if size + len(unit[2]) > budget:
            slices.append([])
            size = 0
        slices[-1].append(unit)
        size += len(unit[2])
    last_slice = {work.id: 0 for work in works}  # rows with nothing to embed are done with the first slice
    for number, part in enumerate(slices):
        for unit in part:
            last_slice[unit[0]] = number
    by_row: dict[Any, dict[Any, list[list[float]]]] = {work.id: {} for work in works}

    def result(work: Work) -> tuple[Work, list[Vector]]:
        return work, [(name, number, vector) for name, of_field in by_row[work.id].items()
                      for number, vector in enumerate(of_field)]  # fmt: skip

    for number, part in enumerate(slices or [[]]):
        if number and between is not None:
            between()
        texts = [unit[2] for unit in part if not unit[3]]
        chunks = [unit[2] for unit in part if unit[3]]
        of_texts = iter(provider.embed_chunked(texts) if texts else [])
        of_chunks = iter(provider.embed_documents(chunks) if chunks else [])
        for unit in part:  # in text order: a long text's chunks stay in order across slices
            by_row[unit[0]].setdefault(unit[1], []).extend([next(of_chunks)] if unit[3] else next(of_texts))
        if finished is not None:
            done = [result(work) for work in order if last_slice[work.id] == number]
            if done:
                finished(done)
    return [result(work) for work in works]


def _provider_works(provider: EmbeddingProvider) -> bool:
    try:
        _embed(provider, [Work(None, [(None, PROBE_TEXT)])])
    except Exception:
        return False
    return True


def _isolate(
    provider: EmbeddingProvider, works: list[Work], error: Exception, between: Callable[[], None] | None = None
) -> tuple[list[tuple[Work, list[Vector]]], list[tuple[Work, Exception]]]:
    """``works`` failed together (with ``error``) while the provider embeds other text: embed them by halves to find
    the rows that fail on their own (about 2 log2(n) calls for one such row in n)."""
    if len(works) == 1:
        return [], [(works[0], error)]
    done: list[tuple[Work, list[Vector]]] = []
    failed: list[tuple[Work, Exception]] = []
    middle = len(works) // 2
    for half in (works[:middle], works[middle:]):
        try:
            done += _embed(provider, half, between)
        except Exception as exc:
            more_done, more_failed = _isolate(provider, half, exc, between)
            done += more_done
            failed += more_failed
    return done, failed


# --- Registry (AppConfig.ready registers each app's indexer) ---------------------------------------------------

_registry: dict[str, Indexer] = {}


def register(indexer: Indexer) -> None:
    """Make ``indexer`` known to ``manage.py indexing`` and show its backlog in /readyz."""
    _registry[indexer.name] = indexer
    readiness.register_info(indexer.readiness_key, indexer.readiness_info)


def registered() -> dict[str, Indexer]:
    return dict(_registry)
