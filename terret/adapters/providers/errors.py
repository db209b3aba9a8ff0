"""Provider failures more specific than :class:`ProviderError`; all of them subclass it, so
code that catches ``ProviderError`` needs to know nothing about these."""

from __future__ import annotations

from terret.domain.errors import ProviderError


class ProviderHTTPError(ProviderError):
    """The endpoint answered with an HTTP error status. ``status`` is that status."""

    def __init__(self, provider: str, status: int, detail: str) -> None:
        self.status = status
        super().__init__(provider, f"HTTP {status}: {detail}" if detail else f"HTTP {status}")


class UpstreamError(ProviderError):
    """The stream itself carried an error (OpenRouter reports an upstream provider failing
    mid-stream as a chunk with an ``error`` object and ``finish_reason: "error"``)."""

    def __init__(self, provider: str, message: str, *, code: object = None) -> None:
        self.code = code
        super().__init__(
            provider, f"upstream error: {message}" + (f" (code {code})" if code else "")
        )


class StreamBroken(ProviderError):
    """The connection failed, or the stream ended early, after the reply had begun. The step
    fails: a partial message is never passed off as a complete one."""
