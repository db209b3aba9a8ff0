"""The implicit ``default`` agent (no tools, allowing nothing) exists only for a runtime that
defines no agents at all; a runtime that defines agents serves those alone (docs/runtime.md,
*The pieces*). On SQLite and on the EventStoreDB adapter."""

from __future__ import annotations

import pytest

from terret import AgentDefinition, Reply, Runtime, ScriptedProvider, StaticResolver
from terret.domain.errors import ConfigurationError
from terret.domain.store import EventStore
from tests.runtime.conftest import MakeRuntime


def test_a_runtime_that_defines_agents_has_no_implicit_default(make_runtime: MakeRuntime,
                                                               store: EventStore) -> None:
    rt = make_runtime(definition=AgentDefinition(name="ops"))
    head = store.head_position()
    with pytest.raises(ConfigurationError, match="no agent definition named 'default'"):
        rt.create_session()
    assert store.head_position() == head

    # A session of agent `default` another process created is not served here.
    from terret.runtime.commands import SessionCommands

    sid = SessionCommands.on(store).create()
    head = store.head_position()
    for attempt in (lambda: rt.spawn_agent(sid), lambda: rt.run_turn(sid, "hello"),
                    lambda: rt.wake(sid)):
        with pytest.raises(ConfigurationError, match="no agent definition named 'default'"):
            attempt()
    assert store.head_position() == head
    assert rt.agent_for_session(sid) is None


def test_a_runtime_without_agents_serves_the_implicit_default(store: EventStore) -> None:
    rt = Runtime(store, resolver=StaticResolver(
        {"scripted": ScriptedProvider(default=Reply(text="ok"))})).start()
    try:
        sid = rt.create_session()
        assert rt.run_turn(sid, "hello").status == "completed"
        assert rt.agent_for_session(sid).definition == AgentDefinition()  # type: ignore[union-attr]
    finally:
        rt.close()
