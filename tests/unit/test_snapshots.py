"""Snapshots of the session's state: typed records in memory, the same JSON on disk as when the
state was a dict of dicts, so a snapshot written by the previous shape still loads (or, when it
cannot be used, the repository replays the log); and ``created_on`` survives a load."""

from __future__ import annotations

import json
from typing import Any

from terret.adapters.stores.memory import MemoryStore
from terret.domain.events import Actor, ToolCallData
from terret.domain.repository import SessionRepository
from terret.domain.session import Session
from terret.domain.state import (
    BudgetWait,
    CancelRequest,
    InboxEntry,
    OwedCall,
    Owner,
    SessionState,
    Verdict,
    WaitingCall,
)
from terret.domain.store import session_stream

MODEL = "openai:gpt-4o"

# A snapshot as the dict-of-dict state wrote it (before the typed records), mid-turn: an owed
# call, a pending approval, a verdict, a cancel, an inbox entry, an owner, a budget wait.
OLD_SNAPSHOT: dict[str, Any] = {
    "agent": "default", "turn": 1, "turn_open": True, "step": 1, "step_open": True,
    "step_answered": True,
    "owed": {"c1": {"id": "c1", "name": "deploy", "args": {"env": "prod"}},
             "c2": {"id": "c2", "name": "rm", "args": {}}},
    "pending": {"c1": {"name": "deploy", "args": {"env": "prod"}}},
    "verdicts": {"c2": {"verdict": "denied", "reason": "no", "by": {"actor": "user"},
                        "key": '["rm",{}]'}},
    "cancel_requested": True, "cancel_by": {"actor": "operator", "id": "ana"},
    "cancel_reason": "freeze", "turn_input": True, "last_reply_final": False,
    "titled": False, "closed": False, "last_compaction_seq": 0, "last_visible_seq": 3,
    "inbox": {"i1": {"text": "later", "wake": True}}, "attached": "a1",
    "owner": {"agent_id": "a1", "worker": "w1", "host": "h", "pid": 7, "epoch": 1},
    "epoch": 1, "roles": {"main": MODEL}, "policy_seq": 0, "policy": None,
    "last_turn_status": None, "step_metered": True, "started": {}, "doubts": {},
    "doubt_verdicts": {}, "spent": 0.0, "turn_cost": 0.01, "dearest_call": 0.01,
    "budget": None, "budget_set": False,
    "budget_wait": {"turn": 1, "limit": 0.1, "spent": 0.08, "estimate": 0.03},
}


def test_a_snapshot_of_the_previous_shape_loads_into_typed_records() -> None:
    # (With the agent revision, kept since: a snapshot without it is replayed, below.)
    state = SessionState.from_json(json.dumps({**OLD_SNAPSHOT, "agent_revision": 3}).encode())
    assert state.agent_revision == 3
    assert state.owed == {"c1": OwedCall("c1", "deploy", {"env": "prod"}),
                          "c2": OwedCall("c2", "rm", {})}
    assert state.pending == {"c1": WaitingCall("deploy", {"env": "prod"})}
    assert state.verdicts == {"c2": Verdict("denied", "no", Actor(actor="user"), '["rm",{}]')}
    assert state.cancel == CancelRequest(Actor(actor="operator", id="ana"), "freeze")
    assert state.cancel_requested and state.cancel_reason == "freeze"
    assert state.inbox == {"i1": InboxEntry("later", True)}
    assert state.owner == Owner("a1", "h", 7, "w1", 1)
    assert state.budget_wait == BudgetWait(1, 0.1, 0.08, 0.03)
    assert state.created_on is None
    # ... and writes the same JSON back (the status view's rows and SQL read that shape).
    # (A field added since reads as its default: `released` says "may have run" at worst;
    # `call_steps` empty means each call id is its first step's; `turn_started_seq` 0 makes a
    # summary wait for the turn's end, as before it was kept; the last compaction covered up
    # to the seq before it, and the last message is the last model-visible event.)
    assert json.loads(state.to_json()) == {**OLD_SNAPSHOT, "agent_revision": 3,
                                              "created_on": None,
                                              "released": False, "call_steps": {},
                                              "turn_started_seq": 0, "turn_ended_seq": 0,
                                              "compacted_upto": 0}


def test_a_snapshot_of_another_shape_is_refused_so_the_log_is_replayed() -> None:
    for broken in ({**OLD_SNAPSHOT, "owner": {"who": "a1"}},       # a record of another shape
                   {**OLD_SNAPSHOT, "no_such_field": 1},           # a field this state lacks
                   {k: v for k, v in OLD_SNAPSHOT.items() if k != "spent"},  # before costs
                   OLD_SNAPSHOT):  # before the agent revision: it may not be session/started's
        try:
            SessionState.from_json(json.dumps(broken).encode())
        except (ValueError, TypeError):
            continue
        raise AssertionError(f"accepted {broken}")


def _session_with_history(store: MemoryStore) -> Session:
    repo = SessionRepository(store)
    session = Session.start(roles={"main": MODEL})
    session.start_turn(text="go")
    session.start_step(MODEL)
    session.record_assistant("", [ToolCallData(id="c1", name="deploy", args={"env": "prod"})])
    session.request_approval("c1", "deploy", {"env": "prod"})
    session.queue("later", wake=True)
    repo.save(session)
    return session


def test_an_unusable_snapshot_falls_back_to_a_replay_and_keeps_created_on() -> None:
    store = MemoryStore()
    session = _session_with_history(store)
    stream = session_stream(session.id)
    first = store.read_stream(stream, from_seq=1, limit=1)[0]
    replayed = SessionRepository(store).get(session.id)
    store.write_snapshot(stream, session.version, b'{"owner": {"who": "nobody"}}')
    loaded = SessionRepository(store).get(session.id)
    assert loaded.state == replayed.state
    assert loaded.state.created_on == first.recorded_at
    assert abs(loaded.created_on.timestamp() - first.recorded_at) < 1e-5


def test_created_on_is_preserved_across_a_load_from_a_snapshot() -> None:
    store = MemoryStore()
    session = _session_with_history(store)
    stream = session_stream(session.id)
    recorded = store.read_stream(stream, from_seq=1, limit=1)[0].recorded_at
    replayed = SessionRepository(store).get(session.id)
    assert replayed.state.created_on == recorded
    store.write_snapshot(stream, replayed.version, replayed.state.to_json())
    assert SessionRepository(store).get(session.id).state.created_on == recorded
    # A snapshot of the previous shape has no created_on: it is read from the first event.
    old = json.loads(replayed.state.to_json())
    del old["created_on"]
    store.write_snapshot(stream, replayed.version, json.dumps(old).encode())
    loaded = SessionRepository(store).get(session.id)
    assert loaded.state.created_on == recorded
    assert abs(loaded.created_on.timestamp() - recorded) < 1e-5
    assert loaded.state == replayed.state
    assert loaded.pending_approvals() == {"c1": WaitingCall("deploy", {"env": "prod"})}
    assert loaded.pending_inbox() == {next(iter(loaded.state.inbox)): InboxEntry("later", True)}


def test_a_snapshot_without_the_revision_gives_the_revision_of_the_log() -> None:
    """Why such a snapshot is refused: the revision may not be the default (here 3, and then
    4 by an ``agent/revised``), and only the log says which."""
    store = MemoryStore()
    repo = SessionRepository(store)
    session = Session.start(agent="ops", agent_revision=3, roles={"main": MODEL})
    session.run_under(4)
    session.start_turn(text="go")
    repo.save(session)
    old = json.loads(session.state.to_json())
    del old["agent_revision"]
    store.write_snapshot(session_stream(session.id), session.version, json.dumps(old).encode())
    assert repo.get(session.id).state.agent_revision == 4
