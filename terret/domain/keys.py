"""What an API key looks like, so that one pasted where a model spec belongs is never recorded:
a session's log keeps what is written to it for good (R1), and shows it to every reader."""

from __future__ import annotations

import re

KEY_SHAPES = re.compile(
    r"(?:^|[^A-Za-z0-9])(?:"
    r"sk[-_][A-Za-z0-9_-]{20,}"             # OpenAI, Anthropic, OpenRouter, DeepSeek
    r"|A[KS]IA[A-Z0-9]{16}"                 # AWS access key ids
    r"|AIza[A-Za-z0-9_-]{30,}"              # Google
    r"|gsk_[A-Za-z0-9]{20,}|xai-[A-Za-z0-9]{20,}"  # Groq, xAI
    r"|hf_[A-Za-z0-9]{30,}"                 # Hugging Face
    r"|gh[pos]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,}|glpat-[A-Za-z0-9_-]{20,}"
    r"|xox[bp]-[A-Za-z0-9-]{10,}"           # Slack
    r")")
"""How common API keys look: their prefix and the length of what follows it."""

_RANDOM_RUN = re.compile(r"[A-Za-z0-9]{32,}")


def looks_like_key(spec: str) -> bool:
    """Whether a ``provider:model`` spec's model looks like an API key pasted in the wrong
    place (``openai:sk-…``): shaped as common keys are (``KEY_SHAPES``), or holding a run of
    32 or more letters and digits with no separator that mixes upper case, lower case and
    digits, as random keys do — model names have dashes, dots or slashes every few
    characters, and a version or deployment id is hex (one case)."""
    model = spec.partition(":")[2]
    if KEY_SHAPES.search(model):
        return True
    return any(re.search(r"\d", run) and re.search(r"[a-z]", run) and re.search(r"[A-Z]", run)
               for run in _RANDOM_RUN.findall(model))


KEY_REFUSED = ("the model looks like an API key, not a model name (a key recorded in a "
               "session's log stays there)")
"""Why a spec whose model looks like an API key is refused (the spec itself is not quoted)."""
