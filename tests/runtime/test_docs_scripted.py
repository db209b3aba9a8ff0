"""docs/runtime.md, *Scripted models*: the example runs as written, and the tables name exactly
the arguments of ``ScriptedProvider`` and the fields of ``Reply``, ``Message`` and
``ModelRequest``, with their defaults — so a change to a scripted model's surface that is not
written down fails here."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

from terret import Message, Reply, ScriptedProvider, Usage, call
from terret.runtime import ModelRequest, ToolSpec
from tests.runtime.kit import REPO

DOC = REPO / "docs" / "runtime.md"
ROW = re.compile(r"^\| `([a-z_]+)` \|(.*)$", re.M)


def section() -> str:
    text = DOC.read_text()
    assert "\n## Scripted models\n" in text, "docs/runtime.md has no *Scripted models* section"
    return text.split("\n## Scripted models\n", 1)[1].split("\n## ", 1)[0]


def table_after(heading_cell: str) -> dict[str, str]:
    """The rows (first cell → the rest of the row) of the table whose header starts with
    ``| <heading_cell> |``."""
    body = section()
    start = body.index(f"| {heading_cell} |")
    rows = body[start:].split("\n\n", 1)[0]
    return {name: rest for name, rest in ROW.findall(rows)}


def literal(value: Any) -> str:
    if value is None or isinstance(value, (bool, int, str)):
        return f"`{value!r}`".replace("'", '"') if isinstance(value, str) else f"`{value}`"
    return f"`{value!r}`"


def fields(cls: type) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
        else:
            out[f.name] = inspect.Parameter.empty
    return out


def test_the_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    found = re.search(r"<!-- example: scripted-model -->\s*```python\n(.*?)```", section(), re.S)
    assert found, "no scripted-model example"
    monkeypatch.chdir(tmp_path)
    exec(compile(found.group(1), f"{DOC.name} (scripted-model)", "exec"),
         {"__name__": "docs_scripted"})


def test_scripted_provider_arguments() -> None:
    rows = table_after("argument")
    signature = inspect.signature(ScriptedProvider)
    assert set(rows) == set(signature.parameters), (sorted(rows), list(signature.parameters))
    parts: list[str] = []
    for parameter in signature.parameters.values():
        if parameter.kind is parameter.KEYWORD_ONLY and "*" not in parts:
            parts.append("*")
        parts.append(f"{parameter.name}={parameter.default!r}".replace("'", '"'))
    synopsis = f"ScriptedProvider({', '.join(parts)})"
    assert f"`{synopsis}`" in section(), synopsis
    provider = ScriptedProvider()
    for documented in ("script(", "remaining", "requests"):
        assert documented in section()
        assert hasattr(provider, documented.rstrip("("))


@pytest.mark.parametrize("cls, heading", [(Reply, "field"), (Message, "`Message` field")])
def test_reply_and_message_fields(cls: type, heading: str) -> None:
    rows = table_after(heading)
    actual = fields(cls)
    assert set(rows) == set(actual), (cls.__name__, sorted(rows), sorted(actual))
    for name, default in actual.items():
        cells = rows[name].split("|")
        documented = cells[0].strip()
        if default is inspect.Parameter.empty:
            assert documented == "", (name, documented)
        elif isinstance(default, (list, tuple)):
            assert documented == f"`{default!r}`", (name, documented)
        else:
            assert documented == literal(default), (name, documented, default)


def test_request_usage_and_call_are_described() -> None:
    body = section()
    for name in (f.name for f in dataclasses.fields(ModelRequest)):
        assert f"`{name}`" in body, f"ModelRequest.{name} is not described"
    for name in (f.name for f in dataclasses.fields(ToolSpec)):
        assert f"`{name}`" in body, f"ToolSpec.{name} is not described"
    usage = ", ".join(f"{f.name}={f.default!r}" for f in dataclasses.fields(Usage))
    assert f"`Usage({usage})`" in body
    call_signature = ", ".join(
        f"{p.name}={p.default!r}" if p.default is not p.empty else p.name
        for p in inspect.signature(call).parameters.values())
    assert f"`call({call_signature})`" in body
    assert call("x").id == "" and "`call-<n>`" in body  # the provider numbers unnamed calls
    roles = re.search(r"`role` \| \| (.*?) \|", body)
    assert roles, "the role row"
    for role in ("system", "user", "assistant", "tool"):
        assert f"`{role}`" in roles.group(1)


def test_keep_bounds_the_requests_a_provider_keeps() -> None:
    provider = ScriptedProvider(default=Reply(text="ok"), keep=2)
    for n in range(5):
        provider.complete(ModelRequest(model="m", messages=[Message(role="user", text=str(n))]))
    assert [r.messages[0].text for r in provider.requests] == ["3", "4"]
    nothing = ScriptedProvider(default=Reply(text="ok"), keep=0)
    nothing.complete(ModelRequest(model="m", messages=[]))
    assert nothing.requests == []
    from terret.domain.errors import ConfigurationError

    for bad in (-1, True, 1.5):
        with pytest.raises(ConfigurationError, match="keep is a whole number"):
            ScriptedProvider(keep=bad)  # type: ignore[arg-type]


def test_a_default_that_takes_its_time_holds_up_no_other_request() -> None:
    """providers.md: providers are shared by every session and role, thread-safe. A
    ``default`` that thinks (sleeps) ran under the provider's lock: every other session's
    request, and the upkeep's, waited in line behind it."""
    import threading
    import time

    from terret import Message, Reply, ScriptedProvider
    from terret.runtime.model import ModelRequest

    def think(request: ModelRequest) -> Reply:
        if request.messages[-1].text == "slow":
            time.sleep(2.0)
        return Reply(text="ok")

    provider = ScriptedProvider(default=think)
    slow = threading.Thread(target=lambda: provider.complete(ModelRequest(
        model="m", messages=(Message("user", "slow"),))))
    slow.start()
    time.sleep(0.2)
    began = time.monotonic()
    provider.complete(ModelRequest(model="m", messages=(Message("user", "fast"),)))
    assert time.monotonic() - began < 1.0
    slow.join()
