"""Usage a provider reports that no request can have — a negative count or one above 10^12, a
cost that is negative, NaN, infinite or above $1,000,000 — is recorded as unknown with a
WARNING, and the paid-for reply is kept: the turn failed with pydantic's own ValidationError
(negative, NaN) and lost the reply, or recorded an infinite cost as null while this process
counted it, and the next turn's budget check crashed."""

from __future__ import annotations

import logging

import pytest

from terret import Actor, Reply, Usage
from tests.runtime.conftest import MakeRuntime, OpenedStore
from tests.runtime.kit import only, other_process, read_log

OPERATOR = Actor(actor="operator", id="ops")


@pytest.mark.parametrize("usage", [
    Usage(prompt_tokens=-5, completion_tokens=3, cost=0.01),
    Usage(prompt_tokens=10, completion_tokens=3, cost=float("nan")),
    Usage(prompt_tokens=10, completion_tokens=3, cost=float("inf")),
    Usage(prompt_tokens=10, completion_tokens=3, cost=-0.5),
    Usage(prompt_tokens=10, completion_tokens=3, cost=1e300),
    Usage(prompt_tokens=10**13, completion_tokens=3, cost=0.01),
    Usage(prompt_tokens=10, completion_tokens=3, cost=10**400),  # overflowed isfinite
])
def test_impossible_usage_is_recorded_as_unknown_and_the_reply_kept(
        make_runtime: MakeRuntime, opened: OpenedStore, usage: Usage,
        caplog: pytest.LogCaptureFixture) -> None:
    rt = make_runtime([Reply(text="paid for", usage=usage), Reply(text="again")])
    sid = rt.create_session()
    rt.set_budget(sid, 1.0, by=OPERATOR)
    with caplog.at_level(logging.WARNING, logger="terret.runtime"):
        result = rt.run_turn(sid, "hello")
    assert (result.status, result.text) == ("completed", "paid for")
    assert any("no request can have" in r.getMessage() for r in caplog.records)
    (message,) = only(read_log(opened.store, sid), "assistant/message")
    # As docs/providers.md says: a wrong count makes the whole usage unknown (a negative count
    # kept its cost); a wrong cost is dropped, the counts kept (the compaction budget's).
    counts_right = usage.prompt_tokens in range(10**12 + 1)
    assert message.data["usage"] == ({"prompt_tokens": 10, "completion_tokens": 3}
                                     if counts_right else
                                     {"prompt_tokens": 0, "completion_tokens": 0})
    assert rt.run_turn(sid, "and again").status == "completed"  # the budget check reads it
    spent = rt.usage(sid)["cost"]
    assert spent == other_process(opened.uri, "usage", str(sid))["cost"]
