"""The event store contract: one abstract test case that every store adapter's test subclasses.

It ships in the package (``terret.testing``), as ``eventsourcing`` ships
``eventsourcing/tests/persistence.py``, so that an adapter written outside Terret can be held to
it. Like ``eventsourcing``'s ``ApplicationRecorderTestCase``: the base class is not collected
(its name does not start with ``Test``); an adapter's test module declares

    class TestMyStore(StoreContract):
        def create_store(self) -> EventStore:
            return MyStore(...)

        # optional: a picklable callable that opens the *same* store in another process;
        # without it the cross-process cases are skipped (as for the memory store).
        def other_process_opener(self) -> Callable[[], EventStore] | None:
            return functools.partial(MyStore, ...)

and may override ``create_store_with_slow_poll``, ``dispose_store``, ``corrupt_record`` (to
exercise ``CorruptRecord`` on the raw rows), ``checkpoint_stretch``, ``cross_process_timeout``
and ``head_reader`` (a dotted path from the store to the callable its subscriptions read the
head with).
``self.tmp_path`` (pytest's per-test directory) is set before any hook runs; an autouse fixture
of the subclass may set more (e.g. a server URI). To skip one case, override the method with
``@pytest.mark.skip(reason=...)``; to add adapter-only cases, add ``test_*`` methods.

The cases assume neither a fresh store nor consecutive positions (EventStoreDB positions have
gaps and a real server is shared): every case writes to fresh ``session-<uuid4>`` streams and
compares positions relative to what it observed itself. Other processes are started with the
spawn method and reaped by the ``mp`` fixture.

The port is also the ``eventsourcing`` library's ``ApplicationRecorder``: run the library's
``ApplicationRecorderTestCase`` against the adapter as well (Terret's own adapters do, in
``tests/contract/test_library_cases.py``), and the cases at the end of this suite check the
mapping between the two (originator versions, notifications, ``subscribe(gt=…)``).
"""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from uuid import UUID, uuid4

import pytest

from terret.domain.codec import decode
from terret.domain.errors import (
    CorruptRecord,
    PayloadTooLarge,
    SessionNotFound,
    StreamDeleted,
    ToolCallNotOwed,
    TurnOpenInLog,
    WrongExpectedVersion,
)
from terret.domain.events import Actor, ToolCallData, UsageData
from terret.domain.repository import SessionRepository
from terret.domain.session import Session, SessionState
from terret.domain.store import (
    CaughtUp,
    Checkpoint,
    EventStore,
    NewRecord,
    StoredRecord,
    StreamState,
    Subscription,
    SubscriptionItem,
    record_size,
    session_stream,
)

TIMEOUT = 15.0
"""Upper bound for anything that is expected to happen; waits return as soon as it does."""

SIGNAL = "contract/signal"
NOISE = "contract/noise"
META = b'{"schema_version":1}'

Opener = Callable[[], EventStore]


def new_stream() -> str:
    return session_stream(uuid4())


def record(wire_name: str = SIGNAL, n: int = 0, *, event_id: UUID | None = None) -> NewRecord:
    return NewRecord(
        event_id=event_id or uuid4(),
        wire_name=wire_name,
        data=json.dumps({"n": n}).encode(),
        metadata=META,
    )


def records(count: int, wire_name: str = SIGNAL) -> list[NewRecord]:
    return [record(wire_name, i) for i in range(count)]


def expect(version: int) -> int | StreamState:
    return version if version else StreamState.NO_STREAM


class Collector:
    """Iterates a subscription on a background thread and keeps every item it yields."""

    def __init__(self, subscription: Subscription) -> None:
        self.subscription = subscription
        self.items: list[SubscriptionItem] = []
        self.error: BaseException | None = None
        self.done = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for item in self.subscription:
                with self._cond:
                    self.items.append(item)
                    self._cond.notify_all()
        except BaseException as exc:
            with self._cond:
                self.error = exc
        finally:
            with self._cond:
                self.done = True
                self._cond.notify_all()

    def wait(self, predicate: Callable[[list[SubscriptionItem]], bool],
             timeout: float = TIMEOUT) -> bool:
        """Wait until ``predicate(items)`` holds (True), the subscription ends or ``timeout``."""
        with self._cond:
            self._cond.wait_for(
                lambda: predicate(self.items) or self.done or self.error is not None, timeout
            )
            if self.error is not None:
                raise self.error
            return predicate(self.items)

    def wait_records(self, streams: Sequence[str], count: int,
                     timeout: float = TIMEOUT) -> list[StoredRecord]:
        ok = self.wait(lambda items: len(self._of(items, streams)) >= count, timeout)
        found = self.records(streams)
        assert ok, f"expected {count} records, got {len(found)} within {timeout}s"
        return found

    def wait_caught_up(self, timeout: float = TIMEOUT) -> CaughtUp:
        assert self.wait(lambda items: any(isinstance(i, CaughtUp) for i in items), timeout)
        return next(i for i in self.snapshot() if isinstance(i, CaughtUp))

    @staticmethod
    def _of(items: list[SubscriptionItem], streams: Sequence[str]) -> list[StoredRecord]:
        return [i for i in items if isinstance(i, StoredRecord) and i.stream in streams]

    def snapshot(self) -> list[SubscriptionItem]:
        with self._cond:
            return list(self.items)

    def records(self, streams: Sequence[str]) -> list[StoredRecord]:
        return self._of(self.snapshot(), streams)

    def stop(self) -> None:
        self.subscription.stop()
        self._thread.join(TIMEOUT)
        assert not self._thread.is_alive(), "subscription did not stop"
        if self.error is not None:
            raise self.error


# --- work done in other processes (top level so that the spawn start method can import it) --


def _proc_append(opener: Opener, stream: str, count: int, go: Any, out: Any) -> None:
    """Append ``count`` single-event commits to ``stream``; report the positions."""
    store = opener()
    try:
        go.wait(TIMEOUT)
        positions = []
        for i in range(count):
            result = store.append(stream, [record(SIGNAL, i)], expect(i))
            positions.append(result.position)
        out.put(("appended", stream, positions))
    except BaseException as exc:
        out.put(("error", stream, repr(exc)))
    finally:
        store.close()


def _proc_race(opener: Opener, stream: str, rounds: int, barrier: Any, out: Any, tag: str) -> None:
    """In each round, append one event at the same expected version as the other racer."""
    store = opener()
    try:
        for r in range(rounds):
            barrier.wait(TIMEOUT)
            try:
                result = store.append(stream, [record(SIGNAL, r)], expect(r))
                out.put((tag, r, "won", result.version))
            except WrongExpectedVersion as exc:
                out.put((tag, r, "lost", exc.actual))
            barrier.wait(TIMEOUT)
    except BaseException as exc:
        out.put((tag, -1, "error", repr(exc)))
    finally:
        store.close()


def _proc_subscribe(opener: Opener, after: int, streams: list[str], count: int,
                    ready: Any, out: Any) -> None:
    """Subscribe from ``after``; report (stream, seq, position) of every event of ``streams``."""
    store = opener()
    seen: list[tuple[str, int, int]] = []
    sub = store.subscribe(after=after, wire_names=[SIGNAL])
    watchdog = threading.Timer(TIMEOUT * 2, sub.stop)
    watchdog.start()
    try:
        for item in sub:
            if isinstance(item, CaughtUp):
                ready.set()
            elif isinstance(item, StoredRecord) and item.stream in streams:
                seen.append((item.stream, item.seq, item.position))
                if len(seen) >= count:
                    break
        out.put(("seen", seen))
    except BaseException as exc:
        out.put(("error", repr(exc)))
    finally:
        watchdog.cancel()
        sub.stop()
        store.close()


class Processes:
    """Starts helper processes with the spawn method and reaps every one it started."""

    def __init__(self) -> None:
        self.ctx = multiprocessing.get_context("spawn")
        self._started: list[multiprocessing.process.BaseProcess] = []

    def start(self, target: Callable[..., None], *args: Any) -> None:
        proc = self.ctx.Process(target=target, args=args, daemon=True)
        proc.start()
        self._started.append(proc)

    def join(self) -> None:
        for proc in self._started:
            proc.join(TIMEOUT)

    def reap(self) -> None:
        for proc in self._started:
            proc.join(TIMEOUT)
            if proc.is_alive():
                proc.kill()
                proc.join(TIMEOUT)


class StoreContract:
    """The cases every ``EventStore`` adapter must pass. See the module docstring."""

    checkpoint_stretch: int = 25
    """How many filtered-out events a test appends to provoke a ``Checkpoint``."""

    cross_process_timeout: float = TIMEOUT
    """How long another process may take to start and append (spawn start method)."""

    tmp_path: Any

    # --- hooks ----------------------------------------------------------------------------

    def create_store(self) -> EventStore:
        raise NotImplementedError

    def create_store_with_slow_poll(self) -> EventStore:
        """A store that notices *other processes'* appends only every ~5 s (if it polls at
        all): in-process wake-ups must not depend on the poll."""
        return self.create_store()

    def other_process_opener(self) -> Opener | None:
        """A picklable callable opening the same store in another process (None: skip)."""
        return None

    def dispose_store(self, store: EventStore) -> None:
        store.close()

    #: Where its subscriptions read the head, as a dotted path from the store (a method of the
    #: store or of an object it holds): the head race test wraps it.
    head_reader = "head_position"

    def corrupt_record(self, store: EventStore, stored: StoredRecord) -> None:
        """Damage the raw stored record so that the store cannot read it back."""
        pytest.skip(f"{type(self).__name__} cannot damage raw records")

    def other_store_opener(self, request: pytest.FixtureRequest) -> Opener | None:
        """Opens a second, new store of this kind (another log); every call opens that same
        second store again. None: the adapter cannot make one (the identity cases that need
        it are skipped)."""
        return None

    # --- fixtures -------------------------------------------------------------------------

    @pytest.fixture(autouse=True)
    def _contract_tmp_path(self, tmp_path: Any) -> None:
        self.tmp_path = tmp_path

    @pytest.fixture
    def store(self) -> Iterator[EventStore]:
        store = self.create_store()
        try:
            yield store
        finally:
            self.dispose_store(store)

    @pytest.fixture
    def opener(self) -> Opener:
        opener = self.other_process_opener()
        if opener is None:
            pytest.skip(f"{type(self).__name__} cannot be opened by another process")
        return opener

    @pytest.fixture
    def mp(self) -> Iterator[Processes]:
        processes = Processes()
        try:
            yield processes
        finally:
            processes.reap()

    def collect(self, store: EventStore, after: int, wire_names: Sequence[str] | None = None,
                streams: Sequence[str] | None = None) -> Collector:
        if streams is not None:
            return Collector(store.open_subscription(after=after, wire_names=wire_names,
                                                     streams=streams))
        return Collector(store.subscribe(after=after, wire_names=wire_names))

    # --- append and expected versions ------------------------------------------------------

    def test_append_to_new_stream_with_no_stream(self, store: EventStore) -> None:
        stream = new_stream()
        batch = records(3)
        result = store.append(stream, batch, StreamState.NO_STREAM)
        assert result.version == 3
        stored = store.read_stream(stream)
        assert [r.seq for r in stored] == [1, 2, 3]
        assert [r.event_id for r in stored] == [r.event_id for r in batch]
        assert [(r.wire_name, r.data, r.metadata) for r in stored] == [
            (r.wire_name, r.data, r.metadata) for r in batch
        ]
        assert all(r.stream == stream for r in stored)
        positions = [r.position for r in stored]
        assert positions == sorted(set(positions))
        assert result.position == positions[-1]
        assert store.stream_version(stream) == 3
        assert store.head_position() >= result.position

    def test_append_with_exact_expected_version(self, store: EventStore) -> None:
        stream = new_stream()
        first = store.append(stream, records(2), StreamState.NO_STREAM)
        second = store.append(stream, records(3), 2)
        assert second.version == 5
        assert second.position > first.position
        assert [r.seq for r in store.read_stream(stream)] == [1, 2, 3, 4, 5]

    def test_append_with_any(self, store: EventStore) -> None:
        stream = new_stream()
        assert store.append(stream, records(1), StreamState.ANY).version == 1
        assert store.append(stream, records(2), StreamState.ANY).version == 3
        assert store.stream_version(stream) == 3

    def test_no_stream_on_existing_stream_conflicts(self, store: EventStore) -> None:
        stream = new_stream()
        store.append(stream, records(2), StreamState.NO_STREAM)
        with pytest.raises(WrongExpectedVersion) as info:
            store.append(stream, records(1), StreamState.NO_STREAM)
        assert info.value.actual == 2
        assert info.value.stream == stream
        assert store.stream_version(stream) == 2

    @pytest.mark.parametrize("expected", [1, 3, 7])
    def test_wrong_exact_version_conflicts_and_carries_actual(
        self, store: EventStore, expected: int
    ) -> None:
        stream = new_stream()
        store.append(stream, records(2), StreamState.NO_STREAM)
        before = store.read_stream(stream)
        with pytest.raises(WrongExpectedVersion) as info:
            store.append(stream, records(2), expected)
        assert info.value.actual == 2
        assert store.read_stream(stream) == before

    def test_exact_version_on_missing_stream_conflicts_with_actual_zero(
        self, store: EventStore
    ) -> None:
        stream = new_stream()
        with pytest.raises(WrongExpectedVersion) as info:
            store.append(stream, records(1), 1)
        assert info.value.actual == 0
        assert store.read_stream(stream) == []
        assert store.stream_version(stream) == 0

    def test_empty_append_checks_the_version_and_writes_nothing(
        self, store: EventStore
    ) -> None:
        stream = new_stream()
        assert store.append(stream, [], StreamState.NO_STREAM).version == 0
        store.append(stream, records(2), StreamState.NO_STREAM)
        assert store.append(stream, [], 2).version == 2
        with pytest.raises(WrongExpectedVersion) as info:
            store.append(stream, [], 1)
        assert info.value.actual == 2
        assert store.stream_version(stream) == 2

    # --- idempotency (R7) -----------------------------------------------------------------

    def test_retry_with_same_ids_at_same_expected_version_is_idempotent(
        self, store: EventStore
    ) -> None:
        stream = new_stream()
        head = records(1)
        store.append(stream, head, StreamState.NO_STREAM)
        batch = records(3)
        original = store.append(stream, batch, 1)
        again = store.append(stream, batch, 1)
        assert again == original
        assert store.stream_version(stream) == 4
        # a later event does not change what a retry of the earlier write answers
        store.append(stream, records(1), 4)
        late = store.append(stream, batch, 1)
        assert late.position == original.position
        assert late.version == original.version
        # the first write of the stream, retried with NO_STREAM
        assert store.append(stream, head, StreamState.NO_STREAM).version == 1
        assert store.stream_version(stream) == 5
        ids = [r.event_id for r in store.read_stream(stream)]
        assert len(ids) == len(set(ids)) == 5

    def test_retry_of_a_prefix_is_idempotent(self, store: EventStore) -> None:
        stream = new_stream()
        batch = records(3)
        store.append(stream, batch, StreamState.NO_STREAM)
        stored = store.read_stream(stream)
        assert store.append(stream, batch[:1], StreamState.NO_STREAM).position == (
            stored[0].position
        )
        assert store.append(stream, batch[1:2], 1).position == stored[1].position
        assert store.stream_version(stream) == 3

    def test_partial_overlap_raises_and_writes_nothing(self, store: EventStore) -> None:
        stream = new_stream()
        batch = records(2)
        store.append(stream, batch, StreamState.NO_STREAM)
        before = store.read_stream(stream)
        cases: list[tuple[list[NewRecord], int | StreamState]] = [
            ([*batch, record()], StreamState.NO_STREAM),  # the known ids, then a new one
            ([batch[0], record()], StreamState.NO_STREAM),  # first known, second new
            ([batch[1], batch[0]], StreamState.NO_STREAM),  # known ids in another order
            ([batch[1], record()], 1),
        ]
        for attempt, expected in cases:
            with pytest.raises(WrongExpectedVersion) as info:
                store.append(stream, attempt, expected)
            assert info.value.actual == 2
        assert store.read_stream(stream) == before

    def test_retry_with_any_is_idempotent_by_id(self, store: EventStore) -> None:
        stream = new_stream()
        batch = records(2)
        original = store.append(stream, batch, StreamState.ANY)
        assert store.append(stream, batch, StreamState.ANY).position == original.position
        with pytest.raises(WrongExpectedVersion):
            store.append(stream, [batch[0], record()], StreamState.ANY)
        assert store.stream_version(stream) == 2

    # --- oversize payloads ----------------------------------------------------------------

    def test_oversize_payload_is_refused_before_writing(self, store: EventStore) -> None:
        limit = store.max_record_bytes
        assert limit == 1024 * 1024
        stream = new_stream()
        big = NewRecord(uuid4(), SIGNAL, b'"' + b"x" * limit + b'"', META)
        with pytest.raises(PayloadTooLarge) as info:
            store.append(stream, [big], StreamState.NO_STREAM)
        assert info.value.limit == limit
        assert info.value.size > limit
        assert info.value.wire_name == SIGNAL
        assert store.stream_version(stream) == 0
        # in a batch, the small record before it is not written either
        with pytest.raises(PayloadTooLarge):
            store.append(stream, [record(), big], StreamState.NO_STREAM)
        assert store.read_stream(stream) == []
        store.append(stream, records(1), StreamState.NO_STREAM)
        with pytest.raises(PayloadTooLarge):
            store.append(stream, [big], 1)
        assert store.stream_version(stream) == 1

    def test_payload_just_under_the_limit_is_stored(self, store: EventStore) -> None:
        stream = new_stream()
        size = store.max_record_bytes - len(META) - 1024
        data = b'"' + b"y" * (size - 2) + b'"'
        store.append(stream, [NewRecord(uuid4(), SIGNAL, data, META)], StreamState.NO_STREAM)
        assert store.read_stream(stream)[0].data == data

    def test_a_record_is_counted_as_eventstoredb_counts_it(self, store: EventStore) -> None:
        """Data + metadata + the wire name in UTF-16, on every store: a record whose data and
        metadata alone were under 1 MiB was stored on SQLite and refused on EventStoreDB."""
        limit = store.max_record_bytes
        stream = new_stream()

        def sized(size: int) -> NewRecord:
            body = size - len(META) - 2 * len(SIGNAL) - 2
            return NewRecord(uuid4(), SIGNAL, b'"' + b"z" * body + b'"', META)

        assert record_size(sized(limit)) == limit
        store.append(stream, [sized(limit)], StreamState.NO_STREAM)
        over = sized(limit + 1)
        assert len(over.data) + len(over.metadata) < limit  # only its name puts it over
        with pytest.raises(PayloadTooLarge) as info:
            store.append(stream, [over], 1)
        assert (info.value.size, info.value.limit) == (limit + 1, limit)
        assert store.stream_version(stream) == 1

    def test_a_whole_append_is_bounded_where_the_store_says_so(self, store: EventStore
                                                                ) -> None:
        """``max_append_bytes``: None where only each record is bounded; otherwise an append
        whose records together take more is refused whole, nothing written."""
        half = NewRecord(uuid4(), SIGNAL, b'"' + b"h" * (store.max_record_bytes // 2) + b'"',
                         META)
        pair = [half, NewRecord(uuid4(), SIGNAL, half.data, META)]
        stream = new_stream()
        if store.max_append_bytes is None:
            assert store.append(stream, pair, StreamState.NO_STREAM).version == 2
            return
        assert sum(map(record_size, pair)) > store.max_append_bytes
        with pytest.raises(PayloadTooLarge) as info:
            store.append(stream, pair, StreamState.NO_STREAM)
        assert info.value.limit == store.max_append_bytes
        assert store.stream_version(stream) == 0
        store.append(stream, pair[:1], StreamState.NO_STREAM)  # each on its own fits
        store.append(stream, pair[1:], 1)
        assert store.stream_version(stream) == 2

    # --- reading streams ------------------------------------------------------------------

    def test_read_stream_forwards_and_backwards_with_limits(self, store: EventStore) -> None:
        stream = new_stream()
        store.append(stream, records(10), StreamState.NO_STREAM)

        def seqs(**kwargs: Any) -> list[int]:
            return [r.seq for r in store.read_stream(stream, **kwargs)]

        assert seqs() == list(range(1, 11))
        assert seqs(from_seq=4) == list(range(4, 11))
        assert seqs(from_seq=4, limit=3) == [4, 5, 6]
        assert seqs(limit=2) == [1, 2]
        assert seqs(backwards=True) == list(range(10, 0, -1))
        assert seqs(backwards=True, limit=3) == [10, 9, 8]
        assert seqs(from_seq=5, backwards=True) == [5, 4, 3, 2, 1]
        assert seqs(from_seq=5, backwards=True, limit=2) == [5, 4]
        assert seqs(from_seq=11) == []
        assert seqs(from_seq=20, backwards=True, limit=1) == [10]

    def test_unknown_stream_reads_empty(self, store: EventStore) -> None:
        stream = new_stream()
        assert store.read_stream(stream) == []
        assert store.read_stream(stream, backwards=True, limit=1) == []
        assert store.stream_version(stream) == 0
        assert store.read_snapshot(stream) is None

    def test_positions_strictly_increase_in_commit_order(self, store: EventStore) -> None:
        start = store.head_position()
        streams = [new_stream() for _ in range(3)]
        versions = dict.fromkeys(streams, 0)
        positions: list[int] = []
        order: list[tuple[str, int]] = []
        for i in range(12):
            stream = streams[(i * 7) % 3]
            count = 1 + i % 2
            result = store.append(stream, records(count), expect(versions[stream]))
            versions[stream] += count
            positions.append(result.position)
            order.extend((stream, versions[stream] - count + k + 1) for k in range(count))
        assert positions == sorted(set(positions))
        assert positions[0] > start
        assert store.head_position() >= positions[-1]
        mine = [
            r for r in _read_all(store, start, 10_000) if r.stream in streams
        ]
        assert [(r.stream, r.seq) for r in mine] == order
        assert [r.position for r in mine] == sorted({r.position for r in mine})

    def test_read_all_with_limit_and_wire_name_filter(self, store: EventStore) -> None:
        start = store.head_position()
        stream = new_stream()
        batch = [record(SIGNAL if i % 3 == 0 else NOISE, i) for i in range(9)]
        store.append(stream, batch, StreamState.NO_STREAM)
        everything = [r for r in _read_all(store, start, 10_000) if r.stream == stream]
        assert [r.seq for r in everything] == list(range(1, 10))
        filtered = [
            r for r in _read_all(store, start, 10_000, [SIGNAL]) if r.stream == stream
        ]
        assert [r.seq for r in filtered] == [1, 4, 7]
        assert all(r.wire_name == SIGNAL for r in filtered)
        page = store.read_all(after=everything[3].position, limit=2)
        assert len(page) == 2
        assert page[0].position > everything[3].position
        assert page[0].position < page[1].position

    def test_concurrent_appends_to_different_streams_keep_order(
        self, store: EventStore
    ) -> None:
        start = store.head_position()
        streams = [new_stream() for _ in range(4)]
        per_stream = 40
        errors: list[BaseException] = []
        barrier = threading.Barrier(len(streams))

        def write(stream: str) -> None:
            try:
                barrier.wait(TIMEOUT)
                for i in range(per_stream):
                    store.append(stream, [record(SIGNAL, i)], expect(i))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=write, args=(s,)) for s in streams]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT * 2)
        assert not errors
        mine = [r for r in _read_all(store, start, 100_000) if r.stream in streams]
        assert len(mine) == len(streams) * per_stream
        assert [r.position for r in mine] == sorted({r.position for r in mine})
        for stream in streams:
            assert [r.seq for r in mine if r.stream == stream] == list(
                range(1, per_stream + 1)
            )

    # --- racing writers -------------------------------------------------------------------

    def test_racing_threads_exactly_one_wins(self, store: EventStore) -> None:
        stream = new_stream()
        rounds = 15
        barrier = threading.Barrier(2)
        outcomes: list[tuple[str, int, str, int]] = []
        lock = threading.Lock()

        def race(tag: str) -> None:
            for r in range(rounds):
                barrier.wait(TIMEOUT)
                try:
                    result = store.append(stream, [record(tag, r)], expect(r))
                    outcome = (tag, r, "won", result.version)
                except WrongExpectedVersion as exc:
                    outcome = (tag, r, "lost", exc.actual)
                with lock:
                    outcomes.append(outcome)
                barrier.wait(TIMEOUT)

        threads = [threading.Thread(target=race, args=(t,)) for t in ("t/a", "t/b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT * 2)
        _assert_one_winner_per_round(outcomes, rounds)
        assert store.stream_version(stream) == rounds

    def test_racing_processes_exactly_one_wins(
        self, store: EventStore, opener: Opener, mp: Processes
    ) -> None:
        stream = new_stream()
        rounds = 10
        barrier = mp.ctx.Barrier(2)
        out = mp.ctx.Queue()
        for tag in ("p/a", "p/b"):
            mp.start(_proc_race, opener, stream, rounds, barrier, out, tag)
        outcomes = [out.get(timeout=self.cross_process_timeout) for _ in range(2 * rounds)]
        mp.join()
        assert not [o for o in outcomes if o[2] == "error"], outcomes
        _assert_one_winner_per_round(outcomes, rounds)
        assert store.stream_version(stream) == rounds

    # --- subscriptions --------------------------------------------------------------------

    def test_subscription_delivers_history_then_live(self, store: EventStore) -> None:
        start = store.head_position()
        stream = new_stream()
        history = [record(SIGNAL if i % 2 == 0 else NOISE, i) for i in range(6)]
        store.append(stream, history, StreamState.NO_STREAM)
        collector = self.collect(store, start, [SIGNAL])
        try:
            caught_up = collector.wait_caught_up()
            items = collector.snapshot()
            before = [
                i for i in items[: items.index(caught_up)]
                if isinstance(i, StoredRecord) and i.stream == stream
            ]
            assert [r.seq for r in before] == [1, 3, 5]
            assert len([i for i in collector.snapshot() if isinstance(i, CaughtUp)]) == 1
            store.append(stream, [record(NOISE), record(SIGNAL), record(SIGNAL)], 6)
            got = collector.wait_records([stream], 5)
            assert [r.seq for r in got] == [1, 3, 5, 8, 9]
            assert all(r.wire_name == SIGNAL for r in got)
            assert got == [r for r in store.read_stream(stream) if r.wire_name == SIGNAL]
        finally:
            collector.stop()
        _assert_monotonic(collector.snapshot())

    def test_subscription_without_filter_delivers_everything(self, store: EventStore) -> None:
        start = store.head_position()
        stream = new_stream()
        store.append(stream, [record(SIGNAL), record(NOISE)], StreamState.NO_STREAM)
        collector = self.collect(store, start)
        try:
            collector.wait_caught_up()
            store.append(stream, [record(NOISE)], 2)
            assert [r.seq for r in collector.wait_records([stream], 3)] == [1, 2, 3]
        finally:
            collector.stop()

    def test_subscription_started_mid_stream(self, store: EventStore) -> None:
        stream = new_stream()
        store.append(stream, records(6), StreamState.NO_STREAM)
        third = store.read_stream(stream)[2]
        collector = self.collect(store, third.position, [SIGNAL])
        try:
            collector.wait_caught_up()
            assert [r.seq for r in collector.records([stream])] == [4, 5, 6]
            store.append(stream, records(1), 6)
            assert [r.seq for r in collector.wait_records([stream], 4)] == [4, 5, 6, 7]
        finally:
            collector.stop()

    def test_subscription_from_head_delivers_only_new_events(self, store: EventStore) -> None:
        stream = new_stream()
        store.append(stream, records(3), StreamState.NO_STREAM)
        collector = self.collect(store, store.head_position(), [SIGNAL])
        try:
            collector.wait_caught_up()
            assert collector.records([stream]) == []
            store.append(stream, records(2), 3)
            assert [r.seq for r in collector.wait_records([stream], 2)] == [4, 5]
        finally:
            collector.stop()

    def test_no_gap_and_no_duplicate_across_the_switch_to_live(
        self, store: EventStore
    ) -> None:
        """Subscriptions started at several moments while a writer appends: each one
        switches from history to live while events land, and must see each exactly once."""
        start = store.head_position()
        stream = new_stream()
        history = 60
        milestones = [0, 50, 100, 150, 200]
        for i in range(0, history, 20):
            store.append(stream, [record(SIGNAL if k % 4 else NOISE, i + k)
                                  for k in range(20)], expect(i))
        writer = _Writer(store, stream, history, 250, milestones)
        collectors: list[Collector] = []
        try:
            writer.start()
            for m in milestones:  # subscribe while writes land
                assert writer.reached(m, TIMEOUT)
                collectors.append(self.collect(store, start, [SIGNAL]))
            writer.join(TIMEOUT * 2)
            assert not writer.errors
            expected = [r for r in store.read_stream(stream) if r.wire_name == SIGNAL]
            for collector in collectors:
                got = collector.wait_records([stream], len(expected))
                assert [r.seq for r in got] == [r.seq for r in expected]
                assert got == expected
        finally:
            writer.stop(TIMEOUT)
            for collector in collectors:
                collector.stop()
        for collector in collectors:
            _assert_monotonic(collector.snapshot())
            assert len([i for i in collector.snapshot() if isinstance(i, CaughtUp)]) == 1

    def test_events_landing_right_after_each_head_read_are_not_lost(
        self, store: EventStore
    ) -> None:
        """Deterministic version of the switch race: whenever the subscription's read of the
        head (``head_reader``) finds nothing new, i.e. it is about to decide it is caught up or
        to wait, an append lands right after the read, as if another writer committed in
        between."""
        start = store.head_position()
        stream = new_stream()
        store.append(stream, records(5), StreamState.NO_STREAM)
        injected = 30
        with _HostileHead(store, self.head_reader, stream, injected) as hostile:
            collector = self.collect(store, start, [SIGNAL])
            try:
                collector.wait_caught_up()
                mark = record(SIGNAL, -1)
                store.append(stream, [mark], StreamState.ANY)
                assert collector.wait(lambda items: any(
                    isinstance(i, StoredRecord) and i.event_id == mark.event_id for i in items
                ))
                assert collector.wait(lambda _: len(hostile.done) >= injected)
                expected = [r for r in store.read_stream(stream) if r.wire_name == SIGNAL]
                got = collector.wait_records([stream], len(expected))
                assert got == expected
            finally:
                collector.stop()
        _assert_monotonic(collector.snapshot())

    def test_history_longer_than_a_page_with_sparse_matches(self, store: EventStore) -> None:
        start = store.head_position()
        stream = new_stream()
        total = 2600
        batch = 200
        for i in range(0, total, batch):
            store.append(stream, [record(SIGNAL if (i + k) % 7 == 0 else NOISE, i + k)
                                  for k in range(batch)], expect(i))
        collector = self.collect(store, start, [SIGNAL])
        try:
            collector.wait_caught_up()
            got = collector.records([stream])
            assert [r.seq for r in got] == [s for s in range(1, total + 1) if (s - 1) % 7 == 0]
        finally:
            collector.stop()
        _assert_monotonic(collector.snapshot())

    def test_checkpoints_advance_over_filtered_out_history(self, store: EventStore) -> None:
        start = store.head_position()
        stream = new_stream()
        store.append(stream, records(self.checkpoint_stretch, NOISE), StreamState.NO_STREAM)
        last = store.read_stream(stream, backwards=True, limit=1)[0].position
        collector = self.collect(store, start, [SIGNAL])
        try:
            assert collector.wait(lambda items: any(
                isinstance(i, Checkpoint) and i.position >= last for i in items
            ))
            collector.wait_caught_up()
            assert collector.records([stream]) == []
        finally:
            collector.stop()
        _assert_monotonic(collector.snapshot())

    def test_checkpoints_advance_over_filtered_out_live_events(
        self, store: EventStore
    ) -> None:
        stream = new_stream()
        collector = self.collect(store, store.head_position(), [SIGNAL])
        try:
            caught_up = collector.wait_caught_up()
            for i in range(self.checkpoint_stretch):
                store.append(stream, [record(NOISE, i)], expect(i))
            last = store.read_stream(stream, backwards=True, limit=1)[0].position
            assert collector.wait(lambda items: any(
                isinstance(i, Checkpoint) and i.position >= last for i in items
            ))
            assert collector.records([stream]) == []
            # a checkpoint never skips a matching event committed after it
            store.append(stream, records(1), self.checkpoint_stretch)
            got = collector.wait_records([stream], 1)
            assert got[0].position > last > caught_up.position
        finally:
            collector.stop()
        _assert_monotonic(collector.snapshot())

    def test_in_process_append_wakes_a_waiting_subscriber_promptly(self) -> None:
        store = self.create_store_with_slow_poll()
        try:
            stream = new_stream()
            collector = self.collect(store, store.head_position(), [SIGNAL])
            try:
                collector.wait_caught_up()
                for i in range(3):
                    began = time.monotonic()
                    store.append(stream, [record(SIGNAL, i)], expect(i))
                    collector.wait_records([stream], i + 1, timeout=TIMEOUT)
                    elapsed = time.monotonic() - began
                    assert elapsed < 0.5, f"woken after {elapsed:.2f}s (poll interval is ~5s)"
            finally:
                collector.stop()
        finally:
            self.dispose_store(store)

    def test_stop_ends_a_waiting_subscription_promptly(self) -> None:
        store = self.create_store_with_slow_poll()
        try:
            collector = self.collect(store, store.head_position(), [SIGNAL])
            collector.wait_caught_up()
            began = time.monotonic()
            collector.stop()
            assert time.monotonic() - began < 1.0
            assert collector.done
            with store.subscribe(after=store.head_position()) as sub:
                assert not sub.stopped
            assert sub.stopped
        finally:
            self.dispose_store(store)

    def test_subscription_delivers_events_appended_by_another_process(
        self, store: EventStore, opener: Opener, mp: Processes
    ) -> None:
        stream = new_stream()
        collector = self.collect(store, store.head_position(), [SIGNAL])
        try:
            collector.wait_caught_up()
            go = mp.ctx.Event()
            out = mp.ctx.Queue()
            mp.start(_proc_append, opener, stream, 20, go, out)
            go.set()
            kind, _, positions = out.get(timeout=self.cross_process_timeout)
            assert kind == "appended", positions
            got = collector.wait_records([stream], 20)
            assert [r.position for r in got] == positions
            assert [r.seq for r in got] == list(range(1, 21))
            mp.join()
            # and this process's own appends still arrive after the other process's
            store.append(stream, records(1), 20)
            assert collector.wait_records([stream], 21)[-1].seq == 21
        finally:
            collector.stop()

    def test_two_writer_processes_and_a_subscriber_process(
        self, store: EventStore, opener: Opener, mp: Processes
    ) -> None:
        start = store.head_position()
        streams = [new_stream(), new_stream()]
        per_writer = 100
        ready, go = mp.ctx.Event(), mp.ctx.Event()
        out = mp.ctx.Queue()
        mp.start(_proc_subscribe, opener, start, streams, per_writer * 2, ready, out)
        local = self.collect(store, start, [SIGNAL])
        try:
            assert ready.wait(self.cross_process_timeout), "subscriber process never caught up"
            for stream in streams:
                mp.start(_proc_append, opener, stream, per_writer, go, out)
            go.set()
            written: dict[str, list[int]] = {}
            seen: list[tuple[str, int, int]] = []
            for _ in range(3):
                message = out.get(timeout=self.cross_process_timeout * 2)
                assert message[0] != "error", message
                if message[0] == "seen":
                    seen = [tuple(x) for x in message[1]]
                else:
                    written[message[1]] = message[2]
            positions = sorted(p for s in streams for p in written[s])
            assert len(positions) == per_writer * 2
            # nothing lost, nothing duplicated, delivered in position order
            assert [p for _, _, p in seen] == positions
            for stream in streams:
                assert [q for s, q, _ in seen if s == stream] == list(range(1, per_writer + 1))
            stored = [r for r in _read_all(store, start, 100_000, [SIGNAL]) if r.stream in streams]
            assert [(r.stream, r.seq, r.position) for r in stored] == seen
            got = local.wait_records(streams, per_writer * 2)
            assert [(r.stream, r.seq, r.position) for r in got] == seen
        finally:
            local.stop()

    # --- subscriptions to some streams ------------------------------------------------------

    def test_stream_subscription_delivers_only_its_streams_history_then_live(
        self, store: EventStore
    ) -> None:
        start = store.head_position()
        a, b, c = new_stream(), new_stream(), new_stream()
        for i in range(3):
            for stream in (a, b, c):
                store.append(stream, [record(SIGNAL if i % 2 == 0 else NOISE, i)], expect(i))
        collector = self.collect(store, start, streams=[a, c])
        try:
            caught_up = collector.wait_caught_up()
            items = collector.snapshot()
            history = _records_in(items[: items.index(caught_up)])
            assert [(r.stream, r.seq) for r in history] == [
                (a, 1), (c, 1), (a, 2), (c, 2), (a, 3), (c, 3)]
            assert history == _by_position(store, [a, c])
            store.append(b, [record(SIGNAL, 3)], 3)
            store.append(c, [record(NOISE, 3)], 3)
            store.append(b, [record(SIGNAL, 4)], 4)
            store.append(a, [record(SIGNAL, 3)], 3)
            got = collector.wait_records([a, c], 8)
            assert [(r.stream, r.seq) for r in got[6:]] == [(c, 4), (a, 4)]
            assert got == _by_position(store, [a, c])
            # b's events (and any other stream's) came before a's last: none was delivered
            assert {r.stream for r in _records_in(collector.snapshot())} == {a, c}
        finally:
            collector.stop()
        _assert_monotonic(collector.snapshot())

    def test_stream_subscription_combines_with_wire_names(self, store: EventStore) -> None:
        start = store.head_position()
        a, b = new_stream(), new_stream()
        store.append(a, [record(SIGNAL if i % 2 == 0 else NOISE, i) for i in range(4)],
                     StreamState.NO_STREAM)
        store.append(b, records(2), StreamState.NO_STREAM)
        collector = self.collect(store, start, [SIGNAL], streams=[a])
        try:
            collector.wait_caught_up()
            assert [r.seq for r in collector.records([a])] == [1, 3]
            store.append(a, [record(NOISE, 4)], 4)
            store.append(b, [record(SIGNAL, 2)], 2)
            store.append(a, [record(SIGNAL, 5)], 5)
            assert [r.seq for r in collector.wait_records([a], 3)] == [1, 3, 6]
            delivered = _records_in(collector.snapshot())
            assert {(r.stream, r.wire_name) for r in delivered} == {(a, SIGNAL)}
        finally:
            collector.stop()
        _assert_monotonic(collector.snapshot())

    def test_stream_subscription_to_no_streams_delivers_only_markers(
        self, store: EventStore
    ) -> None:
        start = store.head_position()
        stream = new_stream()
        store.append(stream, records(self.checkpoint_stretch), StreamState.NO_STREAM)
        last = store.read_stream(stream, backwards=True, limit=1)[0].position
        collector = self.collect(store, start, streams=[])
        try:
            assert collector.wait(lambda items: any(
                isinstance(i, Checkpoint) and i.position >= last for i in items))
            collector.wait_caught_up()
            for i in range(self.checkpoint_stretch):
                store.append(stream, [record(SIGNAL, i)], self.checkpoint_stretch + i)
            last = store.read_stream(stream, backwards=True, limit=1)[0].position
            assert collector.wait(lambda items: any(
                isinstance(i, Checkpoint) and i.position >= last for i in items))
            assert _records_in(collector.snapshot()) == []
        finally:
            collector.stop()
        _assert_monotonic(collector.snapshot())

    def test_stream_subscription_checkpoints_past_other_streams_events(
        self, store: EventStore
    ) -> None:
        """A reader of an idle stream still moves forward: past the other streams' history,
        and past their live events (which its wire names alone would deliver)."""
        start = store.head_position()
        watched, other = new_stream(), new_stream()
        store.append(other, records(self.checkpoint_stretch), StreamState.NO_STREAM)
        last = store.read_stream(other, backwards=True, limit=1)[0].position
        collector = self.collect(store, start, [SIGNAL], streams=[watched])
        try:
            assert collector.wait(lambda items: any(
                isinstance(i, Checkpoint) and i.position >= last for i in items))
            caught_up = collector.wait_caught_up()
            for i in range(self.checkpoint_stretch):
                store.append(other, [record(SIGNAL, i)], self.checkpoint_stretch + i)
            last = store.read_stream(other, backwards=True, limit=1)[0].position
            assert collector.wait(lambda items: any(
                isinstance(i, Checkpoint) and i.position >= last for i in items))
            assert _records_in(collector.snapshot()) == []
            # a checkpoint never skips an event of the stream committed after it
            store.append(watched, records(1), StreamState.NO_STREAM)
            got = collector.wait_records([watched], 1)
            assert got[0].position > last > caught_up.position
            assert [r.stream for r in _records_in(collector.snapshot())] == [watched]
        finally:
            collector.stop()
        _assert_monotonic(collector.snapshot())

    def test_stream_subscription_matches_names_exactly(self, store: EventStore) -> None:
        """Names are names, not patterns: regex metacharacters in them match themselves, and
        a name matches neither a longer one nor one it ends."""
        start = store.head_position()
        base = f"contract-{uuid4().hex}"
        dotted, special = f"{base}-a.b", f"{base}-(x|y) *+?[z]{{2}}^$\\#"
        decoys = [f"{base}-aXb", f"{base}-a.b-more", f"more-{base}-a.b", f"{base}-a",
                  f"{base}-x", f"{base}-xx", f"{base}-(x|y)", f"{base}-y zz^$\\#"]
        for i, stream in enumerate([dotted, *decoys, special]):
            store.append(stream, [record(SIGNAL, i)], StreamState.NO_STREAM)
        collector = self.collect(store, start, streams=[dotted, special])
        try:
            collector.wait_caught_up()
            assert [r.stream for r in collector.records([dotted, special])] == [dotted, special]
            for stream in [*decoys, special, dotted]:
                store.append(stream, [record(SIGNAL, 1)], 1)
            got = collector.wait_records([dotted, special], 4)
            assert [(r.stream, r.seq) for r in got] == [
                (dotted, 1), (special, 1), (special, 2), (dotted, 2)]
            assert _records_in(collector.snapshot()) == got
        finally:
            collector.stop()

    def test_stream_subscription_to_thousands_of_streams(self, store: EventStore) -> None:
        start = store.head_position()
        watched = [new_stream() for _ in range(2000)]
        written, others = watched[::50], [new_stream() for _ in range(40)]
        for mine, theirs in zip(written, others, strict=True):  # 640 events in all
            store.append(theirs, records(8), StreamState.NO_STREAM)
            store.append(mine, records(8), StreamState.NO_STREAM)
        collector = self.collect(store, start, streams=watched)
        try:
            collector.wait_caught_up()
            assert collector.records(watched) == _by_position(store, written)
            late = [watched[-1], watched[1], written[3]]
            for mine, theirs in zip(late, others, strict=False):
                store.append(theirs, records(1), 8)
                store.append(mine, [record(SIGNAL, 9)], StreamState.ANY)
            got = collector.wait_records(watched, len(written) * 8 + 3)
            assert [r.stream for r in got[-3:]] == late
            assert _records_in(collector.snapshot()) == got == _by_position(
                store, list(dict.fromkeys([*written, *late])))
        finally:
            collector.stop()
        _assert_monotonic(collector.snapshot())

    def test_deleted_events_are_gone_from_stream_subscriptions(self, store: EventStore) -> None:
        start = store.head_position()
        doomed, kept, other = new_stream(), new_stream(), new_stream()
        store.append(doomed, records(3), StreamState.NO_STREAM)
        store.append(kept, records(2), StreamState.NO_STREAM)
        store.append(other, records(2), StreamState.NO_STREAM)
        store.delete_stream(doomed)
        collector = self.collect(store, start, streams=[doomed, kept])
        try:
            collector.wait_caught_up()
            assert [(r.stream, r.seq) for r in _records_in(collector.snapshot())] == [
                (kept, 1), (kept, 2)]
        finally:
            collector.stop()

    # --- damaged records ------------------------------------------------------------------

    def test_undecodable_json_raises_corrupt_record_naming_the_position(
        self, store: EventStore
    ) -> None:
        stream = new_stream()
        store.append(stream, [NewRecord(uuid4(), "user/message", b"{not json", META)],
                     StreamState.NO_STREAM)
        stored = store.read_stream(stream)[0]
        with pytest.raises(CorruptRecord) as info:
            decode(stored)
        assert info.value.position == stored.position
        assert str(stored.position) in str(info.value)

    def test_damaged_raw_record_raises_corrupt_record_everywhere(
        self, store: EventStore
    ) -> None:
        start = store.head_position()
        stream = new_stream()
        store.append(stream, records(3), StreamState.NO_STREAM)
        damaged = store.read_stream(stream)[1]
        self.corrupt_record(store, damaged)
        with pytest.raises(CorruptRecord) as info:
            store.read_stream(stream)
        assert info.value.position == damaged.position
        assert str(damaged.position) in str(info.value)
        with pytest.raises(CorruptRecord) as info:
            _read_all(store, start, 10_000)
        assert info.value.position == damaged.position
        delivered: list[SubscriptionItem] = []
        with store.subscribe(after=start, wire_names=[SIGNAL]) as sub:
            with pytest.raises(CorruptRecord) as info:
                for item in sub:  # pragma: no branch - raises before catching up
                    delivered.append(item)
        assert info.value.position == damaged.position
        # never skipped: nothing at or after the damaged record was delivered
        assert not [
            i for i in delivered if isinstance(i, StoredRecord) and i.position >= damaged.position
        ]
        assert not [i for i in delivered if isinstance(i, CaughtUp)]

    # --- identity ---------------------------------------------------------------------------

    def test_store_id_is_stable_shared_by_every_opener_and_not_an_event(
        self, store: EventStore
    ) -> None:
        stream = new_stream()
        before = store.append(stream, records(2), StreamState.NO_STREAM).position
        store_id = store.store_id()
        assert isinstance(store_id, str) and store_id
        assert store.store_id() == store_id
        # recording it wrote no event: the head and reads of the log do not move
        assert store.head_position() == before
        assert [r.stream for r in _read_all(store, before, 100)] == []
        opener = self.other_process_opener()
        if opener is not None:  # another instance on the same store (in this process)
            other = opener()
            try:
                assert other.store_id() == store_id
            finally:
                self.dispose_store(other)

    def test_another_store_has_another_id(self, store: EventStore,
                                          request: pytest.FixtureRequest) -> None:
        opener = self.other_store_opener(request)
        if opener is None:
            pytest.skip(f"{type(self).__name__} cannot create a second store")
        other = opener()
        try:
            assert other.store_id() not in (None, store.store_id())
        finally:
            self.dispose_store(other)

    def test_racing_openers_of_a_new_store_agree_on_one_id(
        self, request: pytest.FixtureRequest
    ) -> None:
        opener = self.other_store_opener(request)
        if opener is None:
            pytest.skip(f"{type(self).__name__} cannot create a second store")
        opened: list[EventStore] = []
        ids: list[str | None] = []
        gate = threading.Barrier(4)

        def open_and_ask() -> None:
            gate.wait(TIMEOUT)
            store = opener()
            opened.append(store)
            ids.append(store.store_id())

        threads = [threading.Thread(target=open_and_ask) for _ in range(4)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join(TIMEOUT)
            assert len(ids) == 4 and len(set(ids)) == 1 and ids[0]
            again = opener()
            opened.append(again)
            assert again.store_id() == ids[0]  # written once, read back ever after
        finally:
            for store in opened:
                self.dispose_store(store)

    # --- deletion and snapshots -----------------------------------------------------------

    def test_delete_stream(self, store: EventStore) -> None:
        doomed, kept = new_stream(), new_stream()
        store.append(doomed, records(3), StreamState.NO_STREAM)
        store.append(kept, records(2), StreamState.NO_STREAM)
        store.write_snapshot(doomed, 3, b"state")
        kept_before = store.read_stream(kept)
        store.delete_stream(doomed)
        assert store.read_stream(doomed) == []
        assert store.stream_version(doomed) == 0
        assert store.read_snapshot(doomed) is None
        assert store.read_stream(kept) == kept_before
        store.delete_stream(new_stream())  # deleting an unknown stream is harmless

    def test_a_deleted_stream_is_never_written_again(self, store: EventStore) -> None:
        """A purged session's id is not reused (its purge is on record): as EventStoreDB's
        tombstone, every store refuses new events to a deleted stream, and writes nothing."""
        doomed = new_stream()
        store.append(doomed, records(2), StreamState.NO_STREAM)
        store.delete_stream(doomed)
        head = store.head_position()
        for expected in (StreamState.NO_STREAM, StreamState.ANY, 0):
            with pytest.raises(StreamDeleted):
                store.append(doomed, records(1), expected)
        assert store.read_stream(doomed) == [] and store.head_position() == head

    def test_deleted_events_are_gone_from_read_all_and_subscriptions(
        self, store: EventStore
    ) -> None:
        start = store.head_position()
        doomed, kept = new_stream(), new_stream()
        store.append(doomed, records(3), StreamState.NO_STREAM)
        store.append(kept, records(2), StreamState.NO_STREAM)
        store.delete_stream(doomed)
        assert {r.stream for r in _read_all(store, start, 10_000)} & {doomed} == set()
        collector = self.collect(store, start, [SIGNAL])
        try:
            collector.wait_caught_up()
            assert collector.records([doomed]) == []
            assert [r.seq for r in collector.records([kept])] == [1, 2]
        finally:
            collector.stop()

    def test_snapshots_round_trip(self, store: EventStore) -> None:
        stream = new_stream()
        assert store.read_snapshot(stream) is None
        store.write_snapshot(stream, 5, b'{"a":1}')
        assert store.read_snapshot(stream) == (5, b'{"a":1}')
        store.write_snapshot(stream, 3, b"older")  # an older snapshot never replaces a newer
        assert store.read_snapshot(stream) == (5, b'{"a":1}')
        store.write_snapshot(stream, 9, b'{"a":2}')
        assert store.read_snapshot(stream) == (9, b'{"a":2}')
        other = new_stream()
        assert store.read_snapshot(other) is None

    # --- the Session aggregate end to end ------------------------------------------------

    def test_session_round_trip(self, store: EventStore) -> None:
        repo = SessionRepository(store)
        session = Session.start(agent="helper", roles={"main": "openai:gpt-4o"})
        repo.save(session)
        session.start_turn(text="hello")
        session.start_step("openai:gpt-4o")
        session.record_assistant("", [ToolCallData(id="c1", name="fs.read", args={"p": "x"})])
        session.record_tool_result("c1", "fs.read", "contents")
        session.end_step(UsageData(prompt_tokens=10, completion_tokens=2))
        session.end_turn("completed")
        result = repo.save(session)
        assert result is not None and result.version == 8
        stream = session_stream(session.id)
        assert [r.wire_name for r in store.read_stream(stream)] == [
            "session/started", "turn/start", "user/message", "step/start",
            "assistant/message", "tool/result", "step/end", "turn/end",
        ]
        loaded = repo.get(session.id)
        assert loaded.version == 8
        assert loaded.state == session.state
        assert loaded.state.agent == "helper"
        assert not loaded.turn_open and loaded.current_turn == 1
        events = [decode(r) for r in store.read_stream(stream)]
        assert getattr(events[6].payload, "usage", None) == UsageData(prompt_tokens=10,
                                                                      completion_tokens=2)
        assert all(e.session_id == session.id for e in events)

    def test_refused_commands_raise_typed_errors_and_append_nothing(
        self, store: EventStore
    ) -> None:
        repo = SessionRepository(store)
        session = Session.start()
        session.start_turn(text="hi")
        repo.save(session)
        stream = session_stream(session.id)
        head = store.read_stream(stream)
        loaded = repo.get(session.id)
        with pytest.raises(TurnOpenInLog):
            loaded.start_turn(text="again")
        with pytest.raises(ToolCallNotOwed):
            loaded.record_tool_result("nope", "fs.read", "x")
        assert loaded.pending_events == []
        assert repo.save(loaded) is None
        assert store.read_stream(stream) == head

    def test_session_conflict_and_idempotent_retry(self, store: EventStore) -> None:
        repo = SessionRepository(store)
        session = Session.start()
        repo.save(session)
        a, b = repo.get(session.id), repo.get(session.id)
        a.set_model("main", "openai:gpt-4o")
        b.queue("from the cli")
        repo.save(a)
        with pytest.raises(WrongExpectedVersion) as info:
            repo.save(b)
        assert info.value.actual == 2
        assert len(b.pending_events) == 1  # kept, so the caller may reload and retry
        # R7: an append whose outcome was lost, retried with the same event ids
        c = repo.get(session.id)
        c.update_policy(["fs.*"], by=Actor(actor="operator"))
        records_ = repo.records_of(c)
        first = store.append(session_stream(session.id), records_, 2)
        retried = repo.save(c)
        assert retried is not None and retried.position == first.position
        assert store.stream_version(session_stream(session.id)) == 3

    def test_unknown_session_is_not_found(self, store: EventStore) -> None:
        with pytest.raises(SessionNotFound):
            SessionRepository(store).get(uuid4())

    def test_loading_a_long_session_reads_the_snapshot_and_the_tail(
        self, store: EventStore
    ) -> None:
        repo = SessionRepository(store, snapshot_every=50)
        session = Session.start(agent="long")
        repo.save(session)
        while session.version < 130:
            session.start_turn(text=f"turn {session.current_turn + 1}")
            for i in range(8):
                session.set_model("main", f"openai:m{i}")
            session.end_turn("completed")
            repo.save(session)
        total = session.version
        stream = session_stream(session.id)
        snapshot = store.read_snapshot(stream)
        assert snapshot is not None and 100 <= snapshot[0] < total
        reads: list[dict[str, Any]] = []
        original = store.read_stream

        def spy(stream_: str, **kwargs: Any) -> list[StoredRecord]:
            found = original(stream_, **kwargs)
            reads.append({**kwargs, "count": len(found)})
            return found

        store.read_stream = spy  # type: ignore[method-assign,assignment]
        try:
            loaded = repo.get(session.id)
        finally:
            del store.read_stream
        # One read, from the snapshot's own last event: finding it says the log is still the
        # one the snapshot was taken of (a purge deletes it).
        assert reads == [{"from_seq": snapshot[0], "count": total - snapshot[0] + 1}]
        assert loaded.version == total
        assert loaded.state == session.state
        assert loaded.state == _replay_from_scratch(store, session.id).state
        # a damaged snapshot is ignored: the session is replayed from its events
        store.write_snapshot(stream, 10_000, b"not a snapshot")
        assert repo.get(session.id).state == session.state


    # --- the library's ApplicationRecorder, on top of the extension ------------------------

    def test_library_events_are_a_stream_of_their_originator(self, store: EventStore) -> None:
        from eventsourcing.persistence import IntegrityError, StoredEvent

        originator = uuid4()
        events = [StoredEvent(originator, v, f"contract.topic/{v}", b'{"v":%d}' % v)
                  for v in (1, 2)]
        ids = store.insert_events(events)
        stored = store.read_stream(str(originator))
        assert [(r.seq, r.wire_name, r.data) for r in stored] == [
            (1, "contract.topic/1", b'{"v":1}'), (2, "contract.topic/2", b'{"v":2}')]
        assert list(ids or []) == [r.position for r in stored]
        assert store.select_events(originator) == events
        assert store.select_events(originator, gt=1) == events[1:]
        assert store.select_events(originator, desc=True, limit=1) == events[1:]
        with pytest.raises(IntegrityError):
            store.insert_events(events[1:])
        notes = store.select_notifications(stored[0].position, 10, stop=stored[-1].position)
        assert [(n.id, n.originator_id, n.originator_version, n.topic) for n in notes
                if n.originator_id == originator] == [
            (r.position, originator, r.seq, r.wire_name) for r in stored]
        assert (store.max_notification_id() or 0) >= stored[-1].position

    def test_library_subscription_is_the_stores_own(self, store: EventStore) -> None:
        start = store.head_position()
        stream = new_stream()
        store.append(stream, records(2), StreamState.NO_STREAM)
        got = []
        with store.subscribe(gt=start, topics=[SIGNAL]) as subscription:
            for notification in subscription:
                got.append(notification)
                if len(got) == 2:
                    break
            store.append(stream, [record(SIGNAL, 2)], 2)  # live, after the history
            got.append(next(subscription))
        assert [(n.originator_id, n.originator_version, n.topic) for n in got] == [
            (stream, 1, SIGNAL), (stream, 2, SIGNAL), (stream, 3, SIGNAL)]
        assert [n.id for n in got] == [r.position for r in store.read_stream(stream)]

    def test_library_versions_numbered_from_zero(self, store: EventStore) -> None:
        from eventsourcing.persistence import IntegrityError, StoredEvent

        originator = uuid4()
        events = [StoredEvent(originator, v, "contract.topic", b"{}") for v in range(3)]
        store.insert_events(events[:1])
        store.insert_events(events[1:])
        assert [r.seq for r in store.read_stream(str(originator))] == [1, 2, 3]
        assert store.select_events(originator) == events
        assert store.select_events(originator, lte=1) == events[:2]
        with pytest.raises(IntegrityError):
            store.insert_events(events[2:])

class _Writer:
    """Appends ``count`` events one at a time to ``stream`` (which holds ``first``), on a
    thread (every fourth a NOISE, the others SIGNALs); ``reached(n)`` waits until it is about to
    append its ``n``-th (one of ``milestones``)."""

    def __init__(self, store: EventStore, stream: str, first: int, count: int,
                 milestones: Sequence[int]) -> None:
        self.store, self.stream, self.first, self.count = store, stream, first, count
        self._reached = {m: threading.Event() for m in milestones}
        self._stop = threading.Event()
        self.errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        try:
            for n in range(self.count):
                if n in self._reached:
                    self._reached[n].set()
                if self._stop.is_set():
                    return
                i = self.first + n
                self.store.append(self.stream, [record(SIGNAL if i % 4 else NOISE, i)], i)
        except BaseException as exc:
            self.errors.append(exc)

    def start(self) -> None:
        self._thread.start()

    def reached(self, milestone: int, timeout: float) -> bool:
        return self._reached[milestone].wait(timeout)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def stop(self, timeout: float) -> None:
        self._stop.set()
        self._thread.join(timeout)


class _HostileHead:
    """While entered, the store's head reader (``path``, dotted from the store) is replaced
    by one that, whenever a read finds the head where the read before it did, appends one
    event to ``stream`` right after the read (``count`` of them at most, mostly SIGNALs), as
    if another writer committed in between; ``done`` counts them."""

    def __init__(self, store: EventStore, path: str, stream: str, count: int) -> None:
        owner: Any = store
        *parts, self._name = path.split(".")
        for part in parts:
            owner = getattr(owner, part)
        self._owner = owner
        self._real = getattr(owner, self._name)
        self._store, self._stream, self._count = store, stream, count
        self._lock = threading.Lock()
        self._reads: list[int] = []
        self.done: list[int] = []

    def __enter__(self) -> _HostileHead:
        setattr(self._owner, self._name, self._head)
        return self

    def __exit__(self, *exc: object) -> None:
        delattr(self._owner, self._name)

    def _head(self, *args: Any, **kwargs: Any) -> int:
        with self._lock:
            head: int = self._real(*args, **kwargs)
            if self._reads and self._reads[-1] == head and len(self.done) < self._count:
                n = len(self.done)
                name = NOISE if n % 3 == 2 else SIGNAL
                self._store.append(self._stream, [record(name, n)], StreamState.ANY)
                self.done.append(n)
            self._reads.append(head)
            return head


def _records_in(items: Sequence[SubscriptionItem]) -> list[StoredRecord]:
    return [i for i in items if isinstance(i, StoredRecord)]


def _by_position(store: EventStore, streams: Sequence[str]) -> list[StoredRecord]:
    """Every event of ``streams``, in position order."""
    return sorted((r for s in streams for r in store.read_stream(s)), key=lambda r: r.position)


def _read_all(store: EventStore, after: int, limit: int,
              wire_names: Sequence[str] | None = None) -> list[StoredRecord]:
    """Every record after ``after`` (paging through ``read_all``), at most ``limit``."""
    found: list[StoredRecord] = []
    while len(found) < limit:
        page = store.read_all(after=after, limit=500, wire_names=wire_names)
        if not page:
            break
        found.extend(page)
        after = page[-1].position
    return found[:limit]


def _replay_from_scratch(store: EventStore, session_id: UUID) -> Session:
    session = Session.restore(session_id, 0, SessionState())
    for stored in store.read_stream(session_stream(session_id)):
        session.replay(decode(stored))
    return session


def _assert_one_winner_per_round(outcomes: Sequence[Sequence[Any]], rounds: int) -> None:
    assert len(outcomes) == 2 * rounds, outcomes
    for r in range(rounds):
        this_round = sorted((o[2], o[3]) for o in outcomes if o[1] == r)
        # the winner made the stream version r+1; the loser was told it is r+1
        assert this_round == [("lost", r + 1), ("won", r + 1)], (r, this_round)


def _assert_monotonic(items: Sequence[SubscriptionItem]) -> None:
    """Positions never go back; records never repeat a position; a checkpoint or the caught-up
    mark is never followed by a record at or before its position."""
    last_record = 0
    last_mark = 0
    for item in items:
        if isinstance(item, StoredRecord):
            assert item.position > last_record, (item, last_record)
            assert item.position > last_mark, (item, last_mark)
            last_record = item.position
        else:
            assert item.position >= last_mark, (item, last_mark)
            assert item.position >= last_record, (item, last_record)
            last_mark = item.position
