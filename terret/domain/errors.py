"""Typed errors. Every refusal in Terret raises one of these; none of them appends anything."""

from __future__ import annotations

from typing import Any


class TerretError(Exception):
    """Base of every error Terret raises on purpose."""


SHOWN_MAX = 60
"""How many characters of a value an error message quotes (a 5 MB call id is not echoed)."""


def shown(value: object, limit: int = SHOWN_MAX) -> str:
    """``repr(value)`` for an error message, cut to about ``limit`` characters (saying how long
    the value was when cut). ``repr`` escapes lone surrogates, so the message can be printed."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f" ({len(value)} characters)" if isinstance(value, str | bytes) else ""
    return f"{text[:limit - 1]}…{size}"


def require_flags(what: str, holder: object, *names: str) -> None:
    """``ConfigurationError`` unless each named attribute of ``holder`` is True or False: a
    truthy string ("no") or number would switch a behaviour on unnoticed."""
    for name in names:
        value = getattr(holder, name)
        if type(value) is not bool:
            raise ConfigurationError(f"{what}: {name} is True or False, not {value!r}")


# --- events and payloads -------------------------------------------------------------------


class EventError(TerretError):
    """Something is wrong with an event type or its payload."""


class InvalidPayload(EventError):
    """A payload failed validation. ``field`` names the first offending field.

    Commands raise it for a value they cannot record whatever the session's state (text that is
    not valid Unicode, a malformed pattern, spec or name): the CLI reports it as a usage error."""

    def __init__(self, wire_name: str, field: str, message: str) -> None:
        self.wire_name = wire_name
        self.field = field
        super().__init__(f"invalid {wire_name} payload: field {field!r}: {message}")


class UnknownEventType(EventError):
    """A wire name or payload class that is not registered in the catalogue."""


class DuplicateEventType(EventError):
    """A wire name registered twice with different payload models."""


# --- stores ----------------------------------------------------------------------------------


class StoreError(TerretError):
    """A store could not do what was asked."""


class WrongExpectedVersion(StoreError):
    """An append's expected version did not match the stream. ``actual`` is the stream's version
    (0 when the stream does not exist)."""

    def __init__(self, stream: str, expected: Any, actual: int) -> None:
        self.stream = stream
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"stream {stream!r} is at version {actual}, not the expected {expected}"
        )


class PayloadTooLarge(StoreError):
    """An event's data exceeds the store's limit (EventStoreDB refuses records over 1 MiB)."""

    def __init__(self, wire_name: str, size: int, limit: int) -> None:
        self.wire_name = wire_name
        self.size = size
        self.limit = limit
        super().__init__(f"{wire_name} payload is {size} bytes; the limit is {limit} bytes")


class CorruptRecord(StoreError):
    """A stored record could not be decoded. Never skipped silently."""

    def __init__(self, position: int, reason: str) -> None:
        self.position = position
        self.reason = reason
        super().__init__(f"record at position {position} cannot be decoded: {reason}")


class StoreUnavailable(StoreError):
    """The store could not be reached, and retrying did not help."""


class StreamDeleted(StoreError):
    """The stream was purged or tombstoned."""


class ExpiryUnsupported(StoreError):
    """A stream's expiry (``purge --max-age``) was asked of a store that cannot expire streams
    itself (SQLite, memory): nothing is recorded, the session stays as it was."""


class InvalidStoreURI(StoreError):
    """A store URI that Terret cannot use."""


# --- the session and its rules ---------------------------------------------------------------


class RuleViolation(TerretError):
    """A command was refused by one of the numbered rules of the session's lifecycle."""

    rule: str = ""


class SessionNotFound(TerretError):
    """No session with that id exists in the store."""


class SessionExpiring(SessionNotFound):
    """The session was purged with a max age (R27) and the store has dropped its oldest events
    already: what is left expires too. Not a damaged log; it can still be deleted now."""


class PurgeUnfinished(SessionNotFound):
    """The session's purge is recorded (``session/purged``, R27) but its log is still in the
    store: the process purging it stopped between the two (a kill, an outage). The views have
    forgotten it; running the purge again (``terret sessions purge``) finishes it, and a serving
    process finishes one it hears of."""


class SessionClosed(RuleViolation):
    """The session was closed; it accepts no new turns or events."""

    rule = "R25"


class TurnOpenInLog(RuleViolation):
    """``run_turn`` on a session whose log holds an open turn: resume it instead (R4)."""

    rule = "R4"


class TurnAlreadyRunning(RuleViolation):
    """The session's agent is already mid-turn in this process (R4)."""

    rule = "R4"


class NoOpenTurn(RuleViolation):
    """The command needs an open turn and the log holds none (R14, R26)."""

    rule = "R14"


class StepOpen(RuleViolation):
    """A step is already open; close it before starting another."""

    rule = "R15"


class NoOpenStep(RuleViolation):
    """The command needs an open step."""

    rule = "R15"


class MaxStepsExceeded(RuleViolation):
    """A turn tried to take more than ``max_steps`` steps (R2)."""

    rule = "R2"


class ToolCallNotOwed(RuleViolation):
    """A tool result names a call the last assistant message did not make, or one already
    answered (R26: a result for a closed turn is rejected, not written)."""

    rule = "R26"


class ApprovalNotPending(RuleViolation):
    """A verdict names a call that is not pending in the open turn (R11)."""

    rule = "R11"


class ApprovalAlreadyRequested(RuleViolation):
    """An approval was already requested for that call in the open turn."""

    rule = "R10"


class CallInDoubt(RuleViolation):
    """A call of a tool that may not run twice started before and has no result: it may have
    taken effect. It runs again only on an operator's ``rerun`` verdict (R15)."""

    rule = "R15"


class CallNotInDoubt(RuleViolation):
    """A verdict names a call that is not in doubt in the open turn (or for other arguments),
    or a call that did not start is marked in doubt (R15)."""

    rule = "R15"


class AlreadyTitled(RuleViolation):
    """The session already has its automatic title (R20)."""

    rule = "R20"


class CompactionDeclined(RuleViolation):
    """A compaction refused (R18, R19): a turn is open (or the mark falls inside one), a
    compaction covering its mark landed already, nothing is new since what the latest summary
    covers, or the open turn's live owner (an older release) cannot take a summary."""

    rule = "R18"


class SessionOwned(RuleViolation):
    """Another live worker owns the session (R28): it runs the session's turns."""

    rule = "R28"


class LostOwnership(RuleViolation):
    """Another writer appended non-commutative events to the session (R5)."""

    rule = "R5"


# --- runtime ---------------------------------------------------------------------------------


class RuntimeFault(TerretError):
    """A runtime component failed."""


class AgentExists(RuntimeFault):
    """An agent id or session is already spawned in this process (R22)."""


class AgentCapExceeded(RuntimeFault):
    """The process already holds ``max_agents`` agents, none of them one it may let go: each is
    mid-turn, parked, or spawned with ``spawn_agent`` (R22)."""


class AgentLetGo(RuntimeFault):
    """The agent was let go (idle the longest, at ``max_agents``) between its lookup and its
    turn: nothing was written. ``Runtime.run_turn`` and ``resume_turn`` look the session's agent
    up again and retry; seen only by a caller holding an ``Agent`` (R22)."""


class AgentBusy(RuntimeFault):
    """Only an idle agent can be disposed (R22)."""


class RuntimeStopping(RuntimeFault):
    """The runtime is stopping: it releases the sessions it owns and takes no more (R29)."""


class ProviderError(RuntimeFault):
    """A model provider failed. ``provider`` names it; never carries credentials."""

    def __init__(self, provider: str, message: str, *, data: str | None = None) -> None:
        self.provider = provider
        self.data = data
        text = f"{provider}: {message}"
        if data is not None:
            text += f" (data: {data[:200]!r})"
        super().__init__(text)


class MalformedStream(ProviderError):
    """A provider sent an SSE chunk or JSON that cannot be parsed."""


class ModelCancelled(RuntimeFault):
    """An in-flight model request was abandoned because its turn was cancelled."""


class TurnSuspended(TerretError):
    """The process is stopping (``Runtime.close()``, SIGTERM for ``terret serve``): the turn
    stopped at a step boundary, or left its parked approval, without writing anything, and
    stays open and resumable. A ``run_turn``/``resume_turn`` caller waiting on it gets this."""


class TurnCancelled(TerretError):
    """Raised inside a turn when its cancellation was recorded; the loop closes it cancelled
    (it does not reach ``run_turn``'s caller, who gets the ``cancelled`` result)."""


class ConfigurationError(TerretError):
    """Terret's configuration is missing something a command needs (e.g. an unconfigured role)."""


class ProjectionHalted(TerretError):
    """A projection stopped at an event it could not process; an operator must act."""

    def __init__(self, projection: str, position: int, error: str) -> None:
        self.projection = projection
        self.position = position
        self.error = error
        super().__init__(f"projection {projection!r} halted at position {position}: {error}")


class ProjectionNotHalted(TerretError):
    """A skip (``projections skip``) was asked for a projection that is not halted: there is
    no event to skip."""


# --- store files and views -------------------------------------------------------------------


class StoreCorrupt(StoreError):
    """The store's file is damaged (SQLite: "database disk image is malformed"). Nothing was
    written; restore the store from a backup."""


class StoreFull(StoreError):
    """The disk holding the store (or the views) is full: the write was refused and nothing
    was written. Free space and retry."""


class NotATerretStore(StoreError):
    """The file is not a Terret store (another application's SQLite database, or not a SQLite
    database at all). Terret refuses it and leaves it untouched."""


class ViewsCorrupt(TerretError):
    """The views file is damaged. Views are a cache of the log: delete the file and they are
    rebuilt."""


class NotAViewsFile(TerretError):
    """The file given for the views holds something else — a Terret store, or another
    application's database. Terret refuses it and leaves it untouched (a views file may be
    dropped whole and rebuilt: nothing but views may live in it)."""


class ViewsBusy(TerretError):
    """A rebuild or a skip of the views file is running in another process (one at a time:
    each replays in one write transaction of the file). Nothing was changed; run it again
    when that one ends."""


class ViewsBehind(TerretError):
    """The views have not reached what a command asks about (a projection halted before it):
    the log has it; ``terret doctor`` says what stopped them."""


class ViewsMismatch(TerretError):
    """The views file no longer holds what this process built from its log: another process
    rebuilt it from another store (or from a restored copy). This process stops reading it."""
