"""What ``dvc status`` says of the real pipeline, whose ``inputs`` stage it always lists (``always_changed``)."""

from __future__ import annotations

import re

_INPUTS = re.compile(r"^inputs:\n\s+always changed\n?", re.M)


def up_to_date(status: str) -> bool:
    """Whether ``dvc status`` found nothing to do but the ``inputs`` stage, which runs on every repro."""
    rest = _INPUTS.sub("", status).strip()
    return not rest or "up to date" in rest
