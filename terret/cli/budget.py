"""``terret budget …`` (a session's spend budget) and ``terret in-doubt …`` (verdicts on tool
calls in doubt): decisions from any process. A turn parked on its budget, or on a call in doubt,
in ``terret serve`` goes on when the event reaches its subscription (the store is the bus)."""

from __future__ import annotations

import re
from typing import Any
from uuid import UUID

import click

from terret.cli._context import SESSION, CliContext, operator
from terret.cli._format import as_json, money, parked_json, table
from terret.cli._params import TEXT, NegativeNumbers
from terret.cli._verdicts import in_doubt as in_doubt_verdicts
from terret.domain.errors import shown
from terret.domain.money import cost_figure


class LimitType(click.ParamType):
    """A budget: a finite amount of money ≥ 0 (``5``, ``5.00``, ``$5.00``)."""

    name = "LIMIT"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        if isinstance(value, float):
            return value
        text = str(value)  # as typed: ' 5 ' is no amount people write either
        sign = text[0] if text.startswith(("-", "+")) else ""
        digits = text[len(sign):].removeprefix("$")  # $5, -$5
        if sign == "-" and digits.strip("0.") != "":  # -1, -$5, -inf: negative, whatever else
            self.fail(f"{shown(value)}: a budget is a finite amount of 0 or more", param, ctx)
        if not _AMOUNT.match(digits):  # no exponent, no '_', no nan: money as people write it
            self.fail(f"{shown(value)} is not an amount (say 5.00; at most {_MAX_DIGITS} digits "
                      "before the point)", param, ctx)
        return cost_figure(float(digits))  # a sign left here is '+', or '-' on a zero


_MAX_DIGITS = 12
_AMOUNT = re.compile(rf"(?:[0-9]{{1,{_MAX_DIGITS}}}(?:\.[0-9]*)?|\.[0-9]+)\Z")
"""ASCII digits only: ``\\d`` took Arabic-Indic and full-width digits, which ``float`` reads."""


LIMIT = LimitType()


@click.group("budget")
def budget() -> None:
    """The spend budget of sessions: what a session may cost in its lifetime."""




@budget.command("show")
@click.argument("session_id", type=SESSION)
@click.pass_obj
def show(obj: CliContext, session_id: UUID) -> None:
    """The session's budget, what it spent, and whether a turn is parked on it."""
    obj.require_session(session_id)
    obj.refuse_if_purged(session_id)
    state = obj.commands().writer.load(session_id).state  # the store's latest (R30)
    own = state.budget if state.budget_set else None
    wait = state.budget_wait
    data = {"session": str(session_id), "budget": own, "spent": cost_figure(state.total_cost),
            "estimate": state.dearest_call, "parked": parked_json(wait.to_dict() if wait else None)}
    lines = [
        "budget    " + (f"{money(own)} (its own)" if own is not None else
                        "none of its own: the serving deployment's default applies "
                        "(RuntimeConfig.spend_cap)"),
        f"spent     {money(state.total_cost)} (the next model call is estimated at "
        f"{money(state.dearest_call)}: the dearest so far)",
    ]
    if wait is not None:
        lines.append(f"parked    turn {wait.turn}: spent {money(wait.spent)} of "
                     f"{money(wait.limit)}; raise it (`terret budget set {session_id} "
                     f"AMOUNT`) or cancel the turn (`terret cancel {session_id}`)")
    obj.emit(data, "\n".join(lines))


@budget.command("set", cls=NegativeNumbers)
@click.argument("session_id", type=SESSION)
@click.argument("limit", type=LIMIT)
@click.option("--reason", type=TEXT, default=None, help="Recorded with the budget.")
@click.pass_obj
def set_budget(obj: CliContext, session_id: UUID, limit: float, reason: str | None) -> None:
    """Give the session a budget of its own (lifetime cost, in dollars as every cost is shown).
    A turn parked on its budget goes on if the new one covers its next step."""
    obj.require_session(session_id)
    obj.commands().set_budget(session_id, limit, by=operator(), reason=reason)
    obj.emit({"session": str(session_id), "budget": limit},
             f"budget of {session_id}: {money(limit)}")


@budget.command("clear")
@click.argument("session_id", type=SESSION)
@click.option("--reason", type=TEXT, default=None, help="Recorded with the change.")
@click.pass_obj
def clear(obj: CliContext, session_id: UUID, reason: str | None) -> None:
    """Drop the session's own budget: the deployment's default applies again."""
    obj.require_session(session_id)
    obj.commands().set_budget(session_id, None, by=operator(), reason=reason)
    obj.emit({"session": str(session_id), "budget": None},
             f"budget of {session_id}: the deployment's default")


@budget.command("list")
@click.pass_obj
def list_parked(obj: CliContext) -> None:
    """Sessions whose open turn is parked on its budget."""
    found = obj.views(reads=("status",)).parked_on_budget()
    data = [{"session": s.session.removeprefix("session-"), **(parked_json(s.budget_wait) or {})}
            for s in found]
    rows = [[d["session"], str(d["turn"]), money(d["spent"]), money(d["limit"]),
             money(d["estimate"])] for d in data]
    obj.emit(data, table(rows, ["SESSION", "TURN", "SPENT", "LIMIT", "NEXT CALL"]) if rows
             else "no turn is parked on its budget")


@click.group("in-doubt")
def in_doubt() -> None:
    """Tool calls in doubt: a tool that may not run twice started, and its process died
    before its result was recorded. `terret approvals list` shows them."""


_VERDICTS = in_doubt_verdicts()

rerun = _VERDICTS.command(
    "rerun", "rerun", "Run the call again (it may have taken effect the first time).",
    module=__name__, reason_required=False, reason_help="Recorded with the verdict.")

skip = _VERDICTS.command(
    "skip", "skipped", "Do not run the call again; the model sees an error result saying so.",
    module=__name__, reason_required=True, reason_help="Shown to the model and recorded.")

in_doubt.add_command(rerun)
in_doubt.add_command(skip)


def in_doubt_rows(obj: CliContext, session_id: UUID | None) -> list[dict[str, Any]]:
    """The calls in doubt of open turns, as ``approvals list`` shows them."""
    return [{"session": s.session.removeprefix("session-"), "call_id": c["id"],
             "tool": c["name"], "args": c["args"], "turn": s.turn, "waiting": "in_doubt"}
            for s, c in obj.views(reads=("status",)).in_doubt(session_id)]


def in_doubt_table_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    return [[r["session"], r["call_id"], r["tool"], as_json(r["args"])[:60], "in doubt"]
            for r in rows]


def register(cli: click.Group) -> None:
    cli.add_command(budget)
    cli.add_command(in_doubt)
