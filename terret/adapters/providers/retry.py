"""The providers' retries: which statuses to retry, ``Retry-After`` parsing, and the shared
retry policy (``terret.adapters.retry``) built from a ``RetryConfig``."""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime

from terret.adapters.providers.config import RetryConfig
from terret.adapters.retry import RetryPolicy

__all__ = ["RETRYABLE_STATUSES", "RetryPolicy", "is_retryable_status", "parse_retry_after",
           "policy_for"]

#: Statuses worth another attempt: timeouts, throttling and server-side failures.
RETRYABLE_STATUSES = frozenset({408, 429})


def is_retryable_status(status: int) -> bool:
    return status in RETRYABLE_STATUSES or status >= 500


def policy_for(config: RetryConfig, *, rng: random.Random | None = None) -> RetryPolicy:
    """The retry policy a provider follows: ``config.max_retries`` retries, backoff and
    ``Retry-After`` as configured."""
    return RetryPolicy(backoff_base=config.backoff_base, backoff_cap=config.backoff_cap,
                       jitter=config.jitter, max_retries=config.max_retries,
                       retry_after_cap=config.retry_after_cap, rng=rng or random.Random())


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
