"""The batch client: the engine data path over a mount's socket and shared-memory arena.

``Client(mountpoint)`` opens a session with the mount's daemon; see
:mod:`kvfs.client.client` and docs/client.md. Needs no FUSE, trio, torch or boto3:
torch tensors are just buffers to it.
"""

from .client import BatchError, Client, Hold, LookupResult, Presence, PutBuffer, View
from .connection import Connection, Stream

__all__ = ["BatchError", "Client", "Connection", "Hold", "LookupResult", "Presence", "PutBuffer", "Stream", "View"]
