"""Small helpers shared by the emulator tests."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from esdbclient import NewEvent
from esdbclient.events import CaughtUp, Checkpoint, RecordedEvent


def new_event(event_type: str = "Tested", data: bytes = b"{}") -> NewEvent:
    return NewEvent(type=event_type, data=data)


def positioned(event: RecordedEvent) -> int:
    """The commit position, which the emulator sets on every read event."""
    assert event.commit_position is not None
    return event.commit_position


def is_caught_up(item: Any) -> bool:
    return isinstance(item, CaughtUp)


def is_checkpoint(item: Any) -> bool:
    return isinstance(item, Checkpoint)


def take_until(items: Iterator[Any], stop: Callable[[Any], bool], limit: int = 10_000) -> list:
    """Items up to and including the first one for which `stop` holds."""
    taken = []
    for item in items:
        taken.append(item)
        if stop(item) or len(taken) >= limit:
            break
    return taken


def in_background(target: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread
