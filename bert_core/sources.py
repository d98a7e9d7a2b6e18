"""Where data comes from: the Hugging Face Hub by default, or one local data root.

Setting the environment variable ``BERT_DATA_ROOT`` to a directory laid out like ``shared/data`` (official
formats: ``glue/<TASK>/*.tsv``, ``squad/*.json``, ``conll2003/eng.*``, ``corpus/...``) points *every* source
of every stage at local files, and switches the Hub libraries to offline mode so no network is attempted.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "BERT_DATA_ROOT"


def data_root() -> Path | None:
    """The local data root, or ``None`` when sources load from the Hugging Face Hub.

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
    # Local mode must never touch the network.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    return root
