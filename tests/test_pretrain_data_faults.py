"""Faults: a build killed mid-way leaves no finished-looking output and no orphan workers, and its rerun\ncontinues after the finished tasks."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from bert_core.atomic import clean_stale_temps
from bert_core.pretrain_data.build import build_pretrain_data
from bert_core.pretrain_data.params import PretrainDataParams
from bert_core.pretrain_data.partial import partial_dir
from bert_core.pretrain_data.storage import InstanceStore
from bert_core.pretrain_data.testing import make_synthetic_inputs

pytestmark = pytest.mark.faults

_CHILD = textwrap.dedent(
    """
    import logging, sys
    from bert_core.pretrain_data.build import build_pretrain_data
    from bert_core.pretrain_data.params import PretrainDataParams
    if __name__ == "__main__":
        logging.basicConfig(level=logging.INFO)
        p = PretrainDataParams(dupe_factor=5, num_workers=2, task_bytes=50_000, min_window_docs=16)
        build_pretrain_data(p, corpus_dir=sys.argv[1], vocab_dir=sys.argv[2], output_dir=sys.argv[3],
                            run_checks=False)
    """
)


def test_sigkill_mid_build_leaves_no_output_no_workers_and_the_rerun_continues(tmp_path):
    corpus, vocab = make_synthetic_inputs(tmp_path / "in", n_train=3000, n_heldout=100)
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    out = tmp_path / "pretrain_data"
    proc = subprocess.Popen([sys.executable, str(script), str(corpus), str(vocab), str(out)])
    parent = psutil.Process(proc.pid)
    work = partial_dir(out)
    deadline = time.time() + 120
    workers: list[psutil.Process] = []
    while time.time() < deadline:  # wait until two workers run and some tasks are kept
        workers = [c for c in parent.children(recursive=True) if "spawn_main" in " ".join(c.cmdline())]
        kept = list(work.glob("tasks/*.json"))
        if len(workers) == 2 and len(kept) >= 2:
            break
        assert proc.poll() is None, "the build ended before it could be killed; make the corpus larger"
        time.sleep(0.05)
    assert len(workers) == 2
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    _, alive = psutil.wait_procs(workers, timeout=15)
    assert alive == [], "workers outlived the killed build"
    assert not out.exists()  # nothing at the final path
    kept = len(list(work.glob("tasks/*.json")))
    assert kept >= 2 and clean_stale_temps(tmp_path) == []  # the finished tasks, and no other temporary
    rerun = subprocess.run(
        [sys.executable, str(script), str(corpus), str(vocab), str(out)], capture_output=True, text=True
    )
    assert rerun.returncode == 0, rerun.stderr
    assert f"continuing an unfinished build: {kept} of" in rerun.stderr
    assert not work.exists()
    whole = tmp_path / "uninterrupted"
    p = PretrainDataParams(dupe_factor=5, num_workers=2, task_bytes=50_000, min_window_docs=16)
    build_pretrain_data(p, corpus_dir=corpus, vocab_dir=vocab, output_dir=whole, run_checks=False)
    assert [(f.relative_to(out), f.read_bytes()) for f in sorted(out.rglob("*")) if f.is_file()] == [
        (f.relative_to(whole), f.read_bytes()) for f in sorted(whole.rglob("*")) if f.is_file()
    ]
    assert len(InstanceStore(out / "seq128" / "train")) > 0


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_damaged_corpus_shard_is_named_with_the_fix(tmp_path, damage):
    """A truncated shard used to give ``ArrowInvalid: Parquet magic bytes not found`` with no file named."""
    from bert_core.corpus.shards import CorpusShardError
    from bert_core.pretrain_data.worker import read_segment

    corpus, vocab = make_synthetic_inputs(tmp_path / "in", n_train=200, n_heldout=20)
    shard = sorted((corpus / "train").glob("part-*.parquet"))[0]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"not parquet at all" * 10)
    p = PretrainDataParams(dupe_factor=1, num_workers=1, task_bytes=50_000, min_window_docs=16)
    with pytest.raises(CorpusShardError) as err:
        build_pretrain_data(
            p, corpus_dir=corpus, vocab_dir=vocab, output_dir=tmp_path / "out", run_checks=False
        )
    message = str(err.value)
    assert str(shard) in message and "dvc repro -f corpus" in message and len(message) < 600
    assert not (tmp_path / "out").exists()
    with pytest.raises(CorpusShardError, match="cannot be read"):
        list(read_segment(str(shard), 0, 10))
