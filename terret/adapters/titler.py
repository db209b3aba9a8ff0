"""The role titler (R20): asks the ``titler`` model role for a short session title.

Being the runtime's default titler, it is defined with the upkeep in
:mod:`terret.runtime.maintenance` (the runtime does not import adapters) and re-exported here.
"""

from __future__ import annotations

from terret.runtime.maintenance import MAX_TITLE, TITLE_INSTRUCTION, RoleTitler, clean_title

__all__ = ["MAX_TITLE", "TITLE_INSTRUCTION", "RoleTitler", "clean_title"]
