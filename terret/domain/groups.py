"""Consumer groups (R30): a server-side group that spreads one log's events over the workers
reading it, each event to one of them, a session's events to the same one while it stays.

A pool of ``serve`` workers on EventStoreDB reads the events that ask for a worker (a waking
inbox entry, a session let go) through one group — EventStoreDB's persistent subscription to
``$all`` with the Pinned strategy — so no worker reads another's traffic to find its work. The
group only chooses who *tries*: correctness still comes from the fenced lease (R28).

A store without such a primitive (SQLite, memory) returns None from
``EventStore.consumer_group``; its workers find their work in their own views.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the store's port names this module's types: no cycle at run time
    from terret.domain.store import StoredRecord


class GroupMessage(ABC):
    """One event delivered to this member of the group. Settle it once: ``ack`` when handled
    (the group forgets it), ``retry`` to have it delivered again (to this member or, if it
    left, another)."""

    record: StoredRecord

    @abstractmethod
    def ack(self) -> None: ...

    @abstractmethod
    def retry(self, reason: str) -> None: ...


class GroupReader(ABC, Iterator[GroupMessage]):
    """This process's membership of a consumer group: iterate it for the events the group gives
    this member; ``stop()`` (from any thread) leaves the group and ends the iteration. A lost
    connection is re-established inside: the group redelivers what was not settled."""

    def __iter__(self) -> GroupReader:
        return self

    @abstractmethod
    def __next__(self) -> GroupMessage: ...

    @abstractmethod
    def stop(self) -> None: ...
