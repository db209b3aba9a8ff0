"""A new release of the app takes over a turn an older one parked on an approval (a rolling
deploy, a restart after an upgrade): what a person was asked, and what they decided, is the
log's, not the new release's tool definition's (R11, R12).

The older release is another process (``tests.runtime.proc park``: ``deploy`` asks always, no
arguments; it parks on ``c-park`` and dies). The new release is this test's runtime, with a
``deploy`` that asks nobody, or takes other arguments. On SQLite and the EventStoreDB adapter.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from pydantic import BaseModel

from terret import CallContext, Tool
from terret.domain.errors import ConfigurationError
from tests.runtime.conftest import MakeRuntime, OpenedStore
from tests.runtime.kit import Background, final, names, only, other_process, read_log, wait_until


class _NoArgs(BaseModel):
    pass


class _Versioned(BaseModel):
    version: str


def _deploy(ran: list[dict[str, Any]], *, args: type[BaseModel] = _NoArgs,
            approval: Any = "never") -> Tool:
    def handler(parsed: BaseModel, ctx: CallContext) -> str:
        ran.append(parsed.model_dump())
        return "deployed"

    return Tool(name="deploy", description="deploys", args=args, handler=handler,
                approval=approval)


def _parked_by_an_older_release(opened: OpenedStore, make_runtime: MakeRuntime) -> Any:
    sid = make_runtime(start=False).create_session()
    assert other_process(opened.uri, "park", str(sid))["pending"] == ["c-park"]
    return sid


@pytest.mark.parametrize("verdict", ["approve", "deny"])
def test_a_call_parked_by_a_release_that_asked_waits_for_its_verdict_under_one_that_does_not(
        make_runtime: MakeRuntime, opened: OpenedStore, verdict: str) -> None:
    """The new release's ``deploy`` asks nobody: the call parked on a request still waits for
    the person's verdict — it does not run on its own — and the verdict, given from another
    process, decides it."""
    sid = _parked_by_an_older_release(opened, make_runtime)
    ran: list[dict[str, Any]] = []
    rt = make_runtime([final()], tools=[_deploy(ran)])
    resumed = Background(lambda: rt.resume_turn(sid))
    wait_until(lambda: (a := rt.agent_for_session(sid)) is not None
               and a.status == "waiting_approval", what="the resumed turn to park")
    time.sleep(0.3)  # a release that ran it would have by now
    assert ran == [] and "tool/result" not in names(read_log(opened.store, sid))
    if verdict == "approve":
        other_process(opened.uri, "approve", str(sid), "c-park")
    else:
        other_process(opened.uri, "deny", str(sid), "c-park", "not today")
    assert resumed.join().status == "completed"
    log = read_log(opened.store, sid)
    (result,) = only(log, "tool/result")
    if verdict == "approve":
        assert ran == [{}] and result.data["content"] == "deployed"
    else:
        assert ran == [] and result.data["is_error"] and "not today" in result.data["content"]
    assert len(only(log, "approval/resolved")) == 1


def test_a_denial_recorded_before_an_upgrade_is_kept_by_a_release_that_does_not_ask(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    sid = _parked_by_an_older_release(opened, make_runtime)
    other_process(opened.uri, "deny", str(sid), "c-park", "frozen")
    ran: list[dict[str, Any]] = []
    rt = make_runtime([final()], tools=[_deploy(ran)])
    assert rt.resume_turn(sid).status == "completed"
    (result,) = only(read_log(opened.store, sid), "tool/result")
    assert ran == [] and result.data["is_error"] and "frozen" in result.data["content"]


@pytest.mark.parametrize("decided", [False, True])
def test_a_call_a_person_was_asked_about_with_arguments_a_new_release_refuses_is_left_alone(
        make_runtime: MakeRuntime, opened: OpenedStore, decided: bool) -> None:
    """The new release's ``deploy`` requires a ``version``: answering the parked (or approved)
    call "invalid arguments" would drop what a person was asked about. The session is refused,
    as for a tool the app lacks, and nothing is written; a process with the older tool runs the
    approved call once."""
    sid = _parked_by_an_older_release(opened, make_runtime)
    if decided:
        other_process(opened.uri, "approve", str(sid), "c-park")
    before = read_log(opened.store, sid)
    ran: list[dict[str, Any]] = []
    new = make_runtime([final()], tools=[_deploy(ran, args=_Versioned, approval="always")])
    with pytest.raises(ConfigurationError, match=r"c-park.*'deploy'.*version") as refused:
        new.resume_turn(sid)
    assert "close the turn with a cancel" in str(refused.value)
    assert read_log(opened.store, sid) == before and ran == []
    new.close()
    older = make_runtime([final()], tools=[_deploy(ran, approval="always")])
    if not decided:
        other_process(opened.uri, "approve", str(sid), "c-park")
    assert older.resume_turn(sid).status == "completed"
    assert ran == [{}]


def test_a_denied_call_whose_arguments_a_new_release_refuses_is_closed_without_running(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    """Denied, the call runs nothing under any release: the new one takes the session and
    closes the turn, the call not run."""
    sid = _parked_by_an_older_release(opened, make_runtime)
    other_process(opened.uri, "deny", str(sid), "c-park", "no")
    ran: list[dict[str, Any]] = []
    rt = make_runtime([final()], tools=[_deploy(ran, args=_Versioned, approval="always")])
    assert rt.resume_turn(sid).status == "completed"
    (result,) = only(read_log(opened.store, sid), "tool/result")
    assert ran == [] and result.data["is_error"]


def test_a_session_moved_away_and_back_records_the_revision_its_turns_run_under(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    """Two releases each run a turn of the session in turn (web workers of a rolling deploy,
    each calling ``run_turn``): each move is recorded with the revision the next turn runs
    under. A process whose agent for the session was still registered took it back without
    recording its revision: the log said the turn ran under the other release's."""
    from terret import AgentDefinition

    old = make_runtime([final("one"), final("three"), final("five")], start=False,
                       definition=AgentDefinition(revision=1, allow=["*"]))
    new = make_runtime([final("two"), final("four")], start=False,
                       definition=AgentDefinition(revision=2, allow=["*"]))
    sid = old.create_session()
    for rt in (old, new, old, new, old):
        assert rt.run_turn(sid, "next").status == "completed"
    log = read_log(opened.store, sid)
    revised = [(e.data["previous"], e.data["revision"]) for e in only(log, "agent/revised")]
    assert revised == [(1, 2), (2, 1), (1, 2), (2, 1)], names(log)
    # Each turn under the revision the log names for it: the last recorded before its start.
    under, runs = 1, []
    for e in log:
        if e.name == "agent/revised":
            under = e.data["revision"]
        elif e.name == "turn/start":
            runs.append(under)
    assert runs == [1, 2, 1, 2, 1]


def test_an_agent_that_takes_its_session_back_records_its_revision(
        make_runtime: MakeRuntime, opened: OpenedStore) -> None:
    """The race the test above cannot time: a process looks its agent for the session up,
    and before its turn starts another release moves the session away (its turn runs, under
    revision 2). The agent's start takes the session back — and ran its turn under revision 1
    while the log's last word was revision 2. Called here on the agent itself, as the runtime
    does once it has looked the agent up."""
    from terret import AgentDefinition

    old = make_runtime([final("one"), final("three")], start=False,
                       definition=AgentDefinition(revision=1, allow=["*"]))
    new = make_runtime([final("two")], start=False,
                       definition=AgentDefinition(revision=2, allow=["*"]))
    sid = old.create_session()
    agent = old.spawn_agent(sid)
    assert old.run_turn(sid, "first").status == "completed"
    assert new.run_turn(sid, "moved").status == "completed"  # another process's turn
    assert agent.run_turn("back").status == "completed"
    log = read_log(opened.store, sid)
    revised = [(e.data["previous"], e.data["revision"]) for e in only(log, "agent/revised")]
    assert revised == [(1, 2), (2, 1)], names(log)
    back = only(log, "agent/revised")[-1].seq
    assert back < only(log, "turn/start")[-1].seq  # recorded before the turn it runs under
