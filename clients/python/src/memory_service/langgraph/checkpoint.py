"""LangGraph's checkpointer (``BaseCheckpointSaver``) on conversation context entries."""

from __future__ import annotations

import base64
import json
import random
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
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
    UsesClients,
    arun,
    conversation_entries,
    delete_conversation,
    every_page,
    run,
)
from memory_service._ids import conversation_id_for
from memory_service.async_client import AsyncClient
from memory_service.auth import TokenSource
from memory_service.client import Client
from memory_service.errors import NotFoundError
from memory_service.models import Entry

# The contentType of the saver's context entries: other context entries of the same client are left alone.
CONTENT_TYPE = "langgraph-checkpoint"
DEFAULT_MAX_ENTRY_BYTES = 200_000  # under the service's 256 KiB per entry (CONVERSATION_ENTRY_MAX_CONTENT_BYTES)
MAX_ITEMS_PER_ENTRY = 1000  # the service's CONVERSATION_ENTRY_MAX_ITEMS

# Inside the saver, `list` is its method: signatures there use these names for the builtin's types.
Records = list[dict[str, Any]]
Tuples = list[CheckpointTuple]
ThreadIds = list[str]
Entries = list[Entry]


class MemoryServiceCheckpointSaver(BaseCheckpointSaver[str], UsesClients):
    """A LangGraph checkpointer (sync and async) that keeps each thread in a Memory Service conversation.

    >>> saver = MemoryServiceCheckpointSaver("http://localhost:8080", token=..., api_key=...)
    >>> graph = builder.compile(checkpointer=saver)
    >>> graph.invoke(inputs, {"configurable": {"thread_id": "chat-42"}})

    - **Where**: one conversation per thread (:func:`conversation_id_for`: the thread id when it is a UUID, else a
      uuid5 of it), created by the first checkpoint and owned by the token's user. Checkpoints, their channel
      values and pending writes are entries on the conversation's ``context`` channel (contentType
      ``langgraph-checkpoint``), which the service encrypts at rest and shows only to the API-key client that
      wrote them (D5): **an API key is required**, and only that client's savers see the checkpoints. The
      conversation's ``history`` channel stays free for the chat itself (e.g.
      :class:`~memory_service.langchain.MemoryServiceChatMessageHistory` on the same id).
    - **What**: LangGraph's layout: a checkpoint without its channel values, its metadata, a blob per channel
      version that changed (``new_versions``), and writes per task, all serialized by the saver's ``serde``
      (LangGraph's ``JsonPlusSerializer`` by default) and carried base64-encoded in the entries' content items. A
      put is one entry (a state too big for one entry spans several, the checkpoint last; a reader ignores parts
      without their checkpoint).
    - **Reads** follow every page of the thread's entries (200 a page), so a thread never resumes from a stale
      state however many checkpoints it holds; each read costs one request per 200 entries.
    - ``list`` filters by ``checkpoint_ns`` (when the config names one), ``checkpoint_id``, metadata ``filter``
      (equality per key), ``before`` and ``limit``; ``list(None)`` walks every conversation the caller can see.
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
        for thread_id in run(client, self._thread_ids(config)):
            if remaining is not None and remaining <= 0:
                return
            found = run(client, self._list_thread(thread_id, config, filter, before, remaining))
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
        run(self._clients.sync, delete_conversation(conversation_id_for(str(thread_id))))

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
        for thread_id in await arun(client, self._thread_ids(config)):
            if remaining is not None and remaining <= 0:
                return
            found = await arun(client, self._list_thread(thread_id, config, filter, before, remaining))
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
        await arun(self._clients.async_, delete_conversation(conversation_id_for(str(thread_id))))

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
        stripped: dict[str, Any] = dict(checkpoint)
        values: dict[str, Any] = stripped.pop("channel_values", {}) or {}
        records: list[dict[str, Any]] = []
        for channel, version in new_versions.items():
            kind, data = self.serde.dumps_typed(values[channel]) if channel in values else ("empty", b"")
            records.append({"kind": "blob", "ns": ns, "channel": channel, "version": str(version),
                            **_payload(kind, data)})
        kind, data = self.serde.dumps_typed({"checkpoint": stripped,
                                             "metadata": get_checkpoint_metadata(config, metadata)})
        records.append({"kind": "checkpoint", "ns": ns, "id": checkpoint["id"], "thread": thread_id,
                        "parent": configurable.get("checkpoint_id"), **_payload(kind, data)})
        yield from self._append(thread_id, records)
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}}

    def _put_writes(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str,
    ) -> Flow[None]:
        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        ns = configurable.get("checkpoint_ns", "")
        records = []
        for idx, (channel, value) in enumerate(writes):
            kind, data = self.serde.dumps_typed(value)
            records.append({"kind": "write", "ns": ns, "checkpoint": configurable["checkpoint_id"], "task": task_id,
                            "path": task_path, "idx": WRITES_IDX_MAP.get(channel, idx), "channel": channel,
                            **_payload(kind, data)})
        if records:
            yield from self._append(thread_id, records)
        return None

    def _get_tuple(self, config: RunnableConfig) -> Flow[CheckpointTuple | None]:
        configurable = config["configurable"]
        thread_id = str(configurable["thread_id"])
        ns = configurable.get("checkpoint_ns", "")
        log = yield from self._read(thread_id)
        if log is None:
            return None
        checkpoint_id = get_checkpoint_id(config)
        if not checkpoint_id:
            ids = [cid for (cns, cid) in log.checkpoints if cns == ns]
            if not ids:
                return None
            checkpoint_id = max(ids)
        if (ns, checkpoint_id) not in log.checkpoints:
            return None
        return self._tuple(log, thread_id, ns, checkpoint_id)

    def _list_thread(
        self, thread_id: str, config: RunnableConfig | None, filter: dict[str, Any] | None,
        before: RunnableConfig | None, limit: int | None,
    ) -> Flow[Tuples]:
        log = yield from self._read(thread_id)
        if log is None:
            return []
        configurable = (config or {}).get("configurable", {})
        ns_wanted = configurable.get("checkpoint_ns")
        id_wanted = configurable.get("checkpoint_id")
        before_id = get_checkpoint_id(before) if before else None
        found: list[CheckpointTuple] = []
        for ns, checkpoint_id in sorted(log.checkpoints, key=lambda key: key[1], reverse=True):
            if limit is not None and len(found) >= limit:
                break
            if ns_wanted is not None and ns != ns_wanted:
                continue
            if id_wanted and checkpoint_id != id_wanted:
                continue
            if before_id and checkpoint_id >= before_id:
                continue
            if filter:
                metadata = self._decode(log.checkpoints[(ns, checkpoint_id)].record)["metadata"]
                if not all(metadata.get(key) == value for key, value in filter.items()):
                    continue
            found.append(self._tuple(log, log.thread_ids.get((ns, checkpoint_id), thread_id), ns, checkpoint_id))
        return found

    def _copy_thread(self, source_thread_id: str, target_thread_id: str) -> Flow[None]:
        entries = yield from self._entries(str(source_thread_id))
        if not entries:
            return None
        records = [
            {**record, "thread": str(target_thread_id)} if record["kind"] == "checkpoint" else record
            for record in _records(entries)
        ]
        yield from self._append(str(target_thread_id), records)
        return None

    def _thread_ids(self, config: RunnableConfig | None) -> Flow[ThreadIds]:
        """The threads ``list`` walks: the config's, or (``list(None)``) every conversation the caller can see (a
        conversation's id is its thread id; those without this client's checkpoints list nothing)."""
        if config is not None:
            return [str(config["configurable"]["thread_id"])]
        conversations = yield from every_page(
            lambda cursor: ops.list_conversations(mode="all", limit=200, after_cursor=cursor)
        )
        return [conversation.id for conversation in conversations]

    # --- Reading and writing the log ------------------------------------------------------------------------------

    def _entries(self, thread_id: str) -> Flow[Entries | None]:
        """Every context entry of the thread's conversation, oldest first, every page; None: no such thread."""
        entries = yield from conversation_entries(conversation_id_for(thread_id), "context")
        if entries is None:
            return None
        return [entry for entry in entries if entry.content_type == CONTENT_TYPE]

    def _read(self, thread_id: str) -> Flow[_Log | None]:
        entries = yield from self._entries(thread_id)
        if entries is None:
            return None
        return _Log.build(_records(entries))

    def _append(self, thread_id: str, records: Records) -> Flow[None]:
        conversation_id = conversation_id_for(thread_id)
        for content in _pack(records, self._max_entry_bytes):
            try:
                yield ops.append_entry(conversation_id, content, channel="context", content_type=CONTENT_TYPE)
            except NotFoundError as exc:
                exc.add_note(
                    f"thread {thread_id!r} (conversation {conversation_id}) was deleted; a deleted thread's id "
                    "cannot hold checkpoints again"
                )
                raise
        return None

    # --- Decoding -------------------------------------------------------------------------------------------------

    def _decode(self, record: dict[str, Any]) -> Any:
        return self.serde.loads_typed((record["type"], base64.b64decode(record["data"])))

    def _tuple(self, log: _Log, thread_id: str, ns: str, checkpoint_id: str) -> CheckpointTuple:
        stored = log.checkpoints[(ns, checkpoint_id)]
        payload = self._decode(stored.record)
        checkpoint: dict[str, Any] = dict(payload["checkpoint"])
        values: dict[str, Any] = {}
        for channel, version in checkpoint.get("channel_versions", {}).items():
            blob = log.blob(ns, channel, str(version), stored.seq)
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


# --- The log: records in entries ---------------------------------------------------------------------------------


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
