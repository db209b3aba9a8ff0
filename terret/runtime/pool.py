"""A pool member's share of the work (R30): the events that ask for a worker, read through the
store's consumer group (``terret.domain.groups``; EventStoreDB's persistent subscription to
``$all``, Pinned strategy), each handed to one member only.

The events that ask for a worker: a waking inbox entry (``inbox/queued`` with ``wake``), a
session let go (``agent/detached``: a worker that stopped hands its open turn off), and the
stimuli of an open turn nobody owns (``WIRE_NAMES``). The group
gives each to one member, and a session's to the same member while the membership holds, so a
member reads its share and none of the others'. The member that gets one tries the session at
once (it was chosen: no preference, no grace); the fenced claim still decides. A crashed
owner writes no event: its sessions are found in its last beat (``WorkerLease.orphans``).

Settling: a message is acked once handled — claimed, left to a live owner, not this app's to
serve — and retried when the store could not be read (the group delivers it again) or this
member is stopping (another member gets it).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from uuid import UUID

from terret.domain.catalogue import catalogue
from terret.domain.codec import RecordDecoder
from terret.domain.errors import CorruptRecord, SessionNotFound, StoreError
from terret.domain.events import (
    AgentDetached,
    ApprovalResolved,
    CancelRequested,
    InboxQueued,
    InDoubtResolved,
    TurnStarted,
)
from terret.domain.groups import GroupMessage, GroupReader
from terret.domain.store import session_id_of

log = logging.getLogger("terret.serving")

WIRE_NAMES = frozenset({InboxQueued.wire_name, AgentDetached.wire_name, TurnStarted.wire_name,
                        ApprovalResolved.wire_name, InDoubtResolved.wire_name,
                        CancelRequested.wire_name})
"""What a pool's consumer group carries: the events that may ask for a worker. Besides wakes
and releases, the stimuli of an open turn (its start, a verdict, a cancel): when nobody owns
the turn — written by a process that held no lease, or whose owner's beat is gone — the member
given one takes the turn; when a live worker owns it, the member leaves it (the owner follows
its session's stream)."""

RETRY_AFTER = 1.0
"""Seconds before a message that met an unreadable store is given back to the group."""

Offer = Callable[[UUID, "str | None"], object]
"""Try a session now, as the member chosen for it (the worker that let it go, if any)."""


class GroupFeed:
    """Reads this member's share of the group on a thread of its own and offers each session
    that asks for a worker."""

    def __init__(self, reader: GroupReader, offer: Offer, stopping: threading.Event) -> None:
        self.reader = reader
        self._offer = offer
        self._stopping = stopping
        self._decode = RecordDecoder(catalogue)
        self._thread = threading.Thread(target=self._run, name="terret-pool", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Leave the group: what this member was given and did not settle goes to another."""
        self.reader.stop()  # before it started too: the reader then never joins
        if self._thread.ident is not None and self._thread is not threading.current_thread():
            self._thread.join(5.0)

    def _run(self) -> None:
        try:
            for message in self.reader:
                self._settle(message)
        except Exception:  # the reader gave up (the store is gone for good)
            if not self._stopping.is_set():
                log.exception("the pool's consumer group failed; this worker no longer takes "
                              "new work from it")

    def _settle(self, message: GroupMessage) -> None:
        if self._stopping.is_set():
            message.retry("this worker is stopping")
            return
        try:
            self.handle(message)
        except StoreError as exc:
            # The group gives it out again at once, and parks it after its retry count: wait
            # a little first, so a short outage does not use the retries up.
            self._stopping.wait(RETRY_AFTER)
            message.retry(f"the store could not be read: {exc}")
            return
        except SessionNotFound as exc:
            # A new group replays wakes from the start of the log, sessions purged since
            # among them: nothing is left to serve.
            log.info("pool: %s was passed over (%s)", message.record.stream, exc)
        except Exception:
            log.exception("serving a session from the pool failed")
        message.ack()

    def handle(self, message: GroupMessage) -> None:
        """Offer the session the message is about, if it asks for a worker."""
        record = message.record
        sid = session_id_of(record.stream)
        if sid is None or record.wire_name not in WIRE_NAMES:
            return
        try:
            payload = self._decode(record).payload
        except CorruptRecord:
            log.warning("pool: an unreadable %s in %s was passed over", record.wire_name,
                        record.stream)
            return
        if record.wire_name == InboxQueued.wire_name and not getattr(payload, "wake", False):
            return
        self._offer(sid, getattr(payload, "worker", None))
