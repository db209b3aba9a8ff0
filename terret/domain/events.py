"""Terret's event catalogue (ARCHITECTURE §3). ``docs/events.md`` lists the same table; a test
keeps the two in step."""

from __future__ import annotations

import re
import unicodedata
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from terret.domain.errors import shown
from terret.domain.money import cost_figure
from terret.domain.payloads import (
    EventPayload,
    catalogue,
    creating,
    event_type,
    text_problem,
    validated,
)

ActorKind = Literal["user", "operator", "budget", "reaper", "supervisor", "agent", "system"]
TurnStatus = Literal["completed", "cancelled", "rejected", "empty", "failed"]
Verdict = Literal["approved", "denied"]

TITLE_MAX = 80
REASON_MAX = 2000
"""The most characters a reason may have — a person's (a cancel, a verdict, a close, a budget,
a purge) or code's (a pre-step hook's refusal, an agent's disposal): a cancel's is recorded in
full and its start repeated in the denial and the result of every call it stops, all in one
append, which must stay within a store's limit for one (1 MiB on EventStoreDB)."""


def reason_problem(reason: object) -> str | None:
    """Why ``reason`` cannot be recorded as one (not text, a lone surrogate, longer than
    ``REASON_MAX``), or None."""
    if reason is None:
        return None
    if not isinstance(reason, str):
        return f"a reason is text, not a {type(reason).__name__}"
    if len(reason) > REASON_MAX:
        return f"a reason is at most {REASON_MAX} characters, not {len(reason)}"
    return text_problem(reason)


MAX_MESSAGE_BYTES = 512 * 1024
"""The most a person's text may take as stored, on every store: a turn's input
(``user/message``) or an inbox entry (``inbox/queued``, then ``context/injected``). Half the
1 MiB EventStoreDB allows a whole append, so that what is appended with it fits too — a turn's
start and its claim; a step's start and the last tool result it carries (256 KiB at most)."""


_PROVIDER = r"[a-z][a-z0-9_-]*"
#: The provider part of a model spec (``provider:model``). Anchored with ``\Z``: ``$`` would let
#: a trailing newline through.
PROVIDER_NAME = re.compile(rf"^{_PROVIDER}\Z")
_SPEC = re.compile(rf"^{_PROVIDER}:\S+\Z")
_URL_CREDENTIALS = re.compile(r"://[^/]*@|://[^#?]*[?#]")
_USERINFO = re.compile(r":[^/@]*@")
_ROLE = r"[a-z][a-z0-9_-]*"
#: A model role, as ``model/set`` and ``session/started``'s ``roles`` name it.
ROLE_NAME = re.compile(rf"^{_ROLE}\Z")
_NAME_CHARS = r"A-Za-z0-9_.:/\-"
#: What a tool name an allow-list pattern can match is made of: letters, digits and
#: ``_ . : / -`` (the OpenAI-style ``[A-Za-z0-9_-]``, and namespaced names like ``fs.read``).
TOOL_NAME = re.compile(rf"^[{_NAME_CHARS}]+\Z")
# A pattern: name characters, the wildcards * and ?, and sets of name characters ([rw], [!x],
# [a-z]); '!' only right after a set's '['.
_PATTERN = re.compile(rf"^(?:[{_NAME_CHARS}*?]|\[!?[{_NAME_CHARS}]+\])+\Z")
_PATTERN_CHARS = re.compile(rf"^[{_NAME_CHARS}*?\[\]!]+\Z")


class _Part(BaseModel):
    """A value inside payloads (``Actor``, ``ToolCallData``, ``UsageData``): made in code, it is
    checked as a payload is — ``InvalidPayload`` naming the class, bytes refused."""

    # No NaN or infinity inside a payload either: JSON writes them as null (a cost of inf was
    # counted in memory and recorded as unknown).
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True,
                              allow_inf_nan=False)

    def __init__(self, **data: Any) -> None:
        validated(self, type(self).__name__, data)

    # Not a custom __init__ to pydantic (as EventPayload's): a part read back with its
    # payload is validated by pydantic alone, never as one being made.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]


class Actor(_Part):
    """Who forced a transition (R25)."""

    actor: ActorKind
    id: str | None = None


class ToolCallData(_Part):
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    args: dict[str, Any] = Field(default_factory=dict)


class UsageData(_Part):
    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    cost: float | None = Field(default=None, ge=0)


def validate_text(text: str) -> str:
    """Text that can be stored (valid Unicode: no lone surrogate); ``ValueError`` otherwise."""
    problem = text_problem(text)
    if problem is not None:
        raise ValueError(problem)
    return text


def validate_model_spec(spec: str) -> str:
    if not _SPEC.match(validate_text(spec)):
        raise ValueError("a model spec is 'provider:model', e.g. 'openrouter:openai/gpt-4o'")
    if not spec.isprintable():  # an escape sequence, a NUL, a right-to-left override
        raise ValueError("a model spec has no control or formatting characters")
    if url_holds_secrets(spec) or spec_holds_userinfo(spec):
        # The spec is recorded (model/set, step/start, session/started) and shown: a key in
        # it would be in the log for good. Not quoted here either.
        raise ValueError(URL_SECRETS_REFUSED)
    return spec


def spec_holds_userinfo(spec: str) -> bool:
    """A spec whose model, its base URL set aside, holds ``user:password@host`` without a
    scheme (``openai-compatible:admin:hunter2@gpu-box``): ``url_holds_secrets`` sees only
    what follows a ``://``. A colon then an ``@`` with no ``/`` between is that shape (an
    Ollama tag, ``llama3.1:8b``, has no ``@``; a Vertex version, ``claude@20240620``, no
    colon)."""
    model = spec.partition(":")[2]
    lowered = model.lower()
    cut = max(lowered.rfind("@http://"), lowered.rfind("@https://"))
    return _USERINFO.search(model[:cut] if cut > 0 else model) is not None


URL_SECRETS_REFUSED = ("a base URL may not hold credentials (user:password@), a query or a "
                       "fragment: it is written to the event log; put the key in the "
                       "endpoint's api_key_env variable")


def url_holds_secrets(text: str) -> bool:
    """Whether a URL (or a spec holding one) carries what may be a credential: user-info, a
    query or a fragment. Specs and base URLs are recorded and shown, so none may."""
    return _URL_CREDENTIALS.search(text) is not None


def validate_role(role: str) -> str:
    """A model role (``main``, ``compactor``, ``titler``, ...): :data:`ROLE_NAME`."""
    if not ROLE_NAME.match(role):
        raise ValueError(f"invalid role {shown(role)}: a role is lower-case letters, digits, _ "
                         "and -, starting with a letter (e.g. 'main')")
    return role


def validate_pattern(pattern: str) -> str:
    """An allow-list pattern is a glob over tool names (``fs_*``, ``deploy``, ``*``): tool-name
    characters (:data:`TOOL_NAME`), the wildcards ``*`` and ``?``, and sets of tool-name
    characters (``fs_[rw]*``, ``[!x]*``). ``ValueError`` names what is wrong."""
    if _PATTERN.match(pattern):
        return pattern
    where = f"invalid pattern {shown(pattern)}"
    if not _PATTERN_CHARS.match(pattern):
        raise ValueError(f"{where}: use a glob of letters, digits, _ . : / - * ? and [sets]")
    if re.search(r"(?<!\[)!", pattern):
        raise ValueError(f"{where}: '!' only negates a set, as in '[!x]*'")
    raise ValueError(f"{where}: unbalanced brackets or an empty set (a set is '[', tool-name "
                     "characters, ']', as in 'fs_[rw]*')")


def validate_agent_name(name: str) -> str:
    """An agent name: not blank, no whitespace around it, no control characters."""
    validate_text(name)
    if not name.strip():
        raise ValueError("an agent name cannot be blank")
    if name != name.strip():
        raise ValueError(f"an agent name has no whitespace around it: {shown(name)}")
    if any(unicodedata.category(c) == "Cc" for c in name):
        raise ValueError(f"an agent name has no control characters: {shown(name)}")
    return name


@event_type
class SessionStarted(EventPayload):
    wire_name = "session/started"
    agent: str = Field(default="default", min_length=1)
    agent_revision: int = Field(default=1, ge=1)
    roles: dict[str, str] = Field(default_factory=dict)
    policy_floor: list[str] | None = None

    @field_validator("agent")
    @classmethod
    def _agent(cls, agent: str, info: ValidationInfo) -> str:
        return validate_agent_name(agent) if creating(info) else agent

    @field_validator("roles")
    @classmethod
    def _roles(cls, roles: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        if creating(info):
            for role, spec in roles.items():
                validate_role(role)
                validate_model_spec(spec)
        return roles

    @field_validator("policy_floor")
    @classmethod
    def _floor(cls, patterns: list[str] | None, info: ValidationInfo) -> list[str] | None:
        if creating(info) and patterns is not None:
            for pattern in patterns:
                validate_pattern(pattern)
        return patterns


@event_type
class UserMessage(EventPayload):
    wire_name = "user/message"
    model_visible = True
    text: str
    inbox_id: str | None = None


@event_type
class ContextInjected(EventPayload):
    wire_name = "context/injected"
    model_visible = True
    text: str
    inbox_id: str | None = None


@event_type
class InboxQueued(EventPayload):
    """Durable inbox (R24, beyond): text waits here until a step takes it."""

    wire_name = "inbox/queued"
    commutative = True
    inbox_id: str = Field(min_length=1)
    text: str
    wake: bool = False


@event_type
class TurnStarted(EventPayload):
    wire_name = "turn/start"
    turn: int = Field(ge=1)
    trigger: str = "user"


@event_type
class StepStarted(EventPayload):
    wire_name = "step/start"
    turn: int = Field(ge=1)
    step: int = Field(ge=1)
    model: str


@event_type
class AssistantMessage(EventPayload):
    """The model's reply. Version 2 meters the model call with it: ``model`` is the resolved
    ``provider:model`` spec that answered and ``usage`` what the provider reported (absent when
    it reported none), so the cost is durable the moment the reply is. Version 1 had neither:
    its step's usage is on the ``step/end``."""

    wire_name = "assistant/message"
    version = 2
    model_visible = True
    text: str = ""
    tool_calls: list[ToolCallData] = Field(default_factory=list)
    model: str | None = None
    usage: UsageData | None = None

    @property
    def metered(self) -> bool:
        """Whether this reply carries its model call's metering (written by version 2 with
        its model): its step's ``step/end`` then carries no usage."""
        return self.model is not None


@catalogue.upcaster("assistant/message", 1)
def _assistant_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    return data  # unmetered: the usage of a version 1 reply is on its step's step/end


@event_type
class ToolResult(EventPayload):
    wire_name = "tool/result"
    model_visible = True
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    content: str
    is_error: bool = False


@event_type
class StepEnded(EventPayload):
    """The step is closed. From version 3 the step's usage is on its reply (a metered
    ``assistant/message``) and ``usage`` is only found on steps whose reply is unmetered (logs
    written before); ``resumed`` marks a step closed by a resume (R15). Version 2 had no
    ``resumed``; version 1 carried flat ``prompt_tokens``/``completion_tokens``."""

    wire_name = "step/end"
    version = 3
    turn: int = Field(ge=1)
    step: int = Field(ge=1)
    usage: UsageData | None = None
    resumed: bool | None = None


@catalogue.upcaster("step/end", 1)
def _step_end_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    flat = {k: data.pop(k) for k in ("prompt_tokens", "completion_tokens", "cost") if k in data}
    if "prompt_tokens" in flat or "completion_tokens" in flat:
        flat.setdefault("prompt_tokens", 0)
        flat.setdefault("completion_tokens", 0)
        data["usage"] = flat
    return data


@catalogue.upcaster("step/end", 2)
def _step_end_v2_to_v3(data: dict[str, Any]) -> dict[str, Any]:
    return data  # not known to be resumed: version 2 did not say


@event_type
class CancelRequested(EventPayload):
    wire_name = "turn/cancel_requested"
    commutative = True
    by: Actor
    reason: str | None = None


@event_type
class TurnEnded(EventPayload):
    wire_name = "turn/end"
    turn: int = Field(ge=1)
    status: TurnStatus
    reason: str | None = None
    by: Actor | None = None
    error: str | None = None


@event_type
class ApprovalRequested(EventPayload):
    wire_name = "approval/requested"
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    args: dict[str, Any] = Field(default_factory=dict)


@event_type
class ApprovalResolved(EventPayload):
    wire_name = "approval/resolved"
    commutative = True
    call_id: str = Field(min_length=1)
    verdict: Verdict
    reason: str | None = None
    by: Actor


InDoubtVerdict = Literal["rerun", "skipped"]


@event_type
class ToolStarted(EventPayload):
    """A tool that may not run twice (``idempotent=False``) is about to run this call: written
    before its handler starts. A ``tool/started`` without a ``tool/result`` after it means the
    call may have taken effect, or not: it is in doubt and is never run again without an
    operator's verdict."""

    wire_name = "tool/started"
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)


@event_type
class ToolInDoubt(EventPayload):
    """The turn found a started call without a result (its process died while it ran) and
    waits for an operator's verdict, as a parked approval does."""

    wire_name = "tool/in_doubt"
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    args: dict[str, Any] = Field(default_factory=dict)


@event_type
class InDoubtResolved(EventPayload):
    """An operator's verdict on a call in doubt: run it again (``rerun``), or do not
    (``skipped``: the model gets an error result saying it was not run again). Counts only for
    a call in doubt in the open turn with the same id, tool and arguments."""

    wire_name = "tool/in_doubt_resolved"
    commutative = True
    call_id: str = Field(min_length=1)
    verdict: InDoubtVerdict
    reason: str | None = None
    by: Actor


@event_type
class BudgetSet(EventPayload):
    """The session's own spend budget (lifetime cost), replacing the deployment's default;
    ``limit`` absent returns the session to the default."""

    wire_name = "budget/set"
    commutative = True
    limit: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    reason: str | None = None
    by: Actor

    @field_validator("limit")
    @classmethod
    def _limit(cls, limit: float | None) -> float | None:
        # A cost figure, as every spend it is compared with: the budget recorded is the one
        # every report shows (5.123456789012345 was recorded, 5.123456789 reported).
        return None if limit is None else cost_figure(limit)


@event_type
class BudgetExceeded(EventPayload):
    """The turn parked before a step because the session's spend (``spent``) plus the
    estimate of the next model call would pass ``limit``; it goes on once a budget covers it,
    or is cancelled."""

    wire_name = "budget/exceeded"
    turn: int = Field(ge=1)
    limit: float = Field(ge=0)
    spent: float = Field(ge=0)
    estimate: float = Field(ge=0)
    by: Actor


@event_type
class SessionCompacted(EventPayload):
    wire_name = "session/compacted"
    model_visible = True
    # A summary recorded while a turn runs covers only what came before that turn (R18): the
    # turn's owner folds it in and goes on; its next step reads the summary.
    commutative = True
    upto_seq: int = Field(ge=1)
    summary: str


@event_type
class SessionTitled(EventPayload):
    wire_name = "session/titled"
    commutative = True
    title: str = Field(min_length=1, max_length=TITLE_MAX)
    by: Actor | None = None


UpkeepPurpose = Literal["compaction", "title"]


@event_type
class UsageRecorded(EventPayload):
    """A metered model call the session paid for outside its steps (R21, R31): the
    summarizer's request for a compaction or the titler's for a title, recorded with what it
    produced (``session/compacted``, ``session/titled``) in one append, or alone when nothing
    came of it (the summary was declined, a title landed meanwhile, the request failed after
    the provider reported its usage). ``turn`` is the session's turn when it was recorded (the
    turn whose end asked for it, between turns); ``model`` the ``provider:model`` spec asked."""

    wire_name = "usage/recorded"
    commutative = True
    purpose: UpkeepPurpose
    turn: int = Field(ge=0)
    model: str
    usage: UsageData

    @field_validator("model")
    @classmethod
    def _model(cls, spec: str, info: ValidationInfo) -> str:
        return validate_model_spec(spec) if creating(info) else spec


@event_type
class PolicyUpdated(EventPayload):
    wire_name = "policy/updated"
    commutative = True
    patterns: list[str]
    by: Actor | None = None

    @field_validator("patterns")
    @classmethod
    def _patterns(cls, patterns: list[str], info: ValidationInfo) -> list[str]:
        if creating(info):
            for pattern in patterns:
                validate_pattern(pattern)
        return patterns


@event_type
class PolicyReset(EventPayload):
    """The recorded allow-list withdrawn: the floor of the agent definition that runs each call
    applies again (R23, R32) — the release serving the session, not a floor from its start."""

    wire_name = "policy/reset"
    commutative = True
    by: Actor | None = None


@event_type
class ModelSet(EventPayload):
    wire_name = "model/set"
    commutative = True
    role: str = Field(pattern=rf"^{_ROLE}$")
    spec: str
    by: Actor | None = None

    @field_validator("spec")
    @classmethod
    def _spec(cls, spec: str, info: ValidationInfo) -> str:
        return validate_model_spec(spec) if creating(info) else spec


@event_type
class AgentAttached(EventPayload):
    """Ownership taken (R28): the agent, the worker process it runs in, the fencing ``epoch``
    (one more than the log's last) and the lease's first expiry (wall-clock seconds). The lease
    is then renewed by the worker's heartbeats outside the session's log. Version 1 had no
    worker, epoch or lease."""

    wire_name = "agent/attached"
    version = 2
    agent_id: str = Field(min_length=1)
    host: str
    pid: int
    reason: str | None = None
    worker: str | None = None
    epoch: int = Field(default=0, ge=0)
    lease_until: float | None = None


@event_type
class AgentDetached(EventPayload):
    """Ownership released (R25, R29): the reason, the epoch it ends, and who forced it when
    the owner did not let go itself (``by``: a ``supervisor`` taking over an expired lease, an
    ``operator``). Version 1 had no worker, epoch or ``by``."""

    wire_name = "agent/detached"
    version = 2
    agent_id: str = Field(min_length=1)
    host: str
    pid: int
    reason: str | None = None
    worker: str | None = None
    epoch: int = Field(default=0, ge=0)
    by: Actor | None = None


@event_type
class AgentRevised(EventPayload):
    """The session's turns run under another ``revision`` of its agent definition from here on
    (R32): the process that took the session defines it; they ran under ``previous`` (the
    ``session/started``'s revision, or the last ``agent/revised``'s). A newer revision (a
    deploy) or an older one (a rollback). ``in_turn``: turn ``turn`` was open, handed over
    mid-way, and its later steps run under the new revision."""

    wire_name = "agent/revised"
    previous: int = Field(ge=1)
    revision: int = Field(ge=1)
    turn: int = Field(ge=0)
    in_turn: bool = False

    @field_validator("revision")
    @classmethod
    def _moved(cls, revision: int, info: ValidationInfo) -> int:
        if creating(info) and revision == info.data.get("previous"):
            raise ValueError("the same revision as before: nothing to record")
        return revision


@catalogue.upcaster("agent/attached", 1)
@catalogue.upcaster("agent/detached", 1)
def _ownership_v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    return data  # the new fields have defaults: a version 1 owner has no worker and epoch 0


@event_type
class SessionClosed(EventPayload):
    wire_name = "session/closed"
    reason: str | None = None
    by: Actor


@event_type
class SessionPurged(EventPayload):
    """Recorded in the retention stream when a closed session's stream is deleted (R27)."""

    wire_name = "session/purged"
    session_id: str
    reason: str | None = None
    by: Actor
    max_age_seconds: int | None = None


catalogue.mark_builtin()

MODEL_VISIBLE = frozenset(cls.wire_name for cls in catalogue if cls.model_visible)
COMMUTATIVE = frozenset(cls.wire_name for cls in catalogue if cls.commutative)

FOLDED_BEYOND_SEED = (SessionCompacted.wire_name,)
"""Commutative events an older release's running turn took for a takeover: a worker's beats
name them (``WorkerBeat.folds``), and another process appends one while a turn runs only when
the turn's owner names it there."""
