"""Python client of Memory Service.

>>> from memory_service import Client, OAuthToken
>>> client = Client("http://localhost:8080", token=OAuthToken.dev_idp("http://localhost:8080", "bob"))
>>> client.put_memory(("user", "bob", "prefs"), "coffee", {"likes": "flat white"})

:class:`Client` and :class:`AsyncClient` have the same methods (one per operation of the service's OpenAPI schema,
plus ``iter_*`` methods that follow cursors), declared once in :mod:`memory_service._methods`. Errors are
:class:`MemoryServiceError` subclasses.
"""

__version__ = "0.1.0"

from memory_service._base import AsyncAttachmentDownload, AttachmentDownload, RetryPolicy
from memory_service._operations import OPERATIONS
from memory_service._sse import AsyncEventStream, EventStream
from memory_service.async_client import AsyncClient
from memory_service.auth import OAuthToken, TokenSource
from memory_service.client import Client
from memory_service.errors import (
    APIConnectionError,
    APIError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    ConfigurationError,
    ConflictError,
    ConversationTakenError,
    MemoryServiceError,
    NotFoundError,
    OAuthError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitedError,
    ServerError,
    UnavailableError,
    ValidationError,
)
from memory_service.models import (
    AdminConversation,
    Attachment,
    Conversation,
    DownloadUrl,
    Entry,
    Fork,
    Health,
    HistoryItem,
    IndexItem,
    Me,
    Membership,
    Memory,
    MemoryEvent,
    MemorySearchItem,
    MemoryWriteResult,
    OwnershipTransfer,
    Page,
    SearchQuery,
    SearchResult,
    StreamEvent,
    UnindexedEntry,
)

__all__ = [
    "OPERATIONS",
    "APIConnectionError",
    "APIError",
    "APITimeoutError",
    "AdminConversation",
    "AsyncAttachmentDownload",
    "AsyncClient",
    "AsyncEventStream",
    "Attachment",
    "AttachmentDownload",
    "AuthenticationError",
    "BadRequestError",
    "Client",
    "ConfigurationError",
    "ConflictError",
    "Conversation",
    "ConversationTakenError",
    "DownloadUrl",
    "Entry",
    "EventStream",
    "Fork",
    "Health",
    "HistoryItem",
    "IndexItem",
    "Me",
    "Membership",
    "Memory",
    "MemoryEvent",
    "MemorySearchItem",
    "MemoryServiceError",
    "MemoryWriteResult",
    "NotFoundError",
    "OAuthError",
    "OAuthToken",
    "OwnershipTransfer",
    "Page",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "RateLimitedError",
    "RetryPolicy",
    "SearchQuery",
    "SearchResult",
    "ServerError",
    "StreamEvent",
    "TokenSource",
    "UnavailableError",
    "UnindexedEntry",
    "ValidationError",
    "__version__",
]
