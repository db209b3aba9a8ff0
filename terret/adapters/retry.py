"""The one retry policy of the adapters that talk to a server: the model providers (bounded by a
count of retries) and the EventStoreDB store (bounded by time).

The n-th retry (0-based) waits ``min(backoff_cap, backoff_base * 2**n)``, scaled by a random
factor in ``[1 - jitter, 1]`` so that many clients cut off together do not come back in lock
step. A server that says when to come back (``Retry-After``) is trusted, within
``retry_after_cap``. A time-bounded policy also gives each attempt a deadline: ``call_timeout``,
capped by what is left of ``timeout``, never below ``min_call_timeout``.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RetryPolicy:
    backoff_base: float = 0.5
    backoff_cap: float = 8.0
    jitter: float = 0.5
    max_retries: int | None = None
    """How many retries an operation may make (None: bounded by ``timeout`` instead)."""
    timeout: float | None = None
    """How long an operation may keep failing (None: bounded by ``max_retries``)."""
    call_timeout: float | None = None
    """The deadline of one attempt (None: the caller's own)."""
    min_call_timeout: float = 0.5
    retry_after_cap: float = 30.0
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def delay(self, retry: int, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (0-based)."""
        if retry_after is not None:
            # The server knows when it will take us again; trust it, within reason.
            return max(0.0, min(retry_after, self.retry_after_cap))
        ceiling = min(self.backoff_cap, self.backoff_base * (2 ** max(0, retry)))
        return ceiling * (1.0 - self.jitter * self.rng.random())

    def gives_up(self, retries: int, started: float, pause: float) -> bool:
        """Whether an operation that began at ``started`` (``time.monotonic()``) and has failed
        ``retries + 1`` times must stop rather than wait ``pause`` and try again."""
        if self.max_retries is not None and retries >= self.max_retries:
            return True
        return self.timeout is not None and time.monotonic() - started + pause > self.timeout

    def attempt_timeout(self, started: float) -> float:
        """The deadline of the next attempt of an operation that began at ``started``."""
        call = self.call_timeout if self.call_timeout is not None else self.timeout
        if call is None:
            raise ValueError("a policy without call_timeout or timeout sets no deadline")
        if self.timeout is None:
            return call
        left = started + self.timeout - time.monotonic()
        return max(self.min_call_timeout, min(call, left))
