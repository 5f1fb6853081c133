"""The write-through queue: work for colder tiers that runs in the background.

Two kinds of job, one FIFO per tier so that a tier that is down holds up only its own
work: a :class:`CopyJob` (a block sealed above a ``write = "through"`` tier is copied into
it soon after) and a :class:`DeleteJob` (a block deleted, renamed away or found corrupt
here is removed from a shared tier without the caller waiting for that tier). The store
pushes jobs under its lock and :class:`~kvfs.writeback.WriteBack` runs them. Not
thread-safe on its own: the store serializes access under its lock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from .catalog import BlockRecord

__all__ = ["CopyJob", "DeleteJob", "WriteThroughQueue"]


@dataclass(slots=True, eq=False)
class CopyJob:
    """Copy *rec* (whatever its name is by the time it runs) into tier *tier*."""

    rec: BlockRecord
    tier: int


@dataclass(slots=True, eq=False)
class DeleteJob:
    """Delete *name* from tier *tier*; with *cutoff*, only a copy written before it
    (seconds since the epoch: the retention sweep's, ``Tier.expire``)."""

    name: str
    tier: int
    cutoff: float | None = None


Job = CopyJob | DeleteJob


class WriteThroughQueue:
    """Pending copies and deletes, one FIFO per tier index."""

    def __init__(self) -> None:
        self._jobs: dict[int, deque[Job]] = {}
        self._deletes: dict[str, int] = {}  # name -> delete jobs queued for it

    def copy(self, rec: BlockRecord, tier: int) -> None:
        self._jobs.setdefault(tier, deque()).append(CopyJob(rec, tier))

    def delete(self, name: str, tier: int, *, cutoff: float | None = None) -> None:
        self._jobs.setdefault(tier, deque()).append(DeleteJob(name, tier, cutoff))
        self._deletes[name] = self._deletes.get(name, 0) + 1

    def pop(self, tier: int) -> Job | None:
        """The oldest job for *tier*, removed from the queue (None if there is none)."""
        q = self._jobs.get(tier)
        if not q:
            return None
        job = q.popleft()
        if isinstance(job, DeleteJob):
            self._forget_delete(job.name)
        return job

    def take_delete(self, tier: int, name: str) -> DeleteJob | None:
        """Remove and return the queued delete of *name* from *tier*, if there is one."""
        q = self._jobs.get(tier)
        if not q:
            return None
        for job in q:
            if isinstance(job, DeleteJob) and job.name == name:
                q.remove(job)
                self._forget_delete(name)
                return job
        return None

    def push_back(self, job: Job) -> None:
        """Put a job that could not run now at the front again (it keeps its turn)."""
        self._jobs.setdefault(job.tier, deque()).appendleft(job)
        if isinstance(job, DeleteJob):
            self._deletes[job.name] = self._deletes.get(job.name, 0) + 1

    def _forget_delete(self, name: str) -> None:
        n = self._deletes.get(name, 0) - 1
        if n > 0:
            self._deletes[name] = n
        else:
            self._deletes.pop(name, None)

    def deleting(self, name: str) -> bool:
        """True while a delete of *name* from some tier is still queued."""
        return name in self._deletes

    def tiers(self) -> list[int]:
        """Tier indexes with queued work."""
        return [t for t, q in self._jobs.items() if q]

    def pending(self, tier: int | None = None) -> int:
        if tier is not None:
            return len(self._jobs.get(tier, ()))
        return sum(len(q) for q in self._jobs.values())

    def __len__(self) -> int:
        return self.pending()

    def jobs(self, tier: int) -> Iterator[Job]:
        """The queued jobs of *tier*, oldest first (a snapshot: the queue may change)."""
        return iter(list(self._jobs.get(tier, ())))
