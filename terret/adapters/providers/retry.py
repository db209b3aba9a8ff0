"""Backoff with jitter, and ``Retry-After`` parsing."""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime

from terret.adapters.providers.config import RetryConfig

#: Statuses worth another attempt: timeouts, throttling and server-side failures.
RETRYABLE_STATUSES = frozenset({408, 429})


def is_retryable_status(status: int) -> bool:
    return status in RETRYABLE_STATUSES or status >= 500


class RetryPolicy:
    """Computes how long to wait before retry number ``attempt`` (0-based)."""

    def __init__(self, config: RetryConfig, *, rng: random.Random | None = None) -> None:
        self.config = config
        self._rng = rng or random.Random()

    @property
    def max_retries(self) -> int:
        return self.config.max_retries

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        if retry_after is not None:
            # The server knows when it will take us again; trust it, within reason.
            return max(0.0, min(retry_after, self.config.retry_after_cap))
        ceiling = min(self.config.backoff_cap, self.config.backoff_base * (2**attempt))
        return ceiling * (1.0 - self.config.jitter * self._rng.random())


def parse_retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds to wait, from ``retry-after-ms`` (OpenAI), ``Retry-After: <seconds>`` or
    ``Retry-After: <HTTP-date>``; ``None`` when absent or unreadable."""
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return max(0.0, float(millis) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)
