"""docs/runtime.md's example runs as written: a tool that needs a human, parked, approved from
another process (the CLI), and the turn completes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.runtime.kit import REPO

DOC = REPO / "docs" / "runtime.md"


def example(name: str) -> str:
    text = DOC.read_text()
    found = re.search(rf"<!-- example: {name}\b[^>]*-->\s*```python\n(.*?)```", text, re.S)
    assert found, f"no example {name!r} in {DOC}"
    return found.group(1)


def test_the_approval_example_runs_as_documented(tmp_path: Path) -> None:
    script = tmp_path / "approval_example.py"
    script.write_text(example("approval"))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(script)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "parked: ['call-1'] waiting_approval"
    assert lines[1] == 'approved call-1: deploy {"env": "prod"}'  # the CLI, in the other process
    assert lines[2] == "turn 1 completed - Deployed to prod."
    events = lines[3].split()
    assert events[:2] == ["session/started", "agent/attached"]
    assert events.index("approval/requested") < events.index("approval/resolved") \
        < events.index("tool/result") < events.index("turn/end")
    documented = DOC.read_text().split("It prints", 1)[1]
    assert all(line in documented for line in lines[:3])
    assert " ".join(events[:14]) in documented
