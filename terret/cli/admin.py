"""Session administration: inject, cancel, resume, policy, model, compact, title, usage, events.

Every command that changes a session goes through the command service
(``terret.runtime.commands.SessionCommands``), as the runtime's own do; the ones that need code
(a turn, a summarizer) build a ``Runtime`` from the app."""

from __future__ import annotations

import threading
import warnings
from functools import partial
from typing import TYPE_CHECKING, Any
from uuid import UUID

import click

from terret.cli._context import ANY_MODEL_SPEC, SESSION, CliContext, note, operator
from terret.cli._format import NOT_SHOWN, actor_text, money, table
from terret.cli._params import (
    PATTERN,
    TEXT,
    Choice,
    checked_first,
    not_blank,
    recordable_reason,
)
from terret.domain.errors import shown
from terret.domain.keys import KEY_REFUSED, looks_like_key

if TYPE_CHECKING:
    from terret.cli._app import App
    from terret.projections.usage import UsageTotals
    from terret.runtime.definition import TurnResult
    from terret.runtime.runtime import Runtime

APP_OPTION = click.option(
    "--app", "app_spec", envvar="TERRET_APP", default=None, metavar="MODULE:FUNC",
    help="Function returning a terret.cli.App (agents, tools, providers). Env TERRET_APP.")


def app_for(app_spec: str | None) -> App:
    """The app ``--app`` names (the default app without one), built once per command: a
    check of the command line before the session's lookup builds it first."""
    from terret.cli._app import load_app
    from terret.domain.errors import ConfigurationError

    ctx = click.get_current_context(silent=True)
    built = ctx.meta.get(_BUILT) if ctx is not None else None
    if built is not None and built[0] == app_spec:
        return built[1]  # type: ignore[no-any-return]
    try:
        app = load_app(app_spec)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc), param_hint="'--app'") from None
    if ctx is not None:
        ctx.meta[_BUILT] = (app_spec, app)
    return app


_BUILT = "terret.app"
"""Where ``app_for`` keeps the app it built for the command (its ``--app``, and the app)."""


def runtime_for(obj: CliContext, app_spec: str | None, app: App | None = None, *,
                own_views: bool = False) -> Runtime:
    """A runtime on the command's store for the app (``app``, already loaded, or
    ``app_spec``); with ``own_views``, views of its own in memory (a pool member's) instead of
    the command's."""
    from terret.runtime.runtime import Runtime

    app = app if app is not None else app_for(app_spec)
    views = ":memory:" if own_views else obj.view_store()
    runtime = Runtime(obj.store(), resolver=app.resolver, views=views,
                      config=app.config, agents=app.agents, summarizer=app.summarizer,
                      titler=app.titler)
    obj.closers.append(lambda: runtime.close(grace=0))
    return runtime


def _valid_role(values: dict[str, Any]) -> None:
    """``model set``'s ROLE is a role name (checked again by the session when recorded)."""
    from terret.domain.errors import InvalidPayload
    from terret.domain.events import ModelSet, validate_role

    try:
        validate_role(values["role"])
    except ValueError as exc:  # said as the session says it
        said = InvalidPayload(ModelSet.wire_name, "role", str(exc))
        raise click.BadParameter(str(said), param_hint="'ROLE'") from None


def _app_loads(values: dict[str, Any]) -> None:
    """``--app`` names an app that loads (the command uses the one built here)."""
    app_for(values.get("app_spec"))


@checked_first(not_blank("text", "'TEXT'", "the text cannot be empty"))
@click.command("inject")
@click.argument("session_id", type=SESSION)
@click.argument("text", type=TEXT)
@click.option("--wake", is_flag=True, help="Start a turn with it if the session is idle.")
@click.pass_obj
def inject(obj: CliContext, session_id: UUID, text: str, wake: bool) -> None:
    """Queue TEXT in the session's durable inbox; it rides the next step."""
    obj.require_session(session_id)
    inbox_id = obj.commands().inject(session_id, text, wake=wake)
    obj.emit({"session": str(session_id), "inbox_id": inbox_id, "wake": wake},
             f"queued {inbox_id}" + (" (wake)" if wake else ""))


@checked_first(recordable_reason("CancelRequested"))
@click.command("cancel")
@click.argument("session_id", type=SESSION)
@click.option("--reason", type=TEXT, default=None, help="Recorded with the cancel.")
@click.pass_obj
def cancel(obj: CliContext, session_id: UUID, reason: str | None) -> None:
    """Cancel the open turn: recorded first; its serving process then denies standing
    approvals and closes the turn (or the next resume does). A turn whose cancel is recorded
    already is left as it is: the first cancel's author and reason stand."""
    obj.require_session(session_id)
    commands = obj.commands()
    if commands.cancel(session_id, by=operator(), reason=reason):
        obj.emit({"session": str(session_id), "cancel_requested": True, "recorded": True},
                 f"cancel recorded for {session_id}")
        return
    state = commands.writer.load(session_id).state
    first = {"by": state.cancel_by, "reason": state.cancel_reason}
    by = actor_text(state.cancel_by)
    obj.emit({"session": str(session_id), "cancel_requested": True, "recorded": False,
              "cancel": first},
             f"cancel already recorded for {session_id}"
             + (f" by {by}" if by else "")
             + (f": {state.cancel_reason}" if state.cancel_reason else "")
             + " — nothing recorded")


@click.command("resume")
@click.argument("session_id", type=SESSION)
@APP_OPTION
@click.pass_obj
def resume(obj: CliContext, session_id: UUID, app_spec: str | None) -> None:
    """Resume the session's open turn in this process (after a crash)."""
    from terret.domain.errors import NoOpenTurn

    obj.require_session(session_id)
    runtime = runtime_for(obj, app_spec).start()
    # The owed calls run first: the allow-list and approvals read the views, which must know
    # the session before they can allow anything.
    runtime.catch_up_views()
    if not runtime.resumable(session_id):  # before an agent attaches: a refusal writes nothing
        raise NoOpenTurn(f"session {session_id} has no open turn to resume")
    # Take the session before saying anything about its turn: a live owner (SessionOwned) or
    # an agent this app does not define (ConfigurationError) is refused here, in one line,
    # with nothing written; a session whose owner's lease expired is taken over.
    runtime.agent_for(session_id)
    said = _say_what_it_waits_on(runtime, session_id)
    result = _resume_until_interrupted(runtime, session_id, said)
    obj.emit({"session": str(session_id), "turn": result.turn, "status": result.status},
             f"turn {result.turn} {result.status}")


def _resume_until_interrupted(runtime: Runtime, session_id: UUID, said: bool) -> TurnResult:
    """The turn runs on a thread of its own so that Ctrl-C reaches this one, not the turn
    (where ``KeyboardInterrupt`` ends it ``failed``). The first stops the process as SIGTERM
    stops ``serve``: the turn stays open, the session released (``TurnSuspended``). A second
    stops waiting: the process leaves as if it crashed, the turn open, its lease to expire."""
    from terret.domain.errors import TurnSuspended

    outcome: list[TurnResult | BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            outcome.append(runtime.resume_turn(session_id))
        except BaseException as exc:  # handed to the waiting thread, which re-raises it
            outcome.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=run, name=f"resume-{session_id}", daemon=True)
    parked = said  # the wait the turn resumes into is said already
    try:
        thread.start()  # in the try: the turn may be under way before start() returns
        while not done.wait(0.1):
            now = _parked(runtime, session_id)
            if now and not parked:  # it parked while resumed: it waits on another shell
                runtime.catch_up_views(session_id)
                _say_what_it_waits_on(runtime, session_id)
            parked = now
    except KeyboardInterrupt:
        _stop_on_interrupt(runtime, session_id, done)
    found = outcome[0]
    if isinstance(found, TurnSuspended):
        turn = runtime.writer.load(session_id).state.turn
        raise TurnSuspended(f"interrupted: turn {turn} of {session_id} stays open; resume it "
                            f"with `terret resume {session_id}` or `terret serve`") from None
    if isinstance(found, BaseException):
        raise found
    return found


def _parked(runtime: Runtime, session_id: UUID) -> bool:
    agent = runtime.agent_for_session(session_id)
    return agent is not None and agent.status.startswith("waiting_")


def _stop_on_interrupt(runtime: Runtime, session_id: UUID, done: threading.Event) -> None:
    """Stop the process as SIGTERM stops ``serve`` and wait for the turn to stop; a second
    Ctrl-C stops waiting (``Aborted``)."""
    agent = runtime.agent_for_session(session_id)
    if agent is not None and agent.status.startswith("waiting_"):
        note("interrupted: the parked turn stops now and stays open")
    else:
        note("interrupted: the turn stops at its next step boundary and stays open "
             "(Ctrl-C again to stop waiting)")
    try:
        runtime.close(grace=_A_DAY)
        done.wait()
    except KeyboardInterrupt:
        raise click.Abort() from None


_A_DAY = 86_400.0
"""How long a first Ctrl-C waits for the turn to reach a boundary (a running tool finishes
first); a second Ctrl-C stops waiting sooner."""


def _say_what_it_waits_on(runtime: Runtime, session_id: UUID) -> bool:
    """Notes on stderr for a resumed turn that will wait on someone in another shell: a
    verdict on an approval or a call in doubt, a higher budget (whether one was said). None
    once a cancel is recorded: the turn closes ``cancelled`` at once, whatever it waited on."""
    state = runtime.writer.load(session_id).state
    if state.cancel_requested:
        note(f"a cancel of turn {state.turn} is recorded: it closes cancelled, its pending "
             "calls denied")
        return False
    pending = runtime.views.pending(session_id)
    budget = runtime.budget(session_id)
    exceeded = budget is not None and budget.exceeded
    if pending:
        calls = ", ".join(p.call_id for p in pending)
        first = pending[0].call_id
        note(f"turn parked on {calls}: waiting for a verdict (`terret approve {session_id} "
             f"{first}` or `terret deny {session_id} {first} --reason …` from another shell; "
             "Ctrl-C leaves the turn open)")
    for call_id in state.started:  # started, no result: the resumed turn waits on a verdict
        note(f"call {call_id} is in doubt (it started and left no result): the turn waits for "
             f"`terret in-doubt rerun {session_id} {call_id}` or `terret in-doubt skip "
             f"{session_id} {call_id} --reason …` from another shell")
    if budget is not None and exceeded:
        note(f"the session spent {money(budget.spent)} of its budget {money(budget.limit)}: the "
             f"turn waits for `terret budget set {session_id} AMOUNT` from another shell")
    return bool(pending or state.started or exceeded)


@click.group("policy")
def policy() -> None:
    """The session's tool allow-list (glob patterns over tool names; deny by default)."""


@policy.command("show")
@click.argument("session_id", type=SESSION)
@click.pass_obj
def policy_show(obj: CliContext, session_id: UUID) -> None:
    """The patterns in force (the last policy/updated, else the floor of the agent definition
    that runs each call) and the floor the session recorded when it started."""
    obj.require_session(session_id)
    patterns = obj.views(reads=("policy",), session=session_id).policy(session_id)
    floor = obj.commands().policy_floor(session_id)
    if patterns is None:
        shown = "none recorded: the floor of the agent definition running each call applies"
    else:
        shown = "\n".join(patterns) if patterns else "(deny all)"
    # The floor in force is the serving release's (R32): the one recorded at the start may be
    # an older release's.
    floor_line = (f"floor at the session's start: {', '.join(floor) or '(deny all)'} (a release "
                  "serving it now applies its own agent definition's)" if floor is not None else
                  "floor: not recorded (the serving app's agent definition's allow-list)")
    obj.emit({"session": str(session_id), "patterns": patterns, "floor": floor},
             f"{shown}\n{floor_line}")


@policy.command("set")
@click.argument("session_id", type=SESSION)
@click.argument("patterns", nargs=-1, type=PATTERN)
@click.option("--deny-all", is_flag=True, help="Allow no tool at all (instead of PATTERNS).")
@click.pass_obj
def policy_set(obj: CliContext, session_id: UUID, patterns: tuple[str, ...],
               deny_all: bool) -> None:
    """Replace the allow-list; takes effect on the very next tool call."""
    from terret.domain.errors import InvalidPayload

    if not patterns and not deny_all:
        raise click.UsageError("give the patterns to allow, or --deny-all to allow no tool "
                               "(`terret policy reset` goes back to the agent's floor)")
    if patterns and deny_all:
        raise click.UsageError("--deny-all allows no tool: give it without PATTERNS")
    obj.require_session(session_id)
    try:
        obj.commands().set_policy(session_id, patterns, by=operator())
    except InvalidPayload as exc:
        raise click.BadParameter(str(exc), param_hint="'PATTERN'") from None
    obj.emit({"session": str(session_id), "patterns": list(patterns)},
             f"policy of {session_id}: {', '.join(patterns) or '(deny all)'}")


@policy.command("reset")
@click.argument("session_id", type=SESSION)
@APP_OPTION
@click.pass_obj
def policy_reset(obj: CliContext, session_id: UUID, app_spec: str | None) -> None:
    """Withdraw the recorded allow-list (policy/reset): the floor of the agent definition
    that runs each call applies again — the serving release's, which may not be the floor the
    session started with. The app (--app) only says what that floor is here."""
    obj.require_session(session_id)
    commands = obj.commands()
    agent = commands.writer.load(session_id).state.agent
    app = app_for(app_spec)
    definition = next((d for d in app.agents if d.name == agent), None)
    # The implicit `default` agent (allowing nothing) is only an app's that defines none.
    floor = (list(definition.allow) if definition is not None
             else [] if agent == "default" and not app.agents else None)
    commands.reset_policy(session_id, by=operator())
    where = (f"this app's: {', '.join(floor) or '(deny all)'}" if floor is not None else
             f"this app defines no agent {shown(agent)}: that of the app serving it")
    obj.emit({"session": str(session_id), "patterns": None, "floor": floor},
             f"policy of {session_id} reset: the agent's floor applies ({where})")


@click.group("model")
def model() -> None:
    """Model roles of a session (main, compactor, titler, …)."""


@checked_first(_valid_role)
@model.command("set")
@click.argument("session_id", type=SESSION)
@click.argument("role", type=TEXT)
@click.argument("spec", type=ANY_MODEL_SPEC)
@APP_OPTION
@click.option("--force", is_flag=True,
              help="Record SPEC even if the app here cannot resolve it (a provider configured "
                   "only where the session is served).")
@click.option("--not-a-key", "not_a_key", is_flag=True,
              help="Record SPEC even though its model looks like an API key (a model name "
                   "that only looks like one).")
@click.pass_obj
def model_set(obj: CliContext, session_id: UUID, role: str, spec: str, app_spec: str | None,
              force: bool, not_a_key: bool) -> None:
    """Point ROLE at SPEC (provider:model); the next step uses it. SPEC is checked against
    the app's providers first."""
    from terret.cli._app import check_resolves
    from terret.domain.errors import InvalidPayload

    if not not_a_key and looks_like_key(spec):
        raise click.BadParameter(
            f"{NOT_SHOWN}: {KEY_REFUSED}; --not-a-key records it all the same",
            param_hint="'SPEC'")
    obj.require_session(session_id)
    app = None if force else app_for(app_spec)
    try:
        # The app's check runs after the session's rules (a closed session, a bad role) and
        # before anything is written.
        check = None if app is None else partial(check_resolves, app.resolver)
        obj.commands().set_model(session_id, role, spec, by=operator(), check=check,
                                 not_a_key=not_a_key)
    except InvalidPayload as exc:
        raise click.BadParameter(str(exc), param_hint="'ROLE'" if exc.field == "role"
                                 else "'SPEC'") from None
    obj.emit({"session": str(session_id), "role": role, "spec": spec}, f"{role} = {spec}")


@checked_first(_app_loads)
@click.command("compact")
@click.argument("session_id", type=SESSION)
@APP_OPTION
@click.pass_obj
def compact(obj: CliContext, session_id: UUID, app_spec: str | None) -> None:
    """Compact the session's history now (between turns)."""
    obj.require_session(session_id)
    runtime = runtime_for(obj, app_spec)
    with warnings.catch_warnings(record=True) as warned:  # a summarizer says why it declined
        warnings.simplefilter("always")
        upto = runtime.compact(session_id)
    if upto is None:
        why = [str(w.message) for w in warned if w.category.__name__ == "SummarizerDeclined"]
        note(f"the summarizer declined{f' ({why[-1]})' if why else ''}; nothing was compacted")
    obj.emit({"session": str(session_id), "upto_seq": upto},
             f"compacted up to seq {upto}" if upto else "not compacted")


@checked_first(not_blank("new_title", "'NEW_TITLE'", "a title cannot be empty"))
@click.command("title")
@click.argument("session_id", type=SESSION)
@click.argument("new_title", type=TEXT, required=False)
@click.pass_obj
def title(obj: CliContext, session_id: UUID, new_title: str | None) -> None:
    """Show the session's title, or set it to NEW_TITLE."""
    obj.require_session(session_id)
    if new_title is not None:
        value = obj.commands().set_title(session_id, new_title, by=operator())
        obj.emit({"session": str(session_id), "title": value}, value)
        return
    current = obj.views(reads=("title",), session=session_id).title(session_id)
    obj.emit({"session": str(session_id), "title": current}, current or "(untitled)")


@click.command("usage")
@click.argument("session_id", type=SESSION, required=False)
@click.option("--by", "by", type=Choice(["model", "turn", "purpose"]), default=None,
              help="Break the figures down by model or by turn (the steps), or by purpose: "
                   "the steps beside the upkeep's own model calls (compaction, title).")
@click.pass_obj
def usage(obj: CliContext, session_id: UUID | None, by: str | None) -> None:
    """Tokens and cost of the steps' model calls, for one session or all.

    The summarizer's and titler's calls are apart from these figures: `--by purpose` shows
    them beside the steps (STEPS counts their calls), and a session's budget counts them.
    """
    if by == "turn" and session_id is None:
        raise click.UsageError("--by turn needs a SESSION_ID")
    if session_id is not None:
        obj.require_session(session_id)
    views = obj.views(reads=("usage", "sessions") if by is None and session_id is None
                      else ("usage",), session=session_id)
    rows: dict[str, dict[str, Any]]
    if by == "turn":
        assert session_id is not None
        rows = {str(k): v.as_dict() for k, v in views.usage_by_turn(session_id).items()}
    elif by == "model":
        rows = {k: v.as_dict() for k, v in views.usage_by_model(session_id).items()}
    elif by == "purpose":
        steps = (views.usage(session_id) if session_id is not None
                 else _summed(views.usage_by_model()))
        rows = {"steps": steps.as_dict(),
                **{k: v.as_dict() for k, v in views.upkeep_usage(session_id).items()}}
    elif session_id is not None:
        rows = {str(session_id): views.usage(session_id).as_dict()}
    else:
        rows = {s.id: s.usage.as_dict() for s in views.sessions()}
    key = {"turn": "TURN", "model": "MODEL", "purpose": "PURPOSE"}.get(by or "", "SESSION")
    text = table([[k, str(v["prompt_tokens"]), str(v["completion_tokens"]), money(v["cost"]),
                   str(v["steps"])] for k, v in rows.items()],
                 [key, "PROMPT", "COMPLETION", "COST", "STEPS"])
    obj.emit(rows, text, rows=True)


def _summed(totals: dict[str, UsageTotals]) -> UsageTotals:
    """Totals added up (every model's, for every session's steps)."""
    from terret.domain.money import cost_figure
    from terret.projections.usage import UsageTotals

    return UsageTotals(sum(t.prompt_tokens for t in totals.values()),
                       sum(t.completion_tokens for t in totals.values()),
                       cost_figure(sum(t.cost for t in totals.values())),
                       sum(t.steps for t in totals.values()))


@click.command("events")
@click.pass_obj
def events(obj: CliContext) -> None:
    """The event catalogue: Terret's events and registered extensions."""
    from terret.domain.catalogue import catalogue

    types = list(catalogue)
    data = [{"wire_name": c.wire_name, "version": c.version, "model_visible": c.model_visible,
             "commutative": c.commutative, "builtin": catalogue.is_builtin(c.wire_name),
             "fields": sorted(c.model_fields)} for c in types]
    rows = [[c.wire_name, str(c.version), "yes" if c.model_visible else "",
             "yes" if c.commutative else "",
             "" if catalogue.is_builtin(c.wire_name) else "extension",
             ", ".join(sorted(c.model_fields))] for c in types]
    obj.emit(data, table(rows, ["WIRE NAME", "V", "VISIBLE", "COMMUTATIVE", "", "FIELDS"]))


def register(cli: click.Group) -> None:
    for command in (inject, cancel, resume, policy, model, compact, title, usage, events):
        cli.add_command(command)
