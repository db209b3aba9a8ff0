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

from terret.domain.store import GroupMessage, GroupReader

__all__ = ["GroupMessage", "GroupReader"]
