"""Prefect flow of the ``vocab`` stage: ``python -m flows.vocab``.

Trains the WordPiece vocab on ``data/corpus`` (:func:`bert_core.vocab.train_vocab`), compared with the
released bert-base-uncased ``vocab.txt`` (from the data root, else the Hub; skipped with a warning when
unreachable). With ``vocab.from_checkpoint`` (continued pretraining) it trains nothing: the checkpoint's
tokenizer and weights are copied into ``data/vocab`` for the later stages.
"""

from __future__ import annotations

import logging
import tempfile
from functools import partial
from pathlib import Path

from prefect import flow, task

from bert_core.sources import data_root
from bert_core.vocab import VocabParams, train_vocab
from flows._cli import exit_command, run_stage
from flows._stage import data_check_dir, headline, stage
from flows.stages import get

STAGE = get("vocab")
log = logging.getLogger("bert_core.flows.vocab")


@task(retries=3, retry_delay_seconds=[2, 10, 30])
def _download_reference(repo_id: str) -> str:
    from huggingface_hub import hf_hub_download

    return hf_hub_download(repo_id, "vocab.txt")


def reference_vocab(params: VocabParams) -> Path | None:
    """The released vocab to compare with, or ``None`` (not configured or not reachable)."""
    root = data_root()
    if root is not None:
        if params.reference_local is None:
            return None
        path = root / params.reference_local
        if not path.is_file():
            log.warning("reference vocab %s not found; comparison metrics skipped", path)
            return None
        return path
    if params.reference_hub is None:
        return None
    from bert_core.released import hub_reachable

    reachable, why = hub_reachable()  # offline or no network: skipped in seconds, not after the retries
    try:
        if reachable:
            return Path(_download_reference(params.reference_hub))
    except Exception as err:
        why = str(err)
    log.warning("could not fetch %s/vocab.txt (%s); comparison metrics skipped", params.reference_hub, why)
    return None


@flow(name="vocab", log_prints=True)
def vocab_flow(
    params_file: str = STAGE.default("params_file"),
    corpus_dir: str = STAGE.default("corpus_dir"),
    out_dir: str = STAGE.default("out_dir"),
    metrics_path: str | None = None,
) -> dict:
    """Train the WordPiece vocab (or copy a checkpoint's, ``vocab.from_checkpoint``); return its metrics."""
    from bert_core.tracking.ui import log_corpus_data

    params: VocabParams = STAGE.load_params(params_file)
    checks = data_check_dir("vocab", out_dir, STAGE.outs[0])
    with stage("vocab", params, out_dir, metrics_path=metrics_path, dirs=(out_dir,), checks_dir=checks) as s:
        log_corpus_data(corpus_dir)  # the Dataset column and lineage in the MLflow UI
        if params.from_checkpoint is not None:
            from bert_core.released import resolve_checkpoint
            from bert_core.vocab.checkpoint import copy_checkpoint_vocab

            with tempfile.TemporaryDirectory(prefix="vocab-checkpoint-") as download:
                # Only the path: copy_checkpoint_vocab hashes the weights it copies (weights_sha256).
                resolved = resolve_checkpoint(
                    params.from_checkpoint, download, key="vocab.from_checkpoint", provenance=False
                )
                stats = copy_checkpoint_vocab(
                    params,
                    resolved.path,
                    Path(corpus_dir),
                    s[out_dir],
                    source=params.from_checkpoint,
                    report_dir=checks / "vocab",
                )
        else:
            stats = train_vocab(
                params,
                Path(corpus_dir),
                s[out_dir],
                reference_vocab=reference_vocab(params),
                report_dir=checks / "vocab",
            )
        details = stats.as_metrics()
        s.done(
            headline(details, STAGE.headline),
            details=details,
            reports=[stats.check_report],
            artifacts=[(Path(out_dir), "vocab")],
        )
    return s.details


#: The command line, ``main(argv)``: the stage runner itself (no call of its own between the command and the work).
main = partial(run_stage, "vocab", vocab_flow, doc=__doc__)


if __name__ == "__main__":
    exit_command(main())
