"""The batch client: the engine data path over a mount's socket and shared-memory arena.

``Client(mountpoint)`` opens a session with the mount's daemon; see
:mod:`kvfs.client.client` (the calls), :mod:`kvfs.client.results` (what they return),
:mod:`kvfs.client.connection` (the socket) and docs/client.md. Needs no FUSE, trio, torch or boto3:
torch tensors are just buffers to it.
"""

from .client import Client
from .connection import Connection, Stream
from .results import BatchError, BufferTooSmall, EventStream, Hold, LookupResult, Presence, PutBuffer, Read, View

__all__ = [
    "BatchError",
    "BufferTooSmall",
    "Client",
    "Connection",
    "EventStream",
    "Hold",
    "LookupResult",
    "Presence",
    "PutBuffer",
    "Read",
    "Stream",
    "View",
]
