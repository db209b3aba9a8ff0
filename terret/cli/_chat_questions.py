"""The chat's approval questions: asked while a turn waits for a verdict, answered at the prompt
(``/approve``, ``/deny``), and withdrawn when a verdict for the call arrives from elsewhere
(``terret approve`` in another shell) — a y/n typed for a withdrawn question is reported as too
late, never sent to the model or taken for another question."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from terret.cli._chat_terminal import Input, Screen, Withdrawn
from terret.cli._context import operator
from terret.cli._format import actor_text, as_json
from terret.cli._params import text_problem

if TYPE_CHECKING:
    from uuid import UUID

    from terret.domain.events import ApprovalResolved
    from terret.runtime.runtime import Runtime

VERDICT_WORDS = frozenset({"y", "yes", "n", "no"})
LATE_SECONDS = 2.0
"""How long after a question is withdrawn a bare y/n is still taken as its late answer."""


@dataclass(frozen=True)
class LateAnswer:
    """A question withdrawn while it was asked: why, and when."""

    call_id: str
    why: str
    at: float


class ApprovalQuestions:
    """The approval questions of one chat's session, on the chat's screen and input."""

    def __init__(self, screen: Screen, input: Input, runtime: Runtime, sid: UUID) -> None:
        self.screen = screen
        self.input = input
        self.runtime = runtime
        self.sid = sid
        self.asked: set[str] = set()
        self.asking: str | None = None
        """The call whose approval question is on the screen."""
        self.withdrawn: str | None = None
        self.late: LateAnswer | None = None
        """The question withdrawn last, until the next line is read: a y/n typed for it is
        reported as too late, never sent to the model or taken for another question."""

    def new_turn(self) -> None:
        """A later turn may reuse a call id: its approval is asked about again."""
        self.asked.clear()

    def resolved(self, p: ApprovalResolved) -> None:
        """A verdict recorded (the log's listener, on the runner's thread)."""
        if p.call_id == self.asking:  # a verdict from elsewhere: take the question back
            if p.verdict == "denied" and self._cancelled():
                # The turn's cancel denied it (R13): nobody decided the call.
                self.withdrawn = f"{p.call_id} will not run: the turn was cancelled"
            else:
                who = actor_text(p.by.model_dump())
                self.withdrawn = f"{p.call_id} was {p.verdict} elsewhere by {who}"
            self.screen.line(f"  ({self.withdrawn})", dim=True)

    def _cancelled(self) -> bool:
        """Whether the session's turn is being, or was just, cancelled (from its log)."""
        from terret.domain.errors import TerretError

        try:
            state = self.runtime.writer.load(self.sid).state
        except TerretError:
            return False
        return state.cancel_requested or (not state.turn_open
                                          and state.last_turn_status == "cancelled")

    def needs_approval(self, call_id: str, name: str, args: dict[str, Any]) -> None:
        self.screen.line(f"  approval needed: {name}({as_json(args)}) — /approve {call_id} "
                         f"or /deny {call_id} REASON", fg="yellow")

    def ask_pending(self) -> None:
        agent = self.runtime.agent_for_session(self.sid)
        if agent is None or agent.status != "waiting_approval":
            return
        for approval in self.runtime.views.pending(self.sid):
            if approval.call_id in self.asked:
                continue
            self.asked.add(approval.call_id)
            self._ask(approval.call_id, approval.name, approval.args)

    def decide(self, call: str | None, verdict: str, reason: str | None) -> None:
        """``/approve`` and ``/deny`` at the prompt: ``call`` names a pending call, or a prefix
        of one (None: the only one)."""
        pending = [p.call_id for p in self.runtime.views.pending(self.sid)]
        if call is None:
            if len(pending) != 1:
                self.screen.line(f"pending: {', '.join(pending) or 'nothing'}; name the call",
                                 fg="red")
                return
            call = pending[0]
        matches = [c for c in pending if c == call] or [c for c in pending if c.startswith(call)]
        if len(matches) != 1:
            self.screen.line(f"no single pending call {call!r} (pending: "
                             f"{', '.join(pending) or 'nothing'})", fg="red")
            return
        if reason is not None and not self._storable(reason):
            return
        self._verdict(matches[0], verdict, reason)
        self.screen.line(f"  {verdict} {matches[0]}", dim=True)

    def too_late(self, line: str, typed_ahead: bool) -> bool:
        """Whether ``line``, the first read since a question was withdrawn, is that question's
        late answer: a bare verdict typed before this prompt showed, or within
        ``LATE_SECONDS`` of the withdrawal. It is reported, and used for nothing."""
        late, self.late = self.late, None
        word = line.strip().lower()
        if late is None or word not in VERDICT_WORDS:
            return False
        if not typed_ahead and time.monotonic() - late.at > LATE_SECONDS:
            return False  # typed after this prompt showed, a while on: meant for it
        self.screen.line(f"  (too late for {late.call_id}: {late.why}; {word!r} was not "
                         "used)", dim=True)
        return True

    def _withdraw(self, call_id: str) -> str | None:
        """Why the question about ``call_id`` no longer stands, or None while it does."""
        if self.withdrawn is not None:
            return self.withdrawn  # the verdict's listener said so on the screen
        if any(p.call_id == call_id for p in self.runtime.views.pending(self.sid)):
            return None
        deadline = time.monotonic() + 1.0  # the view moved: its listener is about to run
        while self.withdrawn is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if self.withdrawn is None:
            self.withdrawn = f"{call_id} is no longer pending"
            self.screen.line(f"  ({self.withdrawn})", dim=True)
        return self.withdrawn

    def _decided_elsewhere(self, call_id: str) -> str | None:
        """Why an answer just read comes too late, or None: read from the log, which the
        views (what the question polls) may not have caught up with yet."""
        if self.withdrawn is not None:
            return self.withdrawn
        if call_id in self.runtime.pending(self.sid):
            return None
        return f"{call_id} was decided elsewhere"

    def _ask(self, call_id: str, name: str, args: dict[str, Any]) -> None:
        def withdraw() -> str | None:
            return self._withdraw(call_id)

        self.asking, self.withdrawn = call_id, None
        try:
            approved, reason, typed = self._yes_or_no(
                f"  approve {name}({as_json(args)})? [y/N] ", call_id, withdraw)
            why = self._decided_elsewhere(call_id)
            if why is not None:  # the verdict from elsewhere came first, the answer just after
                self.screen.line(f"  (too late for {call_id}: {why}; {typed!r} was not used)",
                                 dim=True)
                return
            asked = (name, args)  # the verdict is for the request the question showed
            if approved:
                self._verdict(call_id, "approved", None, typed=typed, asked=asked)
            else:
                self._verdict(call_id, "denied", reason or self._reason(withdraw), typed=typed,
                              asked=asked)
        except Withdrawn as why:
            self.late = LateAnswer(call_id, str(why), time.monotonic())
            return
        finally:
            self.asking = None

    def _yes_or_no(self, question: str, call_id: str, withdraw: Callable[[], str | None]
                   ) -> tuple[bool, str | None, str]:
        """The answer to an approval's question, and a denial's reason when it came with it:
        y/yes, or n/no/nothing (the default); ``/approve [CALL]``, ``/deny [CALL [REASON]]``
        as at the prompt (CALL, or a prefix of it, naming the call asked about). Anything else
        is asked again — a message or another ``/command`` typed here is neither a verdict nor
        sent to the model. Lines typed before the question showed are no answer to it: kept,
        they are the next messages."""
        for line in self.input.keep_typed_ahead():
            self.screen.line(f"  (typed before this question showed, kept for after it: "
                             f"{line!r})", dim=True)
        while True:
            ahead = self.input.typed_ahead()
            typed = self.input.ask(self.screen, question, withdraw).strip()
            answer = typed.lower()
            if self.too_late(answer, ahead):
                continue
            if answer in ("y", "yes", "/approve"):
                return True, None, typed
            if answer in ("", "n", "no", "/deny"):
                return False, None, typed
            verb, _, rest = typed.partition(" ")
            if verb.lower() in ("/approve", "/deny") and rest.strip():
                call, _, reason = rest.strip().partition(" ")
                if call_id.startswith(call) and self._storable(reason):
                    return verb.lower() == "/approve", reason.strip() or None, typed
                if not call_id.startswith(call):
                    self.screen.line(f"  (the question is about {call_id}, not {call})",
                                     dim=True)
                continue
            self.screen.line("  (answer y or n: the call waits for its verdict; messages and "
                             "/commands come after it)", dim=True)

    def _reason(self, withdraw: Callable[[], str | None]) -> str:
        """The denial's reason, which the model sees: free text, never a ``/command``."""
        while True:
            reason = self.input.ask(self.screen, "  reason (the model sees it) "
                                    "[denied in chat]: ", withdraw).strip()
            if not self._storable(reason):
                continue
            if reason.startswith("//"):  # as at the prompt: a text that starts with "/"
                return reason[1:]
            if not reason.startswith("/"):
                return reason or "denied in chat"
            self.screen.line("  (a /command is not a reason: type the reason the model will "
                             "see, or nothing)", dim=True)

    def _storable(self, text: str) -> bool:
        """Whether ``text`` can be recorded as a reason; if not (bytes that are not UTF-8: a
        paste, a Backspace that took half a character), says so, and it is asked again."""
        problem = text_problem(text)
        if problem is not None:
            self.screen.line(f"  (not recorded: {problem}; type it again)", fg="red")
        return problem is None

    def _verdict(self, call_id: str, verdict: str, reason: str | None, *,
                 typed: str | None = None,
                 asked: tuple[str, dict[str, Any]] | None = None) -> None:
        """Record the chat's verdict; ``typed``: the answer to the question it came from (a
        verdict from elsewhere that this process had not seen yet makes it a late one);
        ``asked``: the tool and arguments that question showed, which the verdict is for."""
        from terret.domain.errors import ApprovalNotPending

        self.asking = None  # this chat's own verdict: nothing to withdraw
        name, args = asked if asked is not None else (None, None)
        try:
            if verdict == "approved":
                self.runtime.approve(self.sid, call_id, by=operator(), reason=reason,
                                     name=name, args=args)
            else:
                self.runtime.deny(self.sid, call_id, by=operator(), reason=reason or "denied",
                                  name=name, args=args)
        except ApprovalNotPending:
            if typed is not None:
                self.screen.line(f"  (too late for {call_id}: it was decided elsewhere "
                                 f"already; {typed!r} was not used)", dim=True)
            else:
                self.screen.line(f"  ({call_id} was decided elsewhere already)", dim=True)
