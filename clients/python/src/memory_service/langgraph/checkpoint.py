"""LangGraph's checkpointer (``BaseCheckpointSaver``) on conversation context entries."""

from __future__ import annotations

import base64
import hashlib
import json
import random
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    PendingWrite,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

try:
    from langgraph.checkpoint.base import writes_sort_key
except ImportError:  # an older langgraph-checkpoint without it: the same order, spelled out

    def writes_sort_key(task_path: str, task_id: str = "", idx: int = 0) -> tuple[str, str, int]:
        return (task_path, task_id, idx)


from memory_service import _operations as ops
from memory_service._flow import (
    Clients,
    Flow,
    Threads,
    UsesClients,
    arun,
    conversation_entries,
    delete_conversation,
    every_page,
    run,
)
from memory_service.async_client import AsyncClient
from memory_service.auth import TokenSource
from memory_service.client import Client
from memory_service.errors import NotFoundError
from memory_service.models import Entry, Page

# The contentType of the saver's context entries: other context entries of the same client are left alone.
CONTENT_TYPE = "langgraph-checkpoint"
DEFAULT_MAX_ENTRY_BYTES = 200_000  # under the service's 256 KiB per entry (CONVERSATION_ENTRY_MAX_CONTENT_BYTES)
MAX_ITEMS_PER_ENTRY = 1000  # the service's CONVERSATION_ENTRY_MAX_ITEMS
MAX_PAGE = 200  # the service's largest page of entries
# The newest page a latest-checkpoint read asks for first: the checkpoint put last is usually the last entry or
# close to it (a page twice as long follows when it is not). Each entry is a whole state, so a shorter first page
# is a cheaper read (measured: 1 entry 11.6 ms, 6 entries 14.0 ms on the loaded benchmark machine).
TAIL_PAGE = 2

# Inside the saver, `list` is its method: signatures there use these names for the builtin's types.
Records = list[dict[str, Any]]
Tuples = list[CheckpointTuple]
ThreadIds = list[tuple[str, str | None]]
Entries = list[Entry]


class MemoryServiceCheckpointSaver(BaseCheckpointSaver[str], UsesClients):
    """A LangGraph checkpointer (sync and async) that keeps each thread in a Memory Service conversation.

    >>> saver = MemoryServiceCheckpointSaver("http://localhost:8080", token=..., api_key=...)
    >>> graph = builder.compile(checkpointer=saver)
    >>> graph.invoke(inputs, {"configurable": {"thread_id": "chat-42"}})

    - **Where**: one conversation per thread and user (:func:`conversation_id_for`: the thread id when it is a UUID,
      else derived from the caller's user id and the thread id, so two users' threads never meet), created by the
      first checkpoint and owned by the token's user. A conversation that exists but is not the caller's (another
      user created it first, or shared it) is a :class:`~memory_service.ConversationTakenError`: the saver neither
      reads nor writes it unless ``allow_shared=True``. Checkpoints, their channel values and pending writes are
      entries on the conversation's ``context`` channel (contentType ``langgraph-checkpoint``), which the service
      encrypts at rest and shows only to the API-key client that wrote them (D5): **an API key is required**, and
      only that client's savers see the checkpoints. The ``history`` channel stays free for the chat itself (e.g.
      :class:`~memory_service.langchain.MemoryServiceChatMessageHistory` on the same thread id).
    - **What**: a put is one entry (a state too big for one entry spans several, the checkpoint last): the
      checkpoint, its metadata and the value of every channel it has (not only those that changed), so a
      checkpoint is read without the entries before it. Pending writes are one entry per ``put_writes``. Every
      entry of a checkpoint carries the entry key of that checkpoint (``lgcp-`` and a hash of its namespace and
      id), all serialized by the saver's ``serde`` (LangGraph's ``JsonPlusSerializer`` by default).
    - **Cost independent of the thread's length**: ``get_tuple`` of a checkpoint id is one request (the entries of
      its key); the latest checkpoint and ``list(limit=k)`` read the thread from its end (``tail``, then
      ``beforeCursor``) only as far back as they need; ``put`` is one append. Only ``list`` without a limit (or
      with ``before``, or a metadata ``filter`` few checkpoints match) reads further back, as far as it must.
      "Latest" is the checkpoint put last.
    - ``list`` filters by ``checkpoint_ns`` (when the config names one), ``checkpoint_id``, metadata ``filter``
      (equality per key), ``before`` and ``limit``; ``list(None)`` walks every conversation of the caller's.
    - ``delete_thread`` deletes the conversation (with its history). The service keeps deleted conversations for
      audit and never reuses their ids, so a deleted thread id cannot hold checkpoints again (a put raises
      :class:`~memory_service.NotFoundError`). ``copy_thread`` re-appends every entry of one thread to another.
      ``delete_for_runs`` and ``prune`` are not offered: entries are append-only (no single entry can be deleted).
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        token: TokenSource | None = None,
        api_key: str | None = None,
        client: Client | None = None,
        async_client: AsyncClient | None = None,
        serde: SerializerProtocol | None = None,
        max_entry_bytes: int = DEFAULT_MAX_ENTRY_BYTES,
        allow_shared: bool = False,
        **client_kwargs: Any,
    ) -> None:
        super().__init__(serde=serde)
        given = [c for c in (client, async_client) if c is not None]
        if not (api_key or any(c._config.api_key for c in given)):
            raise ValueError(
                "the checkpointer writes context entries, which belong to an API-key client: give api_key= "
                "(or clients made with one)"
            )
        self._clients = Clients(client, async_client, base_url, token=token, api_key=api_key, **client_kwargs)
        if max_entry_bytes < 4096:
            raise ValueError("max_entry_bytes must be at least 4096")
        self._max_entry_bytes = max_entry_bytes
        self._threads = Threads(allow_shared=allow_shared)

    # --- Sync -----------------------------------------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return run(self._clients.sync, self._get_tuple(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        client = self._clients.sync
        remaining = limit
        for thread_id, conversation_id in run(client, self._threads_to_list(config)):
            if remaining is not None and remaining <= 0:
                return
            found = run(client, self._list_thread(thread_id, conversation_id, config, filter, before, remaining))
            yield from found
            if remaining is not None:
                remaining -= len(found)

    def put(
        self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return run(self._clients.sync, self._put(config, checkpoint, metadata, new_versions))

    def put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = "",
    ) -> None:
        run(self._clients.sync, self._put_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        run(self._clients.sync, self._delete_thread(str(thread_id)))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        run(self._clients.sync, self._copy_thread(source_thread_id, target_thread_id))

    # --- Async ----------------------------------------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await arun(self._clients.async_, self._get_tuple(config))

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        client = self._clients.async_
        remaining = limit
        for thread_id, conversation_id in await arun(client, self._threads_to_list(config)):
            if remaining is not None and remaining <= 0:
                return
            found = await arun(
                client, self._list_thread(thread_id, conversation_id, config, filter, before, remaining)
            )
            for item in found:
                yield item
            if remaining is not None:
                remaining -= len(found)

    async def aput(
        self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await arun(self._clients.async_, self._put(config, checkpoint, metadata, new_versions))

    async def aput_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = "",
    ) -> None:
        await arun(self._clients.async_, self._put_writes(config, writes, task_id, task_path))

    async def adelete_thread(self, thread_id: str) -> None:
        await arun(self._clients.async_, self._delete_thread(str(thread_id)))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await arun(self._clients.async_, self._copy_thread(source_thread_id, target_thread_id))

    def get_next_version(self, current: str | None, channel: None) -> str:
        # As LangGraph's own savers: a zero-padded counter (sortable as text) plus a random tie-breaker.
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(str(current).split(".")[0])
        return f"{number + 1:032}.{random.random():016}"  # noqa: S311 - a tie-breaker, not a secret

    # --- Flows (see memory_service._flow) -------------------------------------------------------------------------

    def _put(
        self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> Flow[RunnableConfig]:
        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        ns = configurable.get("checkpoint_ns", "")
        checkpoint_id = checkpoint["id"]
        stripped: dict[str, Any] = dict(checkpoint)
        values: dict[str, Any] = stripped.pop("channel_values", {}) or {}
        records: list[dict[str, Any]] = []
        inline: dict[str, str] = {}
        # Every channel of the checkpoint travels with it, so reading it never needs an earlier put. A channel
        # with a version but no value is one that was emptied (when it changed now) or one the caller left out of
        # channel_values: that last one is found in an earlier put (_find_blobs).
        for channel, version in checkpoint.get("channel_versions", {}).items():
            if channel in values:
                kind, data = self.serde.dumps_typed(values[channel])
            elif channel in new_versions:
                kind, data = "empty", b""
            else:
                continue
            inline[channel] = str(version)
            records.append({"kind": "blob", "ns": ns, "channel": channel, "version": str(version),
                            "checkpoint": checkpoint_id, **_payload(kind, data)})
        kind, data = self.serde.dumps_typed({"checkpoint": stripped,
                                             "metadata": get_checkpoint_metadata(config, metadata)})
        records.append({"kind": "checkpoint", "ns": ns, "id": checkpoint_id, "thread": thread_id,
                        "parent": configurable.get("checkpoint_id"), "blobs": inline, **_payload(kind, data)})
        conversation_id = yield from self._threads.writable(thread_id)
        yield from self._append(thread_id, conversation_id, records, entry_key(ns, checkpoint_id))
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}}

    def _put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str,
    ) -> Flow[None]:
        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        ns = configurable.get("checkpoint_ns", "")
        checkpoint_id = configurable["checkpoint_id"]
        records = []
        for idx, (channel, value) in enumerate(writes):
            kind, data = self.serde.dumps_typed(value)
            records.append({"kind": "write", "ns": ns, "checkpoint": checkpoint_id, "task": task_id,
                            "path": task_path, "idx": WRITES_IDX_MAP.get(channel, idx), "channel": channel,
                            **_payload(kind, data)})
        if records:
            conversation_id = yield from self._threads.writable(thread_id)
            yield from self._append(thread_id, conversation_id, records, entry_key(ns, checkpoint_id))
        return None

    def _get_tuple(self, config: RunnableConfig) -> Flow[CheckpointTuple | None]:
        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        ns = configurable.get("checkpoint_ns", "")
        conversation_id = yield from self._threads.readable(thread_id)
        if conversation_id is None:
            return None
        checkpoint_id = get_checkpoint_id(config)
        if checkpoint_id:
            log = yield from self._keyed(conversation_id, ns, checkpoint_id)
            if (ns, checkpoint_id) not in log.checkpoints:
                return None
        else:
            log, whole = yield from self._walk_back(
                conversation_id, TAIL_PAGE, lambda log: _newest(log, ns, whole=False) is not None
            )
            found = _newest(log, ns, whole=whole)
            if found is None:
                return None
            checkpoint_id = found
        return (yield from self._tuple(conversation_id, log, thread_id, ns, checkpoint_id))

    def _list_thread(
        self, thread_id: str, conversation_id: str | None, config: RunnableConfig | None,
        filter: dict[str, Any] | None, before: RunnableConfig | None, limit: int | None,
    ) -> Flow[Tuples]:
        if conversation_id is None:
            conversation_id = yield from self._threads.readable(thread_id)
            if conversation_id is None:
                return []
        configurable = (config or {}).get("configurable", {})
        ns_wanted = configurable.get("checkpoint_ns")
        id_wanted = configurable.get("checkpoint_id")
        before_id = get_checkpoint_id(before) if before else None

        def wanted(log: _Log, key: tuple[str, str]) -> bool:
            ns, checkpoint_id = key
            if (ns_wanted is not None and ns != ns_wanted) or (id_wanted and checkpoint_id != id_wanted):
                return False
            if before_id and checkpoint_id >= before_id:
                return False
            if filter:
                metadata = self._decode(log.checkpoints[key].record)["metadata"]
                return all(metadata.get(name) == value for name, value in filter.items())
            return True

        if id_wanted:  # one checkpoint: its key's entries, wherever it is
            namespaces = [ns_wanted] if ns_wanted is not None else [""]
            found: list[CheckpointTuple] = []
            for ns in namespaces:
                log = yield from self._keyed(conversation_id, ns, id_wanted)
                if (ns, id_wanted) in log.checkpoints and wanted(log, (ns, id_wanted)):
                    found.append((yield from self._tuple(conversation_id, log, thread_id, ns, id_wanted)))
            return found[:limit] if limit is not None else found
        first_page = MAX_PAGE if limit is None else min(MAX_PAGE, 2 * limit + TAIL_PAGE)
        log, whole = yield from self._walk_back(
            conversation_id, first_page,
            lambda log: limit is not None and len(_newest_first(log, wanted, limit, whole=False)) >= limit,
        )
        found = []
        for ns, checkpoint_id in _newest_first(log, wanted, limit, whole=whole):
            stored_thread = log.thread_ids.get((ns, checkpoint_id), thread_id)
            found.append((yield from self._tuple(conversation_id, log, stored_thread, ns, checkpoint_id)))
        return found

    def _copy_thread(self, source_thread_id: str, target_thread_id: str) -> Flow[None]:
        source = yield from self._threads.readable(str(source_thread_id))
        if source is None:
            return None
        entries = yield from self._entries(source)
        if not entries:
            return None
        target = yield from self._threads.writable(str(target_thread_id))
        for entry in entries:
            content = [
                {**item, "thread": str(target_thread_id)} if item.get("kind") == "checkpoint" else item
                for item in entry.content
            ]
            yield from self._append_entry(str(target_thread_id), target, content, entry.key)
        return None

    def _delete_thread(self, thread_id: str) -> Flow[None]:
        conversation_id = yield from self._threads.readable(thread_id)
        if conversation_id is not None:
            yield from delete_conversation(conversation_id)
            self._threads.forget(conversation_id)
        return None

    def _threads_to_list(self, config: RunnableConfig | None) -> Flow[ThreadIds]:
        """The (thread id, conversation id or None: not looked up yet) pairs ``list`` walks: the config's thread,
        or (``list(None)``) every conversation of the caller's (a conversation's checkpoints name their thread)."""
        if config is not None:
            return [(str(config["configurable"]["thread_id"]), None)]
        yield from self._threads.user_id()
        conversations = yield from every_page(
            lambda cursor: ops.list_conversations(mode="all", limit=200, after_cursor=cursor)
        )
        return [(conversation.id, conversation.id) for conversation in conversations if self._threads.mine(conversation)]

    # --- Reading and writing the log ------------------------------------------------------------------------------

    def _own(self, entries: Entries) -> Entries:
        return [entry for entry in entries if entry.content_type == CONTENT_TYPE]

    def _entries(self, conversation_id: str) -> Flow[Entries]:
        """Every entry of the saver's in the conversation, oldest first, every page."""
        entries = yield from conversation_entries(conversation_id, "context")
        return self._own(entries or [])

    def _keyed(self, conversation_id: str, ns: str, checkpoint_id: str) -> Flow[_Log]:
        """The log of one checkpoint: the entries of its key (its put, its pending writes)."""
        key = entry_key(ns, checkpoint_id)
        entries = yield from every_page(lambda cursor: ops.list_entries(
            conversation_id, channel="context", key=key, limit=MAX_PAGE, after_cursor=cursor
        ))
        return _Log.build(_records(self._own(entries)))

    def _walk_back(
        self, conversation_id: str, first_page: int, enough: Callable[[_Log], bool],
    ) -> Flow[tuple[_Log, bool]]:
        """The log of the thread's newest entries, read from the end (``tail``, then ``beforeCursor``: the first
        ``first_page`` entries, then pages doubling up to the service's largest) until ``enough`` says the log holds
        what the reader needs, or the thread's first entry; and whether it is the whole thread."""
        entries: Entries = []
        cursor: str | None = None
        size = first_page
        while True:
            page: Page[Entry] = yield ops.list_entries(
                conversation_id, channel="context", limit=size, tail=cursor is None, before_cursor=cursor
            )
            entries[:0] = self._own(page.data)
            log = _Log.build(_records(entries))
            if page.before_cursor is None:
                return log, True
            if enough(log):
                return log, False
            cursor, size = page.before_cursor, min(MAX_PAGE, size * 2)

    def _tuple(
        self, conversation_id: str, log: _Log, thread_id: str, ns: str, checkpoint_id: str,
    ) -> Flow[CheckpointTuple]:
        stored = log.checkpoints[(ns, checkpoint_id)]
        payload = self._decode(stored.record)
        checkpoint: dict[str, Any] = dict(payload["checkpoint"])
        versions = {channel: str(version) for channel, version in checkpoint.get("channel_versions", {}).items()}
        blobs = {channel: log.blob(ns, channel, version, stored.seq) for channel, version in versions.items()}
        if any(blob is None for blob in blobs.values()):
            # A channel the put did not carry (its caller left the value out): as LangGraph's savers do, the
            # value of that version from an earlier put. The one read of the whole thread, and only for such puts.
            whole = _Log.build(_records((yield from self._entries(conversation_id))))
            for channel, blob in blobs.items():
                if blob is None:
                    blobs[channel] = whole.blob(ns, channel, versions[channel], whole.checkpoints[(ns, checkpoint_id)].seq)
        values: dict[str, Any] = {}
        for channel, blob in blobs.items():
            if blob is not None and blob["type"] != "empty":
                values[channel] = self._decode(blob)
        checkpoint["channel_values"] = values
        writes = log.writes.get((ns, checkpoint_id), {})
        pending: list[PendingWrite] = [
            (record["task"], record["channel"], self._decode(record))
            for record in sorted(writes.values(), key=lambda r: writes_sort_key(r["path"], r["task"], r["idx"]))
        ]
        parent = stored.record.get("parent")
        return CheckpointTuple(
            config={"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}},
            checkpoint=checkpoint,  # type: ignore[arg-type]
            metadata=payload["metadata"],
            parent_config=(
                {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": parent}}
                if parent else None
            ),
            pending_writes=pending,
        )

    def _append(self, thread_id: str, conversation_id: str, records: Records, key: str) -> Flow[None]:
        for content in _pack(records, self._max_entry_bytes):
            yield from self._append_entry(thread_id, conversation_id, content, key)
        return None

    def _append_entry(
        self, thread_id: str, conversation_id: str, content: Records, key: str | None,
    ) -> Flow[None]:
        try:
            yield ops.append_entry(conversation_id, content, channel="context", content_type=CONTENT_TYPE, key=key)
        except NotFoundError as exc:
            self._threads.forget(conversation_id)
            exc.add_note(
                f"thread {thread_id!r} (conversation {conversation_id}) was deleted; a deleted thread's id "
                "cannot hold checkpoints again"
            )
            raise
        return None

    def _decode(self, record: dict[str, Any]) -> Any:
        return self.serde.loads_typed((record["type"], base64.b64decode(record["data"])))


# --- The log: records in entries ---------------------------------------------------------------------------------


def entry_key(ns: str, checkpoint_id: str) -> str:
    """The entry key of a checkpoint's entries (its put, its pending writes): one lookup finds them all. Hashed, so
    any namespace and id fit the service's key alphabet and length."""
    digest = hashlib.sha256(f"{ns}\x00{checkpoint_id}".encode()).hexdigest()[:40]
    return f"lgcp-{digest}"


def _complete(log: _Log, key: tuple[str, str]) -> bool:
    """Whether the log holds every channel value the checkpoint's put carried (its entries before it)."""
    stored = log.checkpoints[key]
    return all(
        any(blob.seq < stored.seq for blob in log.blobs.get((key[0], channel, version), ()))
        for channel, version in (stored.record.get("blobs") or {}).items()
    )


def _newest(log: _Log, ns: str, *, whole: bool) -> str | None:
    """The id of the checkpoint of ``ns`` put last, once the log holds all of it (any that is there when the log
    is the whole thread); None when the log does not have it yet."""
    newest = max(
        ((stored.seq, checkpoint_id) for (cns, checkpoint_id), stored in log.checkpoints.items() if cns == ns),
        default=None,
    )
    if newest is None or not (whole or _complete(log, (ns, newest[1]))):
        return None
    return newest[1]


def _newest_first(
    log: _Log, wanted: Callable[[_Log, tuple[str, str]], bool], limit: int | None, *, whole: bool,
) -> list[tuple[str, str]]:
    """The wanted checkpoints, put last first, up to ``limit``: as far as the log holds them whole (all of them
    when the log is the whole thread)."""
    chosen: list[tuple[str, str]] = []
    for key in sorted(log.checkpoints, key=lambda key: log.checkpoints[key].seq, reverse=True):
        if limit is not None and len(chosen) >= limit:
            break
        if not wanted(log, key):
            continue
        if not (whole or _complete(log, key)):
            break  # its put starts before the log: the next page has the rest
        chosen.append(key)
    return chosen


def _payload(kind: str, data: bytes) -> dict[str, str]:
    return {"type": kind, "data": base64.b64encode(data).decode("ascii")}


def _size(item: dict[str, Any]) -> int:
    # As the service measures content: compact JSON, UTF-8; +1 for the comma between items.
    return len(json.dumps(item, ensure_ascii=False, separators=(",", ":")).encode("utf-8")) + 1


def _pack(records: list[dict[str, Any]], budget: int) -> list[list[dict[str, Any]]]:
    """The records as entries' content arrays, in order, each within ``budget`` bytes. A record whose payload alone
    is too big is split into parts (``rid``/``part``/``parts``) that a reader joins again."""
    items: list[dict[str, Any]] = []
    for record in records:
        header = _size({**record, "data": "", "rid": uuid.uuid4().hex, "part": 0, "parts": 0})
        room = budget - header - 64
        data: str = record.get("data", "")
        if _size(record) <= budget - 2 or room <= 0:
            items.append(record)
            continue
        pieces = [data[start : start + room] for start in range(0, len(data), room)]
        rid = uuid.uuid4().hex
        items.extend({**record, "data": piece, "rid": rid, "part": n, "parts": len(pieces)}
                     for n, piece in enumerate(pieces))
    entries: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    used = 2  # the array's brackets
    for item in items:
        size = _size(item)
        if current and (used + size > budget or len(current) >= MAX_ITEMS_PER_ENTRY):
            entries.append(current)
            current, used = [], 2
        current.append(item)
        used += size
    if current:
        entries.append(current)
    return entries


def _records(entries: list[Entry]) -> list[dict[str, Any]]:
    """The records of the entries in log order, split records joined (at the position of their last part); parts
    whose record is incomplete (a writer that stopped half way) are left out."""
    records: list[dict[str, Any]] = []
    parts: dict[str, dict[int, dict[str, Any]]] = {}
    for entry in entries:
        for item in entry.content:
            if not isinstance(item, dict) or "kind" not in item:
                continue
            rid = item.get("rid")
            if rid is None:
                records.append(item)
                continue
            held = parts.setdefault(rid, {})
            held[int(item["part"])] = item
            if len(held) == int(item["parts"]):
                joined = {k: v for k, v in held[0].items() if k not in ("rid", "part", "parts")}
                joined["data"] = "".join(held[n]["data"] for n in range(len(held)))
                records.append(joined)
                del parts[rid]
    return records


@dataclass
class _Stored:
    seq: int
    record: dict[str, Any]


@dataclass
class _Log:
    """A thread as LangGraph's savers index it, from its records in log order (``seq``)."""

    checkpoints: dict[tuple[str, str], _Stored] = field(default_factory=dict)
    thread_ids: dict[tuple[str, str], str] = field(default_factory=dict)
    blobs: dict[tuple[str, str, str], list[_Stored]] = field(default_factory=dict)
    writes: dict[tuple[str, str], dict[tuple[str, int], dict[str, Any]]] = field(default_factory=dict)

    @classmethod
    def build(cls, records: list[dict[str, Any]]) -> _Log:
        log = cls()
        for seq, record in enumerate(records):
            kind = record["kind"]
            ns = record.get("ns", "")
            if kind == "checkpoint":
                # A checkpoint put again (same id) replaces the earlier one, as in LangGraph's savers.
                log.checkpoints[(ns, record["id"])] = _Stored(seq, record)
                if "thread" in record:
                    log.thread_ids[(ns, record["id"])] = record["thread"]
            elif kind == "blob":
                log.blobs.setdefault((ns, record["channel"], record["version"]), []).append(_Stored(seq, record))
            elif kind == "write":
                task_writes = log.writes.setdefault((ns, record["checkpoint"]), {})
                key = (record["task"], int(record["idx"]))
                # A regular write is kept once (a retried put_writes adds nothing); a special one (error,
                # interrupt, ...: negative idx) is replaced, as LangGraph's savers do.
                if key[1] < 0 or key not in task_writes:
                    task_writes[key] = record
        return log

    def blob(self, ns: str, channel: str, version: str, before_seq: int) -> dict[str, Any] | None:
        """The value of ``channel`` at ``version`` as the checkpoint at ``before_seq`` saw it: the latest blob
        written before the checkpoint (else the latest at all)."""
        stored = self.blobs.get((ns, channel, version))
        if not stored:
            return None
        earlier = [s for s in stored if s.seq < before_seq]
        return (earlier or stored)[-1].record
