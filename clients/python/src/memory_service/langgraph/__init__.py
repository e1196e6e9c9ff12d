"""LangGraph on Memory Service: a long-term memory store and a checkpointer.

- :class:`MemoryServiceStore`: a ``BaseStore`` (sync and async) over the service's memories.
- :class:`MemoryServiceCheckpointSaver`: a ``BaseCheckpointSaver`` (sync and async) keeping each thread in a
  conversation's ``context`` channel.

Needs the ``langgraph`` extra: ``pip install 'memory-service-client[langgraph]'``.
"""

try:
    import langgraph.checkpoint.base
    import langgraph.store.base  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "memory_service.langgraph needs LangGraph: pip install 'memory-service-client[langgraph]'"
    ) from exc

from memory_service._ids import conversation_id_for
from memory_service.langgraph.checkpoint import MemoryServiceCheckpointSaver
from memory_service.langgraph.store import (
    MatchedSearchItem,
    MemoryServiceStore,
    MultiQuerySearchOp,
    StoreIndexConfig,
)

AsyncMemoryServiceStore = MemoryServiceStore  # one class: BaseStore has both the sync and the async methods
AsyncMemoryServiceCheckpointSaver = MemoryServiceCheckpointSaver

__all__ = [
    "AsyncMemoryServiceCheckpointSaver",
    "AsyncMemoryServiceStore",
    "MatchedSearchItem",
    "MemoryServiceCheckpointSaver",
    "MemoryServiceStore",
    "MultiQuerySearchOp",
    "StoreIndexConfig",
    "conversation_id_for",
]
