"""Faults: a build killed mid-way leaves no finished-looking output and no orphan workers."""

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
from bert_core.pretrain_data.storage import InstanceStore
from bert_core.pretrain_data.testing import make_synthetic_inputs

pytestmark = pytest.mark.faults

_CHILD = textwrap.dedent(
    """
    import sys
    from bert_core.pretrain_data.build import build_pretrain_data
    from bert_core.pretrain_data.params import PretrainDataParams
    if __name__ == "__main__":
        p = PretrainDataParams(dupe_factor=5, num_workers=2, task_bytes=50_000, min_window_docs=16)
        build_pretrain_data(p, corpus_dir=sys.argv[1], vocab_dir=sys.argv[2], output_dir=sys.argv[3],
                            run_checks=False)
    """
)


def test_sigkill_mid_build_leaves_no_output_and_no_workers(tmp_path):
    corpus, vocab = make_synthetic_inputs(tmp_path / "in", n_train=3000, n_heldout=100)
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    out = tmp_path / "pretrain_data"
    proc = subprocess.Popen([sys.executable, str(script), str(corpus), str(vocab), str(out)])
    parent = psutil.Process(proc.pid)
    deadline = time.time() + 120
    workers: list[psutil.Process] = []
    while time.time() < deadline:  # wait until workers are writing shards
        workers = [c for c in parent.children(recursive=True) if "spawn_main" in " ".join(c.cmdline())]
        written = list(tmp_path.glob(".pretrain_data.tmp-*/seq128/train/shard-*.tokens.bin"))
        if len(workers) == 2 and written:
            break
        assert proc.poll() is None, "the build ended before it could be killed; make the corpus larger"
        time.sleep(0.05)
    assert len(workers) == 2
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    _, alive = psutil.wait_procs(workers, timeout=15)
    assert alive == [], "workers outlived the killed build"
    assert not out.exists()  # nothing at the final path
    assert len(clean_stale_temps(tmp_path)) == 1  # only the temporary sibling, removed here
    p = PretrainDataParams(
        dupe_factor=1, num_workers=2, task_bytes=50_000, min_window_docs=16, phases=["seq128"]
    )
    build_pretrain_data(p, corpus_dir=corpus, vocab_dir=vocab, output_dir=out, run_checks=False)
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
