"""A second process for the runtime tests: ``python -m tests.runtime.proc STORE_URI ACTION ...``.

It opens the same store (a SQLite file or an EventStoreDB URI) with a runtime that is never
started (no subscription, no agents: an operator's CLI), or with the bare ``Session`` aggregate,
does one thing and prints a JSON line.

Actions:
  approve SID CALL_ID            Runtime.approve by an operator
  deny SID CALL_ID REASON        Runtime.deny by an operator
  resolve-raw SID CALL_ID        approval/resolved appended through SessionRepository
  inject SID TEXT [wake]         Runtime.inject
  policy SID PATTERN...          Runtime.set_policy
  cancel SID                     Runtime.cancel by an operator
  assistant SID TEXT             assistant/message appended through SessionRepository (taking
                                 over the open step: not commutative)
"""

from __future__ import annotations

import json
import sys
from uuid import UUID

from terret import Actor, Runtime, SessionRepository, StaticResolver
from terret.adapters.stores import open_store
from terret.domain.errors import WrongExpectedVersion

OPERATOR = Actor(actor="operator", id="proc")


def main(argv: list[str]) -> dict[str, object]:
    uri, action, sid_text, *rest = argv
    store = open_store(uri)
    sid = UUID(sid_text)
    try:
        if action in ("resolve-raw", "assistant"):
            return _raw(store, action, sid, rest)
        rt = Runtime(store, resolver=StaticResolver())
        try:
            if action == "approve":
                rt.approve(sid, rest[0], by=OPERATOR)
            elif action == "deny":
                rt.deny(sid, rest[0], by=OPERATOR, reason=rest[1])
            elif action == "inject":
                inbox_id = rt.inject(sid, rest[0], wake=rest[1:] == ["wake"])
                return {"ok": True, "inbox_id": inbox_id}
            elif action == "policy":
                rt.set_policy(sid, rest, by=OPERATOR)
            elif action == "cancel":
                rt.cancel(sid, by=OPERATOR, reason="from another process")
            else:
                raise SystemExit(f"unknown action {action!r}")
        finally:
            rt.close()
        return {"ok": True}
    finally:
        store.close()


def _raw(store: object, action: str, sid: UUID, rest: list[str]) -> dict[str, object]:
    repository = SessionRepository(store)  # type: ignore[arg-type]
    for _ in range(20):
        session = repository.get(sid)
        if action == "resolve-raw":
            session.resolve_approval(rest[0], "approved", by=OPERATOR, reason="raw")
        else:
            session.record_assistant(rest[0])
        try:
            result = repository.save(session)
        except WrongExpectedVersion:
            continue
        assert result is not None
        return {"ok": True, "version": result.version}
    raise SystemExit("too many conflicts")


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])), flush=True)
