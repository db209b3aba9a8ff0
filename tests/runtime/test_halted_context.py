"""The model's context is the messages view: one halted (a record in any session it could not
process) held an old conversation, and every later turn of every session asked the model with
it — answered, ``completed``, nobody told; a compaction summarized it and marked the log's head,
so the history after the halt was lost to the model for good. Now a step refuses to ask the
model from a view halted before its own writes (the turn ends ``failed`` with
``ProjectionHalted``), and a compaction refuses before its summarizer is asked; once the
operator skips the bad event, turns go on with the whole conversation. On SQLite and on the
EventStoreDB emulator."""

from __future__ import annotations

import json
from uuid import uuid4

import pytest

from terret import Reply, ScriptedProvider
from terret.domain.errors import ProjectionHalted
from terret.domain.store import NewRecord, session_stream
from terret.runtime.model import ModelRequest
from tests.runtime.conftest import MakeRuntime
from tests.runtime.kit import only, read_log, wait_until


def test_a_halted_messages_view_is_never_the_models_context(make_runtime: MakeRuntime,
                                                             store) -> None:
    def answer(request: ModelRequest) -> Reply:
        return Reply(text="seen: " + " | ".join(m.text for m in request.messages
                                                  if m.role == "user"))

    provider = ScriptedProvider(default=answer)
    rt = make_runtime(provider)
    sid, other = rt.create_session(), rt.create_session()
    assert rt.run_turn(sid, "alpha").status == "completed"
    # Another session's record the messages projection cannot process (text that is no text).
    stream = session_stream(other)
    store.append(stream, [NewRecord(uuid4(), "assistant/message", json.dumps({"text": 5})
                                    .encode(), b'{"schema_version":2}')],
                 store.stream_version(stream))
    rt.catch_up_views()
    wait_until(lambda: rt.views.store.fault("messages") is not None,
               what="the messages projection to halt")
    asked = len(provider.requests)

    with pytest.raises(ProjectionHalted, match="'messages' halted"):
        rt.run_turn(sid, "beta")
    assert len(provider.requests) == asked  # the model was not asked with an old conversation
    end = only(read_log(store, sid), "turn/end")[-1].data
    assert end["status"] == "failed" and end["error"].startswith("ProjectionHalted: ")

    with pytest.raises(ProjectionHalted):
        rt.compact(sid)
    assert len(provider.requests) == asked
    assert not only(read_log(store, sid), "session/compacted")

    rt.runner.skip("messages")  # the operator's `terret projections skip messages`
    result = rt.run_turn(sid, "gamma")
    assert (result.status, result.text) == ("completed", "seen: alpha | beta | gamma")
