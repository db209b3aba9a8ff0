"""Where the providers (and the Morph summarizer) take their secret from: the one
:class:`~terret.adapters.secret.Secret`, shared with the store adapters."""

from terret.adapters.secret import Secret, bearer_key, redact, scrub

__all__ = ["Secret", "bearer_key", "redact", "scrub"]
