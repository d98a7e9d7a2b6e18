"""Bad input through the real entry points: ``python -m flows.<stage>`` exits 1 with a message that names the
file, line or key and says what to do, and leaves no output behind.

The library-level cases (each loader's and checker's message) are tested next to their code; this suite
adds the user's view of the same errors through the stage commands, plus the cases no one else covered
(see docs/reliability.md for the map).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from bert_core.owned import OUTPUT_MARK

from .conftest import PY, REPO_ROOT, run_cmd, stage_env

pytestmark = pytest.mark.faults

GOOD_DOC = (
    "The river ran past the old mill and under the stone bridge. Children played on its banks every summer. "
    "In winter the water froze and the village skated on it. The miller kept a boat tied to the jetty. "
)


def set_key(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``a.b.0.c`` in nested dicts/lists, creating missing mapping keys."""
    *parents, last = dotted.split(".")
    node: Any = data
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


def params_file(tmp_path: Path, stage: str, changes: dict[str, Any]) -> Path:
    data = yaml.safe_load((REPO_ROOT / "params" / f"{stage}.yaml").read_text())
    for key, value in changes.items():
        set_key(data, key, value)
    path = tmp_path / f"{stage}-bad.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def stage_args(stage: str, params: Path) -> list[str]:
    """Arguments that keep every output of the stage inside the (empty) working directory."""
    common = ["--params", str(params), "--metrics", "metrics.json"]
    return {
        "corpus": [*common, "--out", "out"],
        "vocab": [*common, "--corpus", "corpus", "--out", "out"],
        "pretrain_data": [*common, "--corpus", "corpus", "--vocab", "vocab", "--out", "out"],
        "pretrain": [
            *common,
            "--data",
            "data",
            "--vocab",
            "vocab",
            "--out",
            "out",
            "--checkpoints",
            "ck",
            "--loss-plot",
            "loss.csv",
            "--heldout-plot",
            "heldout.csv",
        ],
        "finetune": ["sst2", *common, "--out", "out", "--model-out", "model-out"],
    }[stage]


def run_stage(stage: str, args: list[str], work: Path, env: dict[str, str], timeout: float = 600):
    work.mkdir(parents=True, exist_ok=True)
    return run_cmd([PY, "-m", f"flows.{stage}", *args], cwd=work, env=env, timeout=timeout)


def assert_failed_cleanly(res: subprocess.CompletedProcess, stage: str, work: Path, *fragments: str) -> None:
    assert res.returncode == 1, f"exit {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    last = [line for line in res.stderr.splitlines() if f"{stage} stage failed" in line]
    assert last, res.stderr[-3000:]
    for fragment in fragments:
        assert fragment in res.stderr, f"{fragment!r} not in:\n{res.stderr[-3000:]}"
    assert not list(work.iterdir()), f"left behind: {sorted(p.name for p in work.iterdir())}"


@pytest.fixture
def env(tmp_path, prefect_api) -> dict[str, str]:
    return stage_env(prefect_api, f"sqlite:///{tmp_path}/mlflow.db")


# --------------------------------------------------------------------------------------------- params

PARAMS_CASES = {
    "unknown key": (
        "corpus",
        {"corpus.clean.min_doc_charz": 5},
        ["unknown key 'corpus.clean.min_doc_charz' (remove it or check its spelling)"],
    ),
    "wrong type": (
        "vocab",
        {"vocab.vocab_size": "large"},
        ["'vocab.vocab_size' = 'large': Input should be a valid integer"],
    ),
    "negative learning rate": (
        "pretrain",
        {"pretrain.optimizer.lr": -1e-4},
        ["'pretrain.optimizer.lr' = -0.0001: Input should be greater than 0"],
    ),
    "negative learning rate in a grid": (
        "finetune",
        {"finetune.defaults.learning_rates": [-2e-5]},
        ["'finetune.defaults.learning_rates'", "learning rates must be > 0"],
    ),
    "masked_lm_prob above 1": (
        "pretrain_data",
        {"pretrain_data.masked_lm_prob": 1.5},
        ["'pretrain_data.masked_lm_prob' = 1.5: Input should be less than or equal to 1"],
    ),
    "mask split that does not add up to 1": (
        "pretrain_data",
        {"pretrain_data.mask_split": {"mask": 0.8, "random": 0.2, "keep": 0.1}},
        ["'pretrain_data.mask_split' = a mapping: mask + random + keep must add up to 1"],
    ),
    "nsp that is not a boolean": (
        "pretrain",
        {"pretrain.nsp": "off-ish"},
        ["'pretrain.nsp' = 'off-ish': Input should be a valid boolean"],
    ),
    "position table declared twice (pretrain)": (
        "pretrain",
        {"pretrain.model.overrides": {"max_position_embeddings": 1024}},
        ["max_position_embeddings is read from the pretraining data"],
    ),
    "sequence longer than the position table (pretrain_data)": (
        "pretrain_data",
        {"pretrain_data.phase_specs.seq128.max_seq_length": 1024},
        ["phase_specs.seq128.max_seq_length = 1024 exceeds max_position_embeddings = 512"],
    ),
    "sequence longer than BERT's 512 positions (finetune)": (
        "finetune",
        {"finetune.defaults.max_seq_length": 1024},
        ["'finetune.defaults.max_seq_length' = 1024: Input should be less than or equal to 512"],
    ),
    "Adam beta of 1 or more": (
        "pretrain",
        {"pretrain.optimizer.betas": [1.5, 0.999]},
        ["'pretrain.optimizer.betas.0' = 1.5: Input should be less than 1"],
    ),
    "alias MLflow reserves (v<N>)": (
        "finetune",
        {"finetune.registry.alias": "v1"},
        ["'finetune.registry.alias' = 'v1': MLflow refuses it", "is reserved"],
    ),
    "registered model name with '/'": (
        "finetune",
        {"finetune.registry.name_prefix": "team/bert-"},
        ["'finetune.registry.name_prefix' = 'team/bert-': MLflow refuses it", "cannot contain '/'"],
    ),
    "pretrain alias 'latest'": (
        "pretrain",
        {"pretrain.registry_alias": "latest"},
        ["'pretrain.registry_alias' = 'latest': MLflow refuses it"],
    ),
}
if not torch.cuda.is_available():  # refused when the stage starts, on this machine only
    PARAMS_CASES["device: cuda without a GPU (pretrain)"] = (
        "pretrain",
        {"pretrain.device": "cuda"},
        ["'pretrain.device' = 'cuda': this machine has no CUDA device"],
    )
    PARAMS_CASES["device: cuda without a GPU (finetune)"] = (
        "finetune",
        {"finetune.device": "cuda"},
        ["'finetune.device' = 'cuda': this machine has no CUDA device"],
    )


@pytest.mark.parametrize("case", list(PARAMS_CASES))
def test_bad_params_value(case, tmp_path, env):
    stage, changes, fragments = PARAMS_CASES[case]
    params = params_file(tmp_path, stage, changes)
    res = run_stage(stage, stage_args(stage, params), tmp_path / "work", env)
    assert_failed_cleanly(res, stage, tmp_path / "work", f"ParamsError: {params}", *fragments)


def test_params_file_that_is_not_utf8_or_not_yaml(tmp_path, env):
    bad = tmp_path / "corpus.yaml"
    bad.write_bytes(b"corpus:\n  seed: 12345\n  # caf\xe9 au lait\n")
    res = run_stage("corpus", stage_args("corpus", bad), tmp_path / "work", env)
    assert_failed_cleanly(
        res, "corpus", tmp_path / "work", f"{bad}:3: not UTF-8", "save the params file as UTF-8"
    )

    bad.write_text("corpus:\n  seed: 1\n   cap: [1,\n")
    res = run_stage("corpus", stage_args("corpus", bad), tmp_path / "work", env)
    assert_failed_cleanly(res, "corpus", tmp_path / "work", f"{bad}:3:7: not valid YAML: mapping values")


def test_params_file_with_a_repeated_key_or_an_empty_section(tmp_path, env):
    """DVC refuses a repeated key; the stage must too (it used to keep the last value silently), and a bare
    section header is not "all defaults"."""
    bad = tmp_path / "corpus.yaml"
    text = (REPO_ROOT / "params" / "corpus.yaml").read_text()
    header = text.splitlines().index("corpus:") + 1  # the section header's line
    bad.write_text(text.replace("corpus:\n", "corpus:\n  seed: 1\n  seed: 2\n", 1))
    res = run_stage("corpus", stage_args("corpus", bad), tmp_path / "work", env)
    where = f"{bad}:{header + 2}: duplicate key 'seed' (first at line {header + 1})"
    assert_failed_cleanly(res, "corpus", tmp_path / "work", where)

    bad.write_text("corpus:\n")
    res = run_stage("corpus", stage_args("corpus", bad), tmp_path / "work", env)
    assert_failed_cleanly(res, "corpus", tmp_path / "work", f"{bad}:1: section 'corpus' is empty")


def test_finetune_before_pretraining_names_the_pretrain_stage_not_the_hub(tmp_path, env):
    """``models/pretrained`` has the shape of a Hub id; missing, it is the pretrain stage's output not built."""
    params = params_file(tmp_path, "finetune", {"finetune.model.source": "models/pretrained"})
    res = run_stage("finetune", stage_args("finetune", params), tmp_path / "work", env)
    assert_failed_cleanly(
        res,
        "finetune",
        tmp_path / "work",
        "CheckpointSourceError: finetune.model.source='models/pretrained': models/pretrained does not exist: "
        "the pretrain stage has not run; run `dvc repro pretrain` (or `make pipeline`)",
    )
    assert "hf download" not in res.stderr and "Hub cannot be reached" not in res.stderr


# --------------------------------------------------------------------------------------------- corpus


def corpus_case(tmp_path: Path, files: dict[str, bytes], **clean: Any) -> tuple[Path, dict[str, str], Path]:
    """A data root with ``corpus/case/<files>`` and a params file reading them as one document per file."""
    root = tmp_path / "root"
    (root / "corpus" / "case").mkdir(parents=True)
    for name, data in files.items():
        (root / "corpus" / "case" / name).write_bytes(data)
    params = params_file(
        tmp_path,
        "corpus",
        {
            "corpus.local_sources": [
                {"name": "case", "kind": "text", "path": "corpus/case/*.txt", "doc_split": "file"}
            ],
            "corpus.cap": {"max_documents": None, "max_bytes": None},
            "corpus.workers": 1,
            **{f"corpus.clean.{k}": v for k, v in clean.items()},
        },
    )
    return params, {"BERT_DATA_ROOT": str(root)}, root


def _good_docs(n: int) -> dict[str, bytes]:
    return {f"good{i}.txt": (f"Story number {i}. " + GOOD_DOC * 3).encode() for i in range(n)}


def test_empty_corpus(tmp_path, env):
    params, extra, _ = corpus_case(tmp_path, {"empty.txt": b""})
    res = run_stage("corpus", stage_args("corpus", params), tmp_path / "work", {**env, **extra})
    assert_failed_cleanly(
        res,
        "corpus",
        tmp_path / "work",
        "EmptyCorpusError: no documents left after reading 1 records and filtering (dropped: {'empty': 1})",
        "Check the sources and the corpus.clean limits",
    )


def test_corpus_of_one_document(tmp_path, env):
    params, extra, _ = corpus_case(tmp_path, _good_docs(1))
    res = run_stage("corpus", stage_args("corpus", params), tmp_path / "work", {**env, **extra})
    assert_failed_cleanly(res, "corpus", tmp_path / "work", "EmptyCorpusError", "needs at least 2 documents")


def test_a_corpus_file_compressed_otherwise_than_its_name_says(tmp_path, env):
    import gzip

    files = {**_good_docs(4), "packed.txt": gzip.compress(GOOD_DOC.encode() * 3)}
    params, extra, _ = corpus_case(tmp_path, files)
    res = run_stage("corpus", stage_args("corpus", params), tmp_path / "work", {**env, **extra})
    assert_failed_cleanly(
        res,
        "corpus",
        tmp_path / "work",
        "packed.txt: its bytes are gzip-compressed (its name says it is not compressed); name it for what it "
        "is (here: packed.txt.gz) so that it is decompressed",
    )


def test_non_utf8_bytes_are_replaced_and_counted(tmp_path, env):
    files = {**_good_docs(4), "latin1.txt": ("Caf\xe9 cr\xe8me. " + GOOD_DOC * 3).encode("latin-1")}
    params, extra, _ = corpus_case(tmp_path, files)
    work = tmp_path / "work"
    res = run_stage("corpus", stage_args("corpus", params), work, {**env, **extra})
    assert res.returncode == 0, res.stderr[-3000:]
    metrics = json.loads((work / "details" / "metrics.json").read_text())  # every statistic
    assert metrics["utf8_replacements"] == 2 and metrics["files_with_utf8_errors"] == 1, metrics
    assert metrics["documents"] == 5


def test_a_50_mb_single_line(tmp_path, env):
    """Default cleaning drops it as too long (counted); the stage neither hangs nor runs out of memory."""
    line = (b"alpha beta gamma delta epsilon zeta eta theta iota kappa " * 900_000)[:50_000_000]
    params, extra, _ = corpus_case(tmp_path, {**_good_docs(4), "oneline.txt": line + b"\n"})
    work = tmp_path / "work"
    res = run_stage("corpus", stage_args("corpus", params), work, {**env, **extra}, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    metrics = json.loads((work / "details" / "metrics.json").read_text())  # every statistic
    assert metrics["documents_dropped"] == {"too_long": 1} and metrics["documents"] == 4, metrics


@pytest.mark.timeout(120)
def test_a_50_mb_single_sentence_is_cut_in_linear_time():
    """Kept (max_doc_chars raised), the line is cut into max_sentence_chars pieces: it took >10 min before."""
    from bert_core.corpus.segment import split_long

    line = ("alpha beta gamma delta " * 2_200_000)[:50_000_000]
    pieces = split_long(line, 2000)
    assert max(map(len, pieces)) <= 2000 and len(pieces) >= 24_000
    assert "".join(p.replace(" ", "") for p in pieces) == line.replace(" ", "")
    hard = split_long("x" * 50_000_000, 2000)  # no whitespace at all: hard cuts
    assert len(hard) == 25_000 and set(map(len, hard)) == {2000}


# ------------------------------------------------------------------------------ vocab, model, task data


@pytest.fixture(scope="module")
def built(tiny_pipeline):
    """corpus, vocab, pretraining data and a pretrained model of the tiny reference pipeline."""
    tiny_pipeline.build(until="pretrain")
    return tiny_pipeline.root


def test_vocab_without_mask(tmp_path, env, built):
    vocab = tmp_path / "vocab"
    shutil.copytree(built / "data" / "vocab", vocab)
    (
        vocab / OUTPUT_MARK
    ).unlink()  # edited by hand below: no recorded checksums, the vocab's own check speaks
    lines = (vocab / "vocab.txt").read_text(encoding="utf-8").splitlines()
    (vocab / "vocab.txt").write_text("\n".join(t for t in lines if t != "[MASK]") + "\n", encoding="utf-8")
    params = params_file(tmp_path, "pretrain_data", {"pretrain_data.phases": ["seq128"]})
    args = [
        "--params",
        str(params),
        "--corpus",
        str(built / "data" / "corpus"),
        "--vocab",
        str(vocab),
        "--out",
        "out",
        "--metrics",
        "metrics.json",
    ]
    res = run_stage("pretrain_data", args, tmp_path / "work", env)
    assert_failed_cleanly(
        res, "pretrain_data", tmp_path / "work", f"{vocab / 'vocab.txt'}: the vocabulary has no [MASK] entry"
    )


def test_vocab_whose_size_disagrees_with_the_data_and_model(tmp_path, env, built):
    vocab = tmp_path / "vocab"
    vocab.mkdir()
    lines = (built / "data" / "vocab" / "vocab.txt").read_text(encoding="utf-8").splitlines()
    (vocab / "vocab.txt").write_text(
        "\n".join([*lines, *(f"extra{i}" for i in range(7))]) + "\n", encoding="utf-8"
    )
    params = tmp_path / "pretrain.yaml"
    shutil.copy(built / "params" / "pretrain.yaml", params)
    args = [
        "--params",
        str(params),
        "--data",
        str(built / "data" / "pretrain_data"),
        "--vocab",
        str(vocab),
        "--out",
        "out",
        "--checkpoints",
        "ck",
        "--loss-plot",
        "loss.csv",
        "--heldout-plot",
        "h.csv",
        "--metrics",
        "metrics.json",
    ]
    res = run_stage("pretrain", args, tmp_path / "work", env)
    assert_failed_cleanly(
        res,
        "pretrain",
        tmp_path / "work",
        f"uses a vocabulary of {len(lines)} tokens",
        f"the model config has vocab_size={len(lines) + 7}",
    )


def test_pretraining_shard_damaged_in_place(tmp_path, env, built):
    """Bytes of a shard changed in place (same size): refused by name before any training step."""
    import time

    data = tmp_path / "pretrain_data"
    shutil.copytree(built / "data" / "pretrain_data", data)
    shard = sorted(data.glob("*/train/shard-*.tokens.bin"))[0]
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2 : len(raw) // 2 + 4] = b"\xff\xff\xff\xff"
    shard.write_bytes(bytes(raw))
    args = [
        "--params",
        str(built / "params" / "pretrain.yaml"),
        "--data",
        str(data),
        "--vocab",
        str(built / "data" / "vocab"),
        "--out",
        "out",
        "--checkpoints",
        "ck",
        "--loss-plot",
        "loss.csv",
        "--heldout-plot",
        "h.csv",
        "--metrics",
        "metrics.json",
    ]
    start = time.monotonic()
    res = run_stage("pretrain", args, tmp_path / "work", env)
    assert_failed_cleanly(res, "pretrain", tmp_path / "work", f"{shard} is damaged", "dvc repro")
    assert time.monotonic() - start < 120  # the stage's start-up, not a training run


def finetune_params(tmp_path: Path, **extra: Any) -> Path:
    return params_file(
        tmp_path,
        "finetune",
        {
            "finetune.defaults": {
                "epochs": 1,
                "learning_rates": [1e-4],
                "train_limit": 64,
                "eval_limit": 64,
                "predict_test": False,
                "batch_size": 16,
            },
            "finetune.tasks": {"sst2": {}},
            "finetune.small_task_seeds": [1],
            "finetune.registry.enabled": False,
            "finetune.device": "cpu",
            "finetune.data_checks": False,
            **extra,
        },
    )


def run_finetune(tmp_path: Path, env: dict[str, str], model: Path, params: Path | None = None):
    args = [
        "sst2",
        "--params",
        str(params or finetune_params(tmp_path)),
        "--model-source",
        str(model),
        "--out",
        "out",
        "--model-out",
        "model-out",
        "--metrics",
        "metrics.json",
    ]
    return run_stage("finetune", args, tmp_path / "work", env)


def test_tokenizer_larger_than_the_model_vocab(tmp_path, env, built):
    model = tmp_path / "model"
    shutil.copytree(built / "models" / "pretrained", model)
    (model / OUTPUT_MARK).unlink()  # edited by hand below: a user's own checkpoint, no recorded checksums
    (model / "tokenizer.json").unlink(missing_ok=True)
    lines = (model / "vocab.txt").read_text(encoding="utf-8").splitlines()
    (model / "vocab.txt").write_text("\n".join([*lines, "zzextra1", "zzextra2"]) + "\n", encoding="utf-8")
    res = run_finetune(tmp_path, env, model)
    assert_failed_cleanly(
        res,
        "finetune",
        tmp_path / "work",
        f"the tokenizer has {len(lines) + 2} tokens but the model's embedding table has {len(lines)} rows",
    )


def test_pickled_checkpoint_carrying_code_is_refused_not_run(tmp_path, env, built):
    marker = tmp_path / "code-was-executed"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    model = tmp_path / "model"
    shutil.copytree(built / "models" / "pretrained", model)
    (model / OUTPUT_MARK).unlink()  # a user's own checkpoint, no recorded checksums
    (model / "model.safetensors").unlink()
    torch.save(
        {"bert.embeddings.word_embeddings.weight": torch.zeros(2, 2), "x": Payload()},
        model / "pytorch_model.bin",
    )
    res = run_finetune(tmp_path, env, model)
    assert_failed_cleanly(res, "finetune", tmp_path / "work", "UnsafeCheckpointError", "refusing to load")
    assert not marker.exists()


def test_glue_tsv_with_an_unknown_label(tmp_path, env, built):
    root = tmp_path / "root" / "glue" / "SST-2"
    root.mkdir(parents=True)
    rows = "".join(f"a fine sentence number {i}\t{i % 2}\n" for i in range(20))
    (root / "train.tsv").write_text("sentence\tlabel\n" + rows + "a broken row\tpositive\n")
    (root / "dev.tsv").write_text("sentence\tlabel\n" + rows)
    res = run_finetune(
        tmp_path, {**env, "BERT_DATA_ROOT": str(tmp_path / "root")}, built / "models" / "pretrained"
    )
    assert_failed_cleanly(
        res, "finetune", tmp_path / "work", f"{root / 'train.tsv'}:22: unknown sst2 label 'positive'"
    )


def test_sequence_length_above_the_models_position_table_is_refused_before_training(tmp_path, env, built):
    from bert_core.config import BertConfig
    from bert_core.model import BertForPreTraining

    model = tmp_path / "model"
    vocab = (built / "data" / "vocab" / "vocab.txt").read_text(encoding="utf-8").splitlines()
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=64,
    )
    BertForPreTraining(config).save_pretrained(model)
    shutil.copy(built / "data" / "vocab" / "vocab.txt", model / "vocab.txt")
    res = run_finetune(tmp_path, env, model)  # SST-2's default max_seq_length is 128
    assert_failed_cleanly(res, "finetune", tmp_path / "work", "max_seq_length", "max_position_embeddings")


def test_task_files_that_are_not_utf8(tmp_path):
    """Every official format: the file and line of the first bad byte, not a bare UnicodeDecodeError."""
    from bert_core.tasks import TaskDataError, load_task_split

    files = {
        ("sst2", "dev"): ("glue/SST-2/dev.tsv", b"sentence\tlabel\nfine\t1\nbad \xff bytes\t0\n", 3),
        ("squad", "dev"): ("squad/dev-v1.1.json", b'{"version": "1.1",\n"data": [\xff]}', 2),
        ("conll2003", "dev"): (
            "conll2003/eng.testa",
            b"-DOCSTART- -X- O O\n\nEU NNP I-NP I-ORG\nre\xe9 VBZ I-VP O\n",
            4,
        ),
    }
    for (task, split), (rel, data, line) in files.items():
        path = tmp_path / task / rel
        path.parent.mkdir(parents=True)
        path.write_bytes(data)
        with pytest.raises(TaskDataError, match=rf"{path}:{line}: not UTF-8 .*re-encode the file"):
            load_task_split(task, split, data_root=tmp_path / task)
    # SWAG: a field over the csv module's 128 KB limit is named too.
    swag = tmp_path / "swag" / "swag" / "val.csv"
    swag.parent.mkdir(parents=True)
    header = ",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label"
    swag.write_text(header + '\n0,v,1,s,"' + "word " * 40_000 + '",b,gold,e0,e1,e2,e3,1\n')
    with pytest.raises(
        TaskDataError, match=rf"{swag}: not a valid swag CSV file \(field larger than field limit"
    ):
        load_task_split("swag", "dev", data_root=tmp_path / "swag")
