"""Terret's typed errors, importable as ``terret.errors`` (``from terret.errors import
SessionNotFound``): this module *is* ``terret.domain.errors``, so ``except`` clauses written
against either name catch the same classes."""

import sys

from terret.domain import errors as _domain_errors

sys.modules[__name__] = _domain_errors
