"""LangGraph's long-term memory store (``BaseStore``) on Memory Service's memories."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, Literal, NamedTuple, TypedDict

from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    get_text_at_path,
    tokenize_path,
    validate_op_namespace,
)

from memory_service import _operations as ops
from memory_service._flow import Clients, Flow, UsesClients, arun, run
from memory_service.async_client import AsyncClient
from memory_service.auth import TokenSource
from memory_service.client import Client
from memory_service.errors import NotFoundError
from memory_service.langgraph import _filters
from memory_service.models import Me, Memory, MemorySearchItem, Namespace, SearchQuery, SearchType

# The service's page size for memory search (its maximum `limit`).
SEARCH_PAGE = 100


class StoreIndexConfig(TypedDict, total=False):
    """What to embed for semantic search. The service embeds with its own model, so LangGraph's ``dims`` and
    ``embed`` are not needed (and are ignored when given); ``fields`` are JSON paths into the value, as in
    LangGraph's stores (default ``["$"]``: the whole value as one text)."""

    fields: list[str] | None
    dims: int
    embed: Any


class MultiQuerySearchOp(NamedTuple):
    """Several questions in one search (:meth:`MemoryServiceStore.search_queries`); a batch may hold it among
    LangGraph's own ops. ``queries``: strings, or ``{"text", "purpose"}`` mappings."""

    namespace_prefix: tuple[str, ...]
    queries: tuple[str | SearchQuery, ...]
    filter: dict[str, Any] | None = None
    limit: int = 10
    offset: int = 0
    per_query_limit: int | None = None
    search_type: SearchType | None = None
    refresh_ttl: bool = True


class MatchedSearchItem(SearchItem):
    """A :class:`SearchItem` of a multi-query search: ``matched_queries`` names the questions (their purpose, or
    their text) that found it, in request order."""

    __slots__ = ("matched_queries",)

    def __init__(
        self, namespace: tuple[str, ...], key: str, value: dict[str, Any], created_at: datetime,
        updated_at: datetime, score: float | None = None, matched_queries: Sequence[str] = (),
    ) -> None:
        super().__init__(namespace, key, value, created_at, updated_at, score)
        self.matched_queries = list(matched_queries)

    def dict(self) -> dict:
        result = super().dict()
        result["matched_queries"] = self.matched_queries
        return result


class MemoryServiceStore(BaseStore, UsesClients):
    """A LangGraph ``BaseStore`` whose items are Memory Service memories, with sync and async methods.

    >>> store = MemoryServiceStore("http://localhost:8080", token=OAuthToken.dev_idp("http://localhost:8080", "bob"))
    >>> store.put(("prefs",), "coffee", {"likes": "flat white"})
    >>> store.search((), query="what does bob drink?")

    An item is the memory at ``(namespace_prefix + namespace, key)``; its value is the memory's value, as sent.
    ``namespace_prefix`` defaults to the caller's own ``("user", <user id>)`` (asked of ``/v1/me`` once), where the
    service's default policy lets a user write, so LangGraph code written for its own stores (``("memories",)``,
    ``(user_id, "prefs")``) runs unchanged; items, search results and ``list_namespaces`` show namespaces without
    it. ``namespace_prefix=()`` addresses the service's namespaces as they are. What the service decides stays the
    service's: which namespaces a caller may touch (its policies), the maximum namespace depth (5 by default: 3
    levels under the default prefix), encryption at rest.

    - ``batch``/``abatch`` run their reads concurrently (a thread pool of ``max_concurrency``, or ``asyncio.gather``
      bounded by it), then their writes, results in op order; of several puts to one key in a batch the last wins
      (as in LangGraph's stores).
    - **Indexing**: ``index`` (the store's default) and a put's ``index`` (a list of JSON paths, or ``False``) pick
      the texts exactly as LangGraph's stores do (``get_text_at_path``; a path matching several texts gives fields
      ``path.0``, ``path.1``, ...); they are sent as the memory's ``index``. An item whose index texts are short
      (200 characters in all, the service's default) is found by ``query`` as soon as ``put`` returned, as in
      LangGraph's own stores; a longer one once the service's indexer has embedded it (about a second).
      ``index=False`` on the store disables semantic search (a ``query`` is then ignored, as in a LangGraph store without an index).
    - **Search**: ``query`` ranks by the service's default (meaning and words together where the service has both;
      ``score`` in [0, 1]); without one, items come newest first with ``score`` None. Several questions at once:
      :meth:`search_queries` / :meth:`asearch_queries` (``queries``, ``per_query_limit``, ``search_type``), whose
      items are :class:`MatchedSearchItem` (``matched_queries``). **Value filters are applied here, not by the
      service**: the service can filter only the plaintext attributes its policy derives, because values are
      encrypted at rest. So the store pages through the service's results (100 at a time, up to its maximum offset
      of 10000) and keeps those whose decrypted value passes the filter (``$eq``, ``$ne``, ``$gt``, ``$gte``,
      ``$lt``, ``$lte``, plain equality, nested objects), until ``offset + limit`` have passed. A filter matching few
      of many items costs many pages.
    - **Namespaces**: ``list_namespaces`` with ``"*"`` wildcards, several match conditions and ``max_depth``: what
      the service can match exactly (the literal part of a prefix and a suffix) is sent, and every condition is
      checked again here, so a wildcard never widens the answer.
    - **TTL** (``supports_ttl``): ``ttl`` in minutes becomes the memory's ``ttl_seconds`` (rounded up to a whole
      second). The service counts a TTL from the last write and does not refresh it on reads, so ``refresh_ttl``
      is done here: a read asked to refresh re-writes each returned item that has an expiry with its value, its
      original TTL and the store's ``index`` fields (a new version). Because that is a write, reads do not refresh
      unless asked: ``ttl_config["refresh_on_read"]`` defaults to False here (LangGraph's default is True), and
      ``get(..., refresh_ttl=True)`` asks per call. A refresh is last-writer-wins against a concurrent put of the
      same key.
    - ``created_at`` and ``updated_at`` are both the time of the memory's current version: the service versions
      every write and answers the current version's time only.
    """

    supports_ttl = True

    def __init__(
        self,
        base_url: str | None = None,
        *,
        token: TokenSource | None = None,
        api_key: str | None = None,
        client: Client | None = None,
        async_client: AsyncClient | None = None,
        index: StoreIndexConfig | Literal[False] | None = None,
        ttl: TTLConfig | None = None,
        max_concurrency: int = 16,
        namespace_prefix: Sequence[str] | None = None,
        **client_kwargs: Any,
    ) -> None:
        self._clients = Clients(client, async_client, base_url, token=token, api_key=api_key, **client_kwargs)
        if isinstance(namespace_prefix, str):
            raise TypeError("namespace_prefix is a sequence of strings (e.g. ('user', 'bob')), not one string")
        self._namespace_prefix: Namespace | None = None if namespace_prefix is None else tuple(namespace_prefix)
        if index is False:
            self._fields: list[tuple[str, Any]] | None = None
        else:
            paths = (index or {}).get("fields") or ["$"]
            self._fields = [(path, path if path == "$" else tokenize_path(path)) for path in paths]
        self.ttl_config: TTLConfig = {"refresh_on_read": False, **(ttl or {})}
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        self._max_concurrency = max_concurrency
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    # --- Life cycle -----------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Release the threads and the connections this store made (not a client it was given)."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        super().close()

    # --- Multi-query search ---------------------------------------------------------------------------------------

    def search_queries(
        self, namespace_prefix: tuple[str, ...], /, queries: Sequence[str | SearchQuery], *,
        per_query_limit: int | None = None, search_type: SearchType | None = None,
        filter: dict[str, Any] | None = None, limit: int = 10, offset: int = 0, refresh_ttl: bool | None = None,
    ) -> list[MatchedSearchItem]:
        """Several questions in one search (``["the user's diet", {"text": "travel plans", "purpose": "travel"}]``):
        the service ranks each on its own (``search_type``: ``"auto"``, its default, ``"semantic"`` or
        ``"fulltext"``), keeps ``per_query_limit`` of each (default ``limit``), fuses the lists by reciprocal rank
        and says which questions found each item (``matched_queries``). ``filter``, ``limit``, ``offset`` and
        ``refresh_ttl`` work as in :meth:`search`; a value filter pages through the fused list only."""
        return self.batch([self._multi_query_op(namespace_prefix, queries, per_query_limit, search_type, filter,
                                                limit, offset, refresh_ttl)])[0]

    async def asearch_queries(
        self, namespace_prefix: tuple[str, ...], /, queries: Sequence[str | SearchQuery], *,
        per_query_limit: int | None = None, search_type: SearchType | None = None,
        filter: dict[str, Any] | None = None, limit: int = 10, offset: int = 0, refresh_ttl: bool | None = None,
    ) -> list[MatchedSearchItem]:
        """:meth:`search_queries`, awaited."""
        op = self._multi_query_op(namespace_prefix, queries, per_query_limit, search_type, filter, limit, offset,
                                  refresh_ttl)
        return (await self.abatch([op]))[0]

    def _multi_query_op(
        self, namespace_prefix: tuple[str, ...], queries: Sequence[str | SearchQuery], per_query_limit: int | None,
        search_type: SearchType | None, filter: dict[str, Any] | None, limit: int, offset: int,
        refresh_ttl: bool | None,
    ) -> MultiQuerySearchOp:
        if isinstance(queries, str | Mapping):
            raise TypeError("queries is a list of questions, e.g. ['diet', 'travel plans']")
        if self._fields is None:
            raise ValueError("this store was made with index=False: nothing is searchable by a question")
        refresh = self.ttl_config.get("refresh_on_read", False) if refresh_ttl is None else refresh_ttl
        return MultiQuerySearchOp(tuple(namespace_prefix), tuple(queries), filter, limit, offset, per_query_limit,
                                  search_type, refresh)

    # --- BaseStore ------------------------------------------------------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        reads, puts, size = self._plan(ops)
        results: list[Result] = [None] * size
        client = self._clients.sync
        for stage in (reads, puts):
            flows = [(index, self._flow(op)) for index, op in stage]
            if len(flows) <= 1:
                for index, flow in flows:
                    results[index] = run(client, flow)
                continue
            with self._pool_lock:  # batches from several threads share one pool
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self._max_concurrency, thread_name_prefix="memory-service-store")
                pool = self._pool
            futures = [(index, pool.submit(run, client, flow)) for index, flow in flows]
            for index, future in futures:
                results[index] = future.result()
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        reads, puts, size = self._plan(ops)
        results: list[Result] = [None] * size
        client = self._clients.async_
        gate = asyncio.Semaphore(self._max_concurrency)

        async def one(flow: Flow[Result]) -> Result:
            async with gate:
                return await arun(client, flow)

        for stage in (reads, puts):
            answers = await asyncio.gather(*(one(self._flow(op)) for _, op in stage))
            for (index, _), answer in zip(stage, answers, strict=True):
                results[index] = answer
        return results

    # --- Planning -------------------------------------------------------------------------------------------------

    def _plan(self, ops: Iterable[Op]) -> tuple[list[tuple[int, Op]], list[tuple[int, PutOp]], int]:
        """Reads, then writes (the last put of each key), as LangGraph's stores order a batch: a read in a batch
        sees the store as it was before the batch's writes."""
        reads: list[tuple[int, Op]] = []
        puts: dict[tuple[Namespace, str], tuple[int, PutOp]] = {}
        size = 0
        for index, op in enumerate(ops):
            size += 1
            validate_op_namespace(SearchOp(op.namespace_prefix) if isinstance(op, MultiQuerySearchOp) else op)
            if isinstance(op, PutOp):
                puts[(tuple(op.namespace), op.key)] = (index, op)
            elif isinstance(op, GetOp | SearchOp | ListNamespacesOp | MultiQuerySearchOp):
                if isinstance(op, SearchOp | MultiQuerySearchOp) and op.filter:
                    _filters.check_filter(op.filter)
                reads.append((index, op))
            else:
                raise ValueError(f"unknown operation {type(op).__name__}")
        return reads, list(puts.values()), size

    def _flow(self, op: Op) -> Flow[Any]:
        if isinstance(op, GetOp):
            return self._get(op)
        if isinstance(op, SearchOp | MultiQuerySearchOp):
            return self._search(op)
        if isinstance(op, ListNamespacesOp):
            return self._list_namespaces(op)
        return self._put(op)

    # --- Operations (flows: see memory_service._flow) -------------------------------------------------------------

    def _prefix(self) -> Flow[Namespace]:
        """The namespace prefix of every item: given, or ("user", <the caller's user id>) from /v1/me, once."""
        if self._namespace_prefix is None:
            me: Me = yield ops.me()
            self._namespace_prefix = ("user", me.user_id)
        return self._namespace_prefix

    def _get(self, op: GetOp) -> Flow[Item | None]:
        prefix = yield from self._prefix()
        try:
            memory: Memory = yield ops.get_memory((*prefix, *op.namespace), op.key)
        except NotFoundError:
            return None
        if op.refresh_ttl:
            yield from self._refresh(memory)
        return _item(memory, prefix)

    def _put(self, op: PutOp) -> Flow[None]:
        prefix = yield from self._prefix()
        namespace = (*prefix, *op.namespace)
        if op.value is None:
            yield ops.delete_memory(namespace, op.key)
            return None
        value = dict(op.value)
        yield ops.put_memory(
            namespace, op.key, value, index=self._index(value, op.index), ttl_seconds=_ttl_seconds(op.ttl)
        )
        return None

    def _search(self, op: SearchOp | MultiQuerySearchOp) -> Flow[list[SearchItem]]:
        prefix = yield from self._prefix()
        ranking = _ranking(op) if self._fields is not None else {}
        wanted = max(op.limit, 0)
        found: list[MemorySearchItem] = []
        if wanted == 0:
            return []
        # Without a value filter the service pages for us from `offset`; with one, every item from the start has to
        # be seen here, and `offset` counts items that passed the filter.
        filtering = bool(op.filter)
        skip = max(op.offset, 0) if filtering else 0
        offset = 0 if filtering else max(op.offset, 0)
        while offset <= ops.MEMORY_SEARCH_MAX_OFFSET:
            page_size = SEARCH_PAGE if filtering else min(SEARCH_PAGE, wanted - len(found))
            page: list[MemorySearchItem] = yield ops.search_memories(
                (*prefix, *op.namespace_prefix), **ranking, limit=page_size, offset=offset
            )
            for memory in page:
                if not _filters.matches(memory.value, op.filter):
                    continue
                if skip:
                    skip -= 1
                    continue
                found.append(memory)
                if len(found) == wanted:
                    break
            if len(found) == wanted or len(page) < page_size:
                break
            offset += len(page)
        if op.refresh_ttl:
            for memory in found:
                try:
                    current: Memory = yield ops.get_memory(memory.namespace, memory.key)
                except NotFoundError:
                    continue
                yield from self._refresh(current)
        return [_search_item(memory, _strip(memory.namespace, prefix)) for memory in found]

    def _list_namespaces(self, op: ListNamespacesOp) -> Flow[list[tuple[str, ...]]]:
        store_prefix = yield from self._prefix()
        conditions = list(op.match_conditions or ())
        prefixes = [c.path for c in conditions if c.match_type == "prefix" and c.path]
        suffixes = [c.path for c in conditions if c.match_type == "suffix" and c.path]
        for condition in conditions:
            if condition.match_type not in ("prefix", "suffix"):
                raise ValueError(f"unsupported match type {condition.match_type!r}")
        # Send what the service matches exactly: one prefix's and one suffix's literal part. When that is the whole
        # question (no wildcard, at most one of each), the service can truncate to max_depth too.
        prefix = _filters.literal_head(prefixes[0]) if prefixes else []
        suffix = _filters.literal_tail(suffixes[0]) if suffixes else []
        # Under a store prefix, a suffix as long as a namespace would also match the prefix's labels: checked here.
        exact = (
            len(prefixes) <= 1 and len(suffixes) <= 1
            and all("*" not in path for path in (*prefixes, *suffixes))
            and not (store_prefix and suffixes)
        )
        full_prefix = [*store_prefix, *prefix]
        full_depth = None if op.max_depth is None or not exact else len(store_prefix) + op.max_depth
        listed: list[Namespace] = yield ops.list_namespaces(
            prefix=full_prefix or None, suffix=suffix or None, max_depth=full_depth
        )
        namespaces = [_strip(ns, store_prefix) for ns in listed]
        namespaces = [ns for ns in namespaces if ns]  # the prefix itself holds no item of the store's
        if not exact:
            namespaces = [
                ns for ns in namespaces
                if all(_filters.namespace_matches(ns, c.match_type, c.path) for c in conditions if c.path)
            ]
            if op.max_depth is not None:
                namespaces = list({ns[: op.max_depth] for ns in namespaces})
        ordered = sorted(namespaces)
        start = max(op.offset, 0)
        return ordered[start : start + max(op.limit, 0)]

    def _refresh(self, memory: Memory) -> Flow[None]:
        """Restart the item's TTL: re-write it with its value and the TTL it was written with."""
        if memory.expires_at is None:
            return None
        ttl = max(1, round((memory.expires_at - memory.created_at).total_seconds()))
        yield ops.put_memory(
            memory.namespace, memory.key, memory.value, index=self._index(memory.value, None), ttl_seconds=ttl
        )
        return None

    # --- Indexing -------------------------------------------------------------------------------------------------

    def _index(self, value: Mapping[str, Any], override: Literal[False] | list[str] | None) -> dict[str, str] | None:
        """The memory's ``index`` for LangGraph's indexing of ``value``: the store's fields, a put's own paths, or
        none (``False``, or a store without indexing)."""
        if self._fields is None or override is False:
            return None
        paths = self._fields if override is None else [(p, p if p == "$" else tokenize_path(p)) for p in override]
        index: dict[str, str] = {}
        for path, tokens in paths:
            texts = get_text_at_path(value, tokens)
            for position, text in enumerate(texts):
                index[f"{path}.{position}" if len(texts) > 1 else path] = text
        return index or None


def _item(memory: Memory, prefix: Namespace) -> Item:
    return Item(
        value=memory.value, key=memory.key, namespace=_strip(memory.namespace, prefix), created_at=memory.created_at,
        updated_at=memory.created_at,
    )


def _ranking(op: SearchOp | MultiQuerySearchOp) -> dict[str, Any]:
    """The arguments of ``search_memories`` that rank (none: newest first)."""
    if isinstance(op, MultiQuerySearchOp):
        return {"queries": list(op.queries), "per_query_limit": op.per_query_limit, "search_type": op.search_type}
    return {"query": op.query} if op.query else {}


def _search_item(memory: MemorySearchItem, namespace: Namespace) -> SearchItem:
    """The store's item of a search result (``namespace`` as the store shows it: without the store's prefix)."""
    if memory.matched_queries is not None:
        return MatchedSearchItem(namespace, memory.key, memory.value, memory.created_at, memory.created_at,
                                 memory.score, memory.matched_queries)
    return SearchItem(namespace=namespace, key=memory.key, value=memory.value, created_at=memory.created_at,
                      updated_at=memory.created_at, score=memory.score)


def _strip(namespace: Namespace, prefix: Namespace) -> Namespace:
    """A service namespace as the store shows it: without the store's prefix (every item's starts with it)."""
    return tuple(namespace[len(prefix):]) if tuple(namespace[: len(prefix)]) == tuple(prefix) else tuple(namespace)


def _ttl_seconds(ttl: float | None) -> int | None:
    if ttl is None:
        return None
    if not math.isfinite(ttl) or ttl <= 0:
        raise ValueError(f"ttl is a positive number of minutes or None, not {ttl!r}")
    return max(1, math.ceil(ttl * 60))

