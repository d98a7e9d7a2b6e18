"""Disk full while writing an output: a clear error naming the output, and nothing corrupt left behind.

The full disk is a real one: a tmpfs of a few hundred KB mounted for the test (needs root, as in CI here;
skipped otherwise). Without root, a file-size limit (``RLIMIT_FSIZE``) in a subprocess makes the
writes fail the same way at the OS level, and the same rule is checked: no output appears.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import torch
import yaml

from bert_core.atomic import DiskFullError
from bert_core.training import checkpoint as ckpt

from .conftest import PY, REPO_ROOT, SHARED_DATA, run_cmd, stage_env, temp_leftovers

pytestmark = pytest.mark.faults


@pytest.fixture
def small_disk(tmp_path):
    """``small_disk(kib) -> Path``: a fresh tmpfs of that size, unmounted at teardown."""
    mounted: list[Path] = []

    def make(kib: int) -> Path:
        mnt = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
        mnt.mkdir()
        res = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(mnt)], capture_output=True, text=True
        )
        if res.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here ({res.stderr.strip() or 'not root'})")
        mounted.append(mnt)
        return mnt

    yield make
    for mnt in reversed(mounted):
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_corpus_stage_on_a_full_disk_fails_naming_the_output_and_leaves_nothing(
    tmp_path, small_disk, prefect_api
):
    if SHARED_DATA is None:
        pytest.skip("needs ../shared/data")
    params = yaml.safe_load((REPO_ROOT / "params" / "corpus.yaml").read_text())
    params["corpus"]["cap"]["max_bytes"] = 600_000
    params["corpus"]["workers"] = 1
    (tmp_path / "corpus.yaml").write_text(yaml.safe_dump(params))
    disk = small_disk(96)  # the Parquet shards of 600 KB of text do not fit
    out, metrics = disk / "corpus", tmp_path / "metrics.json"
    res = run_cmd(
        [
            PY,
            "-m",
            "flows.corpus",
            "--params",
            str(tmp_path / "corpus.yaml"),
            "--out",
            str(out),
            "--metrics",
            str(metrics),
        ],
        cwd=tmp_path,
        env=stage_env(prefect_api, f"sqlite:///{tmp_path}/mlflow.db"),
        timeout=300,
    )
    assert res.returncode != 0, res.stdout[-2000:]
    assert "corpus stage failed: DiskFullError" in res.stderr, res.stderr[-3000:]
    assert f"no space left on the device while writing {out}" in res.stderr
    assert "Free space there" in res.stderr
    assert not out.exists() and not temp_leftovers(disk), list(disk.iterdir())
    assert not metrics.exists()


def _tiny_run(ckpt_dir: Path, **kw):
    from training_fakes import run

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run(ckpt_dir, max_steps=6, checkpoint_every=2, keep_last=3, **kw)
    finally:
        torch.set_num_threads(n)


def test_full_disk_during_a_checkpoint_keeps_the_previous_one_and_the_run_resumes_exactly(
    tmp_path, small_disk
):
    reference, _ = _tiny_run(tmp_path / "reference")
    size = sum(f.stat().st_size for f in (tmp_path / "reference" / "step-00000002").iterdir())
    # Room for one checkpoint and a half: the save at step 4 runs out of space in the middle.
    disk = small_disk(int(size * 1.5) // 1024 + 8)
    with pytest.raises(DiskFullError, match=r"no space left on the device while writing .*step-00000004"):
        _tiny_run(disk / "ck")
    assert [p.name for p in ckpt.list_checkpoints(disk / "ck")] == ["step-00000002"]
    assert not temp_leftovers(disk)
    # The previous checkpoint loads, and a run moved to a disk with room resumes from it exactly.
    from training_fakes import tiny_model

    state, _, _ = ckpt.load_checkpoint(disk / "ck" / "step-00000002", model=tiny_model())
    assert state["step"] == 2
    import shutil

    shutil.copytree(disk / "ck", tmp_path / "moved")
    model, result = _tiny_run(tmp_path / "moved")
    assert result.resumed_from_step == 2
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, reference.state_dict()[name]), name


def test_model_directory_on_a_full_disk_keeps_the_previous_model(tmp_path, small_disk):
    from bert_core.config import BertConfig
    from bert_core.model import BertForPreTraining

    def model(vocab: int) -> BertForPreTraining:
        return BertForPreTraining(
            BertConfig(
                vocab_size=vocab,
                hidden_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                intermediate_size=37,
                max_position_embeddings=64,
            )
        )

    disk = small_disk(256)
    small = model(99)
    small.save_pretrained(disk / "model")  # the previous, good model: fits
    before = {p.name: p.read_bytes() for p in (disk / "model").iterdir()}
    with pytest.raises(DiskFullError, match=rf"while writing {disk / 'model'}"):
        model(8000).save_pretrained(disk / "model")  # ~1 MB of weights: does not
    assert {p.name: p.read_bytes() for p in (disk / "model").iterdir()} == before
    reloaded = BertForPreTraining.from_pretrained(disk / "model")  # the previous model still loads
    assert torch.equal(
        reloaded.bert.embeddings.word_embeddings.weight, small.bert.embeddings.word_embeddings.weight
    )
    assert not temp_leftovers(disk)
    with pytest.raises(DiskFullError, match=rf"while writing {disk / 'fresh'}"):
        model(8000).save_pretrained(disk / "fresh")  # a new directory: appears complete or not at all
    assert not (disk / "fresh").exists() and not temp_leftovers(disk)


WRITER = textwrap.dedent(
    """
    import resource, signal, sys
    from pathlib import Path
    import torch
    from bert_core.atomic import atomic_path, write_text_atomic
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)        # the write fails with EFBIG instead of a kill
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
    out = Path(sys.argv[1])
    kind = sys.argv[2]
    if kind == "text":
        write_text_atomic(out / "metrics.json", "x" * 1_000_000)
    elif kind == "torch":
        with atomic_path(out / "ckpt", is_dir=True) as tmp:
            torch.save({"w": torch.zeros(100_000)}, tmp / "optimizer.pt")
    elif kind == "safetensors":
        from safetensors.torch import save_file
        with atomic_path(out / "model.safetensors") as tmp:
            save_file({"w": torch.zeros(100_000)}, str(tmp))
    """
)


@pytest.mark.parametrize("kind", ["text", "torch", "safetensors"])
def test_a_write_cut_short_by_a_file_size_limit_leaves_no_output(tmp_path, kind):
    out = tmp_path / "out"
    out.mkdir()
    res = subprocess.run(
        [sys.executable, "-c", WRITER, str(out), kind],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert res.returncode == 1, res.stderr[-2000:]
    assert "Traceback" in res.stderr  # an error, not a silent truncation
    assert list(out.iterdir()) == [], list(out.iterdir())


def test_batch_prediction_on_a_full_disk_keeps_the_saved_rows_and_continues_once_there_is_room(
    tmp_path, small_disk
):
    import json

    from bert_core.serving.batch import predict_file

    class Meta:
        model_uuid = "0123abcd"

        def get_input_schema(self):
            return None

    class Wordy:
        metadata = Meta()

        def predict(self, frame):
            return [{"label": "positive", "note": "x" * 200} for _ in range(len(frame))]

    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": i, "text": f"row {i}"}) + "\n" for i in range(2000)))
    expected = tmp_path / "expected.jsonl"
    predict_file("wordy", src, expected, model=Wordy(), batch_size=50)  # about 470 KB
    disk = small_disk(96)
    dst = disk / "pred.jsonl"
    with pytest.raises(
        DiskFullError,
        match=r"no space left on the device while writing .*pred\.jsonl .*the [1-9][0-9]* row\(s\) saved "
        r"before are kept in .*\.pred\.jsonl\.partial\. Free space there and run the same command again",
    ):
        predict_file("wordy", src, dst, model=Wordy(), batch_size=50, save_interval_s=0)
    saved = json.loads((disk / ".pred.jsonl.partial.json").read_text())["rows"]
    assert not dst.exists() and saved > 0
    resized = subprocess.run(["mount", "-o", "remount,size=2048k", str(disk)], capture_output=True, text=True)
    assert resized.returncode == 0, resized.stderr
    result = predict_file("wordy", src, dst, model=Wordy(), batch_size=50)
    assert result.resumed_rows == saved
    assert dst.read_bytes() == expected.read_bytes()
    assert sorted(p.name for p in disk.iterdir()) == ["pred.jsonl"]
