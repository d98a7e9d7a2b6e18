"""Where data comes from: the Hugging Face Hub by default, or one local data root.

Setting the environment variable ``BERT_DATA_ROOT`` to a directory laid out like ``shared/data`` (official
formats: ``glue/<TASK>/*.tsv``, ``squad/*.json``, ``conll2003/eng.*``, ``corpus/...``) points *every* source
of every stage at local files, and switches the Hub libraries to offline mode so no network is attempted.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

ENV_VAR = "BERT_DATA_ROOT"
_HUB_ID = re.compile(
    r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*(?:@[A-Za-z0-9_.][A-Za-z0-9_./-]*)?$"
)


def is_hub_id(source: str) -> bool:
    """``owner/name`` or ``owner/name@revision`` (a commit, tag or branch) that is not a local path (a path
    that exists, or whose first part exists, is local)."""
    if not _HUB_ID.match(source) or source.startswith(("models:/", ".")):
        return False
    return not Path(source).exists() and not Path(source.split("/", 1)[0]).exists()


def split_hub_id(source: str) -> tuple[str, str | None]:
    """``owner/name@revision`` -> ``("owner/name", "revision")``; without ``@``, the revision is ``None`` (the
    newest)."""
    repo, _, revision = source.partition("@")
    return repo, revision or None


def data_root(*, offline: bool = True) -> Path | None:
    """The local data root, or ``None`` when sources load from the Hugging Face Hub.

    With a data root, ``offline`` switches the Hub libraries to offline mode for the rest of the process (a
    stage reading local data never waits on the network). The ``inputs`` stage passes ``False``: it asks the
    Hub only about what the params name there themselves (an own task's ``define.hub``, which its stage
    loads from the Hub whatever the data root).

    Raises:
        FileNotFoundError: ``BERT_DATA_ROOT`` is set but is not a directory.
    """
    value = os.environ.get(ENV_VAR, "").strip()
    if not value:
        return None
    root = Path(value).expanduser().resolve()
    if not root.is_dir():
        raise FileNotFoundError(
            f"{ENV_VAR}={value!r} is not a directory. Point it at a data root laid out like shared/data "
            f"(glue/, squad/, conll2003/, corpus/ ...), or unset it to load from the Hugging Face Hub."
        )
    if offline:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    return root
