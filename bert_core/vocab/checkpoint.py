"""The ``vocab`` stage for continued pretraining: the vocabulary and initial weights of a released checkpoint.

With ``vocab.from_checkpoint`` set, the stage trains no vocabulary: it copies the tokenizer of a Hugging
Face BERT directory (``tokenizer.json`` and/or ``vocab.txt``) into ``data/vocab``, with ``vocab.txt``
written from it when the checkpoint ships ``tokenizer.json`` only (the ``pretrain_data`` stage reads the
special ids from ``vocab.txt``), and the checkpoint's ``config.json`` and weights into
``data/vocab/checkpoint/``. The ``pretrain_data`` stage then builds its instances with that tokenizer and
the ``pretrain`` stage initialises the model from ``data/vocab/checkpoint`` (:mod:`bert_core.pretrain.init`).

Why the vocab stage owns the checkpoint: the tokenizer and the weights must come from the same checkpoint,
and a Hub id or a registry alias (``models:/bert-pretrained@newest``) can name another one tomorrow. One
key names it, the stage resolves it once, and everything downstream reads the copy, which DVC caches and
tracks as the ``data/vocab`` output that ``pretrain_data`` and ``pretrain`` already depend on.

Refused, each naming the key and the path: a directory that is not a BERT checkpoint (``model_type``
other than ``bert``, missing ``config.json``, weights or tokenizer), a tokenizer whose size differs from
the word-embedding table (the vocabulary and the weights come from different checkpoints), a tokenizer
without BERT's special tokens, and a ``vocab.vocab_size`` or ``vocab.lowercase`` that contradicts the
checkpoint. The other training keys of ``vocab`` are not used.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

from bert_core.atomic import atomic_path
from bert_core.constants import SPECIAL_TOKENS
from bert_core.inputs import Reads, checkpoint
from bert_core.vocab.train import VocabError, VocabParams, VocabStats, _heldout_sentences, segmentation_stats

log = logging.getLogger(__name__)

KEY = "vocab.from_checkpoint"
#: The subdirectory of the vocab output that holds the checkpoint's config and weights.
CHECKPOINT_SUBDIR = "checkpoint"
#: What the vocab stage records about the checkpoint it copied (``checkpoint/source.json``).
SOURCE_FILE = "source.json"
_COPIED_CONFIGS = ("tokenizer_config.json", "special_tokens_map.json")


class CheckpointVocabError(VocabError, ValueError):
    """A checkpoint whose vocabulary cannot be used; the message names ``vocab.from_checkpoint`` and the path."""


def _tokenizer(model_dir: Path, where: str):
    """The checkpoint's fast tokenizer (``tokenizer.json``, else ``vocab.txt`` with its casing), no
    truncation or padding."""
    from tokenizers import Tokenizer

    if (model_dir / "tokenizer.json").is_file():
        tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    else:
        from tokenizers.implementations import BertWordPieceTokenizer

        config: dict[str, Any] = {}
        if (model_dir / "tokenizer_config.json").is_file():
            config = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
        lower = bool(config.get("do_lower_case", True))
        strip = config.get("strip_accents")
        tok = BertWordPieceTokenizer(
            str(model_dir / "vocab.txt"),
            lowercase=lower,
            strip_accents=lower if strip is None else bool(strip),
            clean_text=True,
            handle_chinese_chars=bool(config.get("tokenize_chinese_chars", True)),
        )._tokenizer
    tok.no_truncation()
    tok.no_padding()
    if tok.get_vocab_size(with_added_tokens=True) == 0:
        raise CheckpointVocabError(f"{where}: the tokenizer is empty")
    return tok


def _tokens_in_id_order(tok: Any, where: str) -> list[str]:
    """The vocabulary as ``vocab.txt`` lines: ids must run 0..n-1 without a gap."""
    vocab = tok.get_vocab(with_added_tokens=True)
    by_id: dict[int, str] = {}
    for token, i in vocab.items():
        by_id.setdefault(i, token)
    n = len(by_id)
    gaps = [i for i in range(n) if i not in by_id][:5]
    if gaps or max(by_id) != n - 1:
        raise CheckpointVocabError(
            f"{where}: the tokenizer's ids are not 0..{n - 1} without gaps (missing {gaps or [max(by_id)]}); "
            "a BERT vocabulary numbers its tokens by line. Use the tokenizer released with this checkpoint"
        )
    tokens = [by_id[i] for i in range(n)]
    bad = [t for t in tokens if not t or "\n" in t]
    if bad:
        raise CheckpointVocabError(f"{where}: the tokenizer has empty or multi-line tokens ({bad[:3]})")
    return tokens


def inspect_checkpoint(
    model_dir: str | Path, vocab_size: int | None = None, key: str = KEY
) -> dict[str, Any]:
    """Check that ``model_dir`` can seed continued pretraining; return what was found.

    Args:
        model_dir: A local Hugging Face BERT directory.
        vocab_size: The vocabulary size the params declare (``vocab.vocab_size``), checked against the
            checkpoint; ``None`` skips that check.
        key: The params key that named the directory (for messages).

    Returns:
        ``{"config": BertConfig, "tokenizer": tokenizers.Tokenizer, "tokens": [...], "heads": bool}``;
        ``heads``: the weights hold the MLM head (``cls.predictions.*``).

    Raises:
        CheckpointVocabError: not a BERT checkpoint, a tokenizer that disagrees with the embeddings or
            lacks a special token, or a ``vocab_size`` that contradicts the checkpoint.
        FileNotFoundError: no such directory, or no config.json / weights / tokenizer in it.
    """
    from bert_core.hf import read_config
    from bert_core.released import check_checkpoint

    model_dir = Path(model_dir)
    where = f"{key}: {model_dir}"
    if not model_dir.is_dir():
        raise FileNotFoundError(
            f"{where} is not a directory; point {key} at a Hugging Face BERT directory (config.json, "
            "weights, tokenizer.json or vocab.txt), a Hub id or a models:/ URI"
        )
    try:
        config = read_config(model_dir)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"{key}: {err}") from None
    except ValueError as err:  # model_type other than bert, an unsupported variant, a bad value
        raise CheckpointVocabError(f"{key}: {err}") from None
    sizes = check_checkpoint(model_dir, key=key)  # tokenizer present, config == embedding rows
    tok = _tokenizer(model_dir, where)
    tokens = _tokens_in_id_order(tok, where)
    if len(tokens) != sizes["embeddings"]:
        raise CheckpointVocabError(
            f"{where}: the tokenizer has {len(tokens)} tokens but the word-embedding table has "
            f"{sizes['embeddings']} rows; continued pretraining needs one row per token (the MLM head predicts "
            "every row). Use the tokenizer released with these weights"
        )
    missing = [t for t in SPECIAL_TOKENS if tok.token_to_id(t) is None]
    if missing:
        raise CheckpointVocabError(
            f"{where}: the tokenizer has no {', '.join(missing)} token; BERT pretraining needs "
            f"{', '.join(SPECIAL_TOKENS)}"
        )
    if vocab_size is not None and vocab_size != len(tokens):
        raise CheckpointVocabError(
            f"vocab.vocab_size={vocab_size} contradicts {where}, whose vocabulary has {len(tokens)} tokens; "
            f"set vocab.vocab_size: {len(tokens)} (params/vocab.yaml)"
        )
    return {"config": config, "tokenizer": tok, "tokens": tokens, "heads": _has_mlm_head(model_dir)}


def _has_mlm_head(model_dir: Path) -> bool:
    from bert_core.hf import find_weights, read_state_dict

    weights = find_weights(model_dir)
    if weights.name == "model.safetensors":
        from safetensors import safe_open

        with safe_open(str(weights), framework="pt") as f:
            names = list(f.keys())
    else:
        names = list(read_state_dict(model_dir)[0])
    return any(n.startswith("cls.predictions.") for n in names)


def _copy_weights(model_dir: Path, dest: Path) -> str:
    """``config.json`` and the weights as one ``model.safetensors`` in ``dest``; returns its sha256."""
    from safetensors.torch import save_file

    from bert_core.hf import find_weights, read_state_dict

    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(model_dir / "config.json", dest / "config.json")
    weights = find_weights(model_dir)
    if weights.name == "model.safetensors":
        shutil.copy2(weights, dest / "model.safetensors")
    else:  # pytorch_model.bin or shards: read safely (no code in pickles), stored as one safetensors file
        state, _ = read_state_dict(model_dir)
        save_file(
            {k: v.contiguous() for k, v in state.items()},
            dest / "model.safetensors",
            metadata={"format": "pt"},
        )
    with open(dest / "model.safetensors", "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def copy_checkpoint_vocab(
    params: VocabParams,
    checkpoint_dir: str | Path,
    corpus_dir: str | Path,
    out_dir: str | Path,
    *,
    source: str | None = None,
    report_dir: str | Path | None = None,
) -> VocabStats:
    """Write the checkpoint's vocabulary and weights as the vocab stage's output (see the module docstring).

    Args:
        params: Stage params; ``vocab_size`` must equal the checkpoint's vocabulary, ``eval_max_sentences``
            bounds the held-out segmentation metrics; the training-sample keys are unused.
        checkpoint_dir: The checkpoint, already on local disk (the flow resolves Hub ids and registry URIs).
        corpus_dir: The corpus, for the held-out unknown rate and sub-words per word of this vocabulary.
        out_dir: Output directory (replaced atomically).
        source: What ``vocab.from_checkpoint`` said (recorded; default: ``checkpoint_dir``).
        report_dir: Where to write the data-check report.

    Raises:
        CheckpointVocabError, FileNotFoundError: see :func:`inspect_checkpoint`.
        bert_core.checks.DataCheckError: a critical vocab check failed.
    """
    from bert_core.checks import validate
    from bert_core.vocab.train import read_vocab

    checkpoint_dir, corpus_dir, out_dir = Path(checkpoint_dir), Path(corpus_dir), Path(out_dir)
    t0 = time.perf_counter()
    found = inspect_checkpoint(checkpoint_dir, params.vocab_size)
    tokens, tok, config = found["tokens"], found["tokenizer"], found["config"]
    if params.lowercase != _lowercase(tok):
        case = "uncased (lower-cases its input)" if _lowercase(tok) else "cased"
        raise CheckpointVocabError(
            f"vocab.lowercase={str(params.lowercase).lower()} contradicts {KEY}: {checkpoint_dir}, whose tokenizer "
            f"is {case}; set vocab.lowercase: {str(_lowercase(tok)).lower()} (params/vocab.yaml)"
        )
    with atomic_path(out_dir, is_dir=True) as tmp:
        (tmp / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
        tok.save(str(tmp / "tokenizer.json"))
        for name in _COPIED_CONFIGS:
            if (checkpoint_dir / name).is_file():
                shutil.copy2(checkpoint_dir / name, tmp / name)
        sha = _copy_weights(checkpoint_dir, tmp / CHECKPOINT_SUBDIR)
        record = {
            "source": source or str(checkpoint_dir),
            "weights_sha256": sha,
            "mlm_head": found["heads"],
            "vocab_size": len(tokens),
        }
        (tmp / CHECKPOINT_SUBDIR / SOURCE_FILE).write_text(
            json.dumps(record, indent=2) + "\n", encoding="utf-8"
        )
        written = read_vocab(tmp / "vocab.txt")
        df, checks = checkpoint_vocab_checks(written, len(tokens))
        report = validate(df, "vocab", checks, report_dir=report_dir)
        report.raise_for_critical()
        heldout = _heldout_sentences(corpus_dir, params.eval_max_sentences)
        stats = segmentation_stats(tok, heldout)
        stats["sentences"] = len(heldout)
    seconds = time.perf_counter() - t0
    log.info(
        "vocab: copied %d tokens and the weights (%s MLM head) of %s",
        len(tokens),
        "with its" if found["heads"] else "without an",
        record["source"],
    )
    return VocabStats(
        vocab_size=len(written),
        num_unused=sum(1 for t in written if t.startswith("[unused")),
        lowercase=_lowercase(tok),
        sample_documents=0,
        sample_sentences=0,
        sample_bytes=0,
        sample_fraction=0.0,
        heldout=stats,
        reference=None,
        continuation_pieces=sum(1 for t in written if t.startswith("##")),
        train_seconds=seconds,
        check_report=report,
        checkpoint={
            "source": record["source"],
            "weights_sha256": sha,
            "mlm_head": int(found["heads"]),
            "hidden_size": config.hidden_size,
            "num_hidden_layers": config.num_hidden_layers,
        },
    )


def _lowercase(tok: Any) -> bool:
    normalizer = json.loads(tok.to_str()).get("normalizer") or {}
    return bool(normalizer.get("lowercase", False))


def checkpoint_vocab_checks(tokens: list[str], vocab_size: int):
    """Great Expectations checks of a copied vocabulary: size, no empty or duplicate entry, BERT's specials.

    Unlike :func:`bert_core.vocab.train.vocab_checks` the special tokens' ids are the checkpoint's own
    (they are looked up by name downstream), so their positions are not checked.
    """
    import great_expectations as gx
    import pandas as pd

    from bert_core.checks import Check

    df = pd.DataFrame({"id": range(len(tokens)), "token": tokens})
    E = gx.expectations
    checks = [
        Check(E.ExpectTableRowCountToEqual(value=vocab_size)),
        Check(E.ExpectColumnValuesToNotBeNull(column="token")),
        Check(E.ExpectColumnValueLengthsToBeBetween(column="token", min_value=1)),
        Check(E.ExpectColumnValuesToBeUnique(column="token")),
        Check(E.ExpectColumnDistinctValuesToContainSet(column="token", value_set=list(SPECIAL_TOKENS))),
    ]
    return df, checks


def vocab_reads(params: VocabParams, data_root: Path | None, key: str | None = None) -> Reads:
    """What the vocab stage reads from outside the repository (the ``inputs`` DVC stage records it): the
    checkpoint whose vocabulary it copies (``vocab.from_checkpoint``: a directory, or a Hub model by its
    commit), and the released vocabulary it compares with under the data root (``vocab.reference_local``)."""
    reads: Reads = {}
    if (source := checkpoint(params.from_checkpoint)) is not None:
        reads["from_checkpoint"] = source
    if data_root is not None and params.reference_local is not None:
        reads["reference"] = data_root / params.reference_local
    return reads
