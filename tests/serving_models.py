"""Tiny random models of every served kind, registered in the current MLflow store (serving tests).

The vocabulary holds the special tokens, lowercase letters, digits and punctuation (and their ``##``
continuations), so every text tokenises; the weights are random (seeded): the tests compare a loaded or
served model with the same model in process, not with gold answers.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch

#: served name -> (task, kind) of every kind: the GLUE classification / regression, SQuAD v2.0, SWAG,
#: CoNLL-2003, the pretrained model's fill-mask, and an own task (:data:`OWN`).
SERVED = {
    "bert-sst2": "sst2",
    "bert-tickets": "tickets",
    "bert-stsb": "stsb",
    "bert-squad_v2": "squad_v2",
    "bert-swag": "swag",
    "bert-conll2003": "conll2003",
    "bert-pretrained": "fill_mask",
}

#: Own tasks (bert_core.tasks.own) by name: a three-class sentence-pair classification, as the params
#: would declare it; its served model knows it from its task JSON alone.
OWN = {
    "tickets": {
        "kind": "classification",
        "text": "subject",
        "text_pair": "body",
        "label": "queue",
        "labels": ["billing", "bug", "other"],
        "metric": "macro_f1",
    }
}

#: Requests per task (records), answered in the tests by the loaded and the in-process model alike.
REQUESTS = {
    "tickets": [
        {"text": "refund please", "text_pair": "i was charged twice."},
        {"text": "app crashes on start"},
    ],
    "sst2": [
        {"text": "a gripping, beautifully acted film."},
        {"text": "dull and far too long", "text_pair": "boring."},
    ],
    "stsb": [
        {"text": "A man plays a guitar.", "text_pair": "Someone plays music."},
        {"text": "Cats sleep.", "text_pair": "Dogs bark!"},
    ],
    "squad_v2": [
        {
            "question": "Who won Super Bowl 50?",
            "context": "The Denver Broncos defeated the Carolina Panthers 24-10.",
        },
        {"question": "Where?", "context": " ".join(["Levi's Stadium in Santa Clara, California."] * 8)},
    ],
    "swag": [
        {
            "context": "She opens the door.",
            "start": "She",
            "endings": ["walks in.", "flies away.", "sings.", "sits."],
        }
    ],
    # One request gives either text or words (MLflow's schema check refuses a list column with gaps).
    "conll2003": [{"text": "EU rejects German call to boycott British lamb."}, {"text": "Peter Blackburn"}],
    "conll2003_words": [{"words": ["Peter", "Blackburn"]}, {"words": ["BRUSSELS", "1996-08-22"]}],
    "fill_mask": [{"text": "the capital of france is [MASK]."}, {"text": "[MASK] and [MASK] go."}],
}

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def write_tokenizer(path: Path) -> int:
    """A WordPiece tokenizer of letters, digits and punctuation in ``path`` (as the vocab stage writes
    one: vocab.txt, tokenizer.json, tokenizer_config.json); returns its size."""
    import json

    from tokenizers.implementations import BertWordPieceTokenizer

    chars = list(string.ascii_lowercase + string.digits + string.punctuation)
    vocab = list(dict.fromkeys(SPECIALS + ["the", "and"] + chars + [f"##{c}" for c in chars]))
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    BertWordPieceTokenizer(str(path / "vocab.txt"), lowercase=True).save(str(path / "tokenizer.json"))
    specials = {
        "unk_token": "[UNK]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "cls_token": "[CLS]",
        "mask_token": "[MASK]",
    }
    config = {"tokenizer_class": "BertTokenizer", "do_lower_case": True, "model_max_length": 512, **specials}
    (path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    (path / "special_tokens_map.json").write_text(json.dumps(specials), encoding="utf-8")
    return len(vocab)


def build_model(task: str, path: Path, seed: int = 0) -> Path:
    """A tiny random model for ``task`` (or ``fill_mask``: a pretraining checkpoint) in HF format."""
    from bert_core.config import BertConfig
    from bert_core.kinds import get_kind

    path.mkdir(parents=True, exist_ok=True)
    vocab_size = write_tokenizer(path)
    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
    )
    torch.manual_seed(seed)
    if task == "fill_mask":
        from bert_core.model import BertForPreTraining

        BertForPreTraining(config).save_pretrained(path)
    else:
        spec = spec_of(task)
        kind = get_kind(spec)
        kind.model_class(kind.head_config(spec, config)).save_pretrained(path)
    write_tokenizer(path)  # save_pretrained may rewrite the directory
    return path


def spec_of(task: str):
    """The task's ``TaskSpec``: the paper's, or an own task of :data:`OWN`."""
    from bert_core.tasks import get_task, own_task_spec

    return own_task_spec(task, **OWN[task]) if task in OWN else get_task(task)


def task_json(task: str) -> dict:
    """The task JSON the stages would register (SQuAD v2.0 with a tuned-looking null threshold)."""
    from bert_core.finetune.params import TaskSettings
    from bert_core.serving import fill_mask_task, serving_task

    if task == "fill_mask":
        return fill_mask_task()
    settings = TaskSettings(max_seq_length=64, doc_stride=16, max_query_length=16)
    return serving_task(spec_of(task), settings, null_threshold=0.5 if task == "squad_v2" else None)


def register_all(root: Path, names: dict[str, str] | None = None) -> dict[str, Path]:
    """Build and register every served kind in the current MLflow store (alias ``champion``, as the
    fine-tuning stage does, and ``newest`` for ``bert-pretrained``); returns name -> HF directory."""
    import mlflow

    from bert_core.serving import mlflow_model
    from bert_core.tracking import register

    mlflow.set_experiment("serving-tests")
    dirs = {}
    for name, task in (names or SERVED).items():
        hf_dir = build_model(task, root / name)
        with mlflow.start_run() as run:
            pass
        if task == "fill_mask":
            register(
                hf_dir,
                name=name,
                run_id=run.info.run_id,
                alias="newest",
                save_model=mlflow_model(task_json(task)),
            )
        else:
            register(
                hf_dir,
                name=name,
                run_id=run.info.run_id,
                alias="champion",
                metric_key="dev.score",
                value=1.0,
                save_model=mlflow_model(task_json(task)),
            )
        dirs[name] = hf_dir
    return dirs


def alias(name: str) -> str:
    return "newest" if name == "bert-pretrained" else "champion"
