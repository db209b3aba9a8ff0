"""Session administration: inject, cancel, resume, policy, model, compact, title, usage, events."""

from __future__ import annotations

from uuid import UUID

import click

from terret.cli._app import load_app
from terret.cli._context import MODEL_SPEC, SESSION, CliContext, note, operator, table
from terret.cli._params import PATTERN, TEXT
from terret.domain.catalogue import catalogue
from terret.domain.errors import ConfigurationError, InvalidPayload, NoOpenTurn
from terret.runtime.runtime import Runtime

APP_OPTION = click.option(
    "--app", "app_spec", envvar="TERRET_APP", default=None, metavar="MODULE:FUNC",
    help="Function returning a terret.cli.App (agents, tools, providers). Env TERRET_APP.")



def runtime_for(obj: CliContext, app_spec: str | None) -> Runtime:
    try:
        app = load_app(app_spec)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc), param_hint="'--app'") from None
    runtime = Runtime(obj.store(), resolver=app.resolver, views=obj.view_store(),
                      config=app.config, agents=app.agents, summarizer=app.summarizer,
                      titler=app.titler)
    obj.closers.append(lambda: runtime.close(grace=0))
    return runtime


@click.command("inject")
@click.argument("session_id", type=SESSION)
@click.argument("text", type=TEXT)
@click.option("--wake", is_flag=True, help="Start a turn with it if the session is idle.")
@click.pass_obj
def inject(obj: CliContext, session_id: UUID, text: str, wake: bool) -> None:
    """Queue TEXT in the session's durable inbox; it rides the next step."""
    if not text.strip():
        raise click.BadParameter("the text cannot be empty", param_hint="TEXT")
    obj.require_session(session_id)
    inbox_id, _ = obj.writer().execute(session_id, lambda s: s.queue(text, wake=wake))
    obj.emit({"session": str(session_id), "inbox_id": inbox_id, "wake": wake},
             f"queued {inbox_id}" + (" (wake)" if wake else ""))


@click.command("cancel")
@click.argument("session_id", type=SESSION)
@click.option("--reason", type=TEXT, default=None, help="Recorded with the cancel.")
@click.pass_obj
def cancel(obj: CliContext, session_id: UUID, reason: str | None) -> None:
    """Cancel the open turn: recorded first; its serving process then denies standing
    approvals and closes the turn (or the next resume does)."""
    obj.require_session(session_id)
    obj.writer().execute(session_id, lambda s: s.request_cancel(by=operator(), reason=reason))
    obj.emit({"session": str(session_id), "cancel_requested": True},
             f"cancel recorded for {session_id}")


@click.command("resume")
@click.argument("session_id", type=SESSION)
@APP_OPTION
@click.pass_obj
def resume(obj: CliContext, session_id: UUID, app_spec: str | None) -> None:
    """Resume the session's open turn in this process (after a crash)."""
    obj.require_session(session_id)
    runtime = runtime_for(obj, app_spec).start()
    # The owed calls run first: the allow-list and approvals read the views, which must know
    # the session before they can allow anything.
    runtime.catch_up_views()
    if not runtime.resumable(session_id):  # before an agent attaches: a refusal writes nothing
        raise NoOpenTurn(f"session {session_id} has no open turn to resume")
    pending = runtime.views.pending(session_id)
    if pending:
        calls = ", ".join(p.call_id for p in pending)
        note(f"turn parked on {calls}: waiting for a verdict (`terret approve|deny "
             f"{session_id} CALL_ID` from another shell; Ctrl-C leaves the turn open)")
    result = runtime.resume_turn(session_id)
    obj.emit({"session": str(session_id), "turn": result.turn, "status": result.status},
             f"turn {result.turn} {result.status}")


@click.group("policy")
def policy() -> None:
    """The session's tool allow-list (glob patterns over tool names; deny by default)."""


@policy.command("show")
@click.argument("session_id", type=SESSION)
@click.pass_obj
def policy_show(obj: CliContext, session_id: UUID) -> None:
    """The patterns in force: the last policy/updated, else the agent's floor."""
    obj.require_session(session_id)
    patterns = obj.views().policy(session_id)
    obj.emit({"session": str(session_id), "patterns": patterns},
             "\n".join(patterns) if patterns else
             ("(deny all)" if patterns is not None else "none recorded (the agent's floor)"))


@policy.command("set")
@click.argument("session_id", type=SESSION)
@click.argument("patterns", nargs=-1, type=PATTERN)
@click.pass_obj
def policy_set(obj: CliContext, session_id: UUID, patterns: tuple[str, ...]) -> None:
    """Replace the allow-list; takes effect on the very next tool call."""
    obj.require_session(session_id)
    try:
        obj.writer().execute(session_id, lambda s: s.update_policy(patterns, by=operator()))
    except InvalidPayload as exc:
        raise click.BadParameter(str(exc), param_hint="PATTERN") from None
    obj.emit({"session": str(session_id), "patterns": list(patterns)},
             f"policy of {session_id}: {', '.join(patterns) or '(deny all)'}")


@click.group("model")
def model() -> None:
    """Model roles of a session (main, compactor, titler, …)."""


@model.command("set")
@click.argument("session_id", type=SESSION)
@click.argument("role", type=TEXT)
@click.argument("spec", type=MODEL_SPEC)
@click.pass_obj
def model_set(obj: CliContext, session_id: UUID, role: str, spec: str) -> None:
    """Point ROLE at SPEC (provider:model); the next step uses it."""
    obj.require_session(session_id)
    try:
        obj.writer().execute(session_id, lambda s: s.set_model(role, spec, by=operator()))
    except InvalidPayload as exc:
        raise click.BadParameter(str(exc)) from None
    obj.emit({"session": str(session_id), "role": role, "spec": spec}, f"{role} = {spec}")


@click.command("compact")
@click.argument("session_id", type=SESSION)
@APP_OPTION
@click.pass_obj
def compact(obj: CliContext, session_id: UUID, app_spec: str | None) -> None:
    """Compact the session's history now (between turns)."""
    obj.require_session(session_id)
    runtime = runtime_for(obj, app_spec)
    upto = runtime.compact(session_id)
    if upto is None:
        note("the summarizer declined; nothing was compacted")
    obj.emit({"session": str(session_id), "upto_seq": upto},
             f"compacted up to seq {upto}" if upto else "not compacted")


@click.command("title")
@click.argument("session_id", type=SESSION)
@click.argument("new_title", type=TEXT, required=False)
@click.pass_obj
def title(obj: CliContext, session_id: UUID, new_title: str | None) -> None:
    """Show the session's title, or set it to NEW_TITLE."""
    obj.require_session(session_id)
    if new_title is not None:
        if not new_title.strip():
            raise click.BadParameter("a title cannot be empty", param_hint="NEW_TITLE")
        value, _ = obj.writer().execute(session_id, lambda s: s.title(new_title, by=operator()))
        obj.emit({"session": str(session_id), "title": value}, str(value))
        return
    current = obj.views().title(session_id)
    obj.emit({"session": str(session_id), "title": current}, current or "(untitled)")


@click.command("usage")
@click.argument("session_id", type=SESSION, required=False)
@click.option("--by", "by", type=click.Choice(["model", "turn"]), default=None,
              help="Break the figures down by model or by turn.")
@click.pass_obj
def usage(obj: CliContext, session_id: UUID | None, by: str | None) -> None:
    """Tokens and cost, for one session or all."""
    if session_id is not None:
        obj.require_session(session_id)
    views = obj.views()
    rows: dict[str, dict[str, object]]
    if by == "turn":
        if session_id is None:
            raise click.UsageError("--by turn needs a SESSION")
        rows = {str(k): v.as_dict() for k, v in views.usage_by_turn(session_id).items()}
    elif by == "model":
        rows = {k: v.as_dict() for k, v in views.usage_by_model(session_id).items()}
    elif session_id is not None:
        rows = {str(session_id): views.usage(session_id).as_dict()}
    else:
        rows = {s.id: s.usage.as_dict() for s in views.sessions()}
    key = {"turn": "TURN", "model": "MODEL"}.get(by or "", "SESSION")
    text = table([[k, str(v["prompt_tokens"]), str(v["completion_tokens"]),
                   f"{float(v['cost']):.6f}", str(v["steps"])]  # type: ignore[arg-type]
                  for k, v in rows.items()],
                 [key, "PROMPT", "COMPLETION", "COST", "STEPS"])
    obj.emit(rows, text)


@click.command("events")
@click.pass_obj
def events(obj: CliContext) -> None:
    """The event catalogue: Terret's events and registered extensions."""
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
