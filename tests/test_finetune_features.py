"""Fine-tuning features and batching: pair encoding, SQuAD windows, SWAG choices, NER alignment, padding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bert_core.constants import IGNORE_INDEX
from bert_core.finetune.collate import LengthGroupedBatchSampler, make_loader, pad_collate, width_multiple
from bert_core.kinds import FeatureError
from bert_core.kinds.multiple_choice import encode_multiple_choice
from bert_core.kinds.sequence import encode_sequence_pairs
from bert_core.kinds.span_qa import encode_squad
from bert_core.kinds.token_classification import encode_token_classification


@pytest.fixture(scope="module")
def tokenizer(shared_data):
    from transformers import BertTokenizerFast

    # transformers 5 ignores ``vocab_file=``; ``vocab=`` loads the file.
    return BertTokenizerFast(vocab=str(shared_data / "checkpoints/bert-base-uncased/vocab.txt"))


def test_pairs_layout_truncation_and_labels(tokenizer):
    examples = [
        {"id": "0", "text_a": "The cat sat.", "text_b": "A cat was sitting.", "label": 1},
        {"id": "1", "text_a": "word " * 50, "text_b": "other " * 50, "label": "entailment"},
        {"id": "2", "text_a": "Unlabelled.", "text_b": "Test row.", "label": None},
    ]
    feats = encode_sequence_pairs(
        examples, tokenizer, max_seq_length=16, label2id={"entailment": 0, "not_entailment": 1}
    )
    tokens = tokenizer.convert_ids_to_tokens(feats[0]["input_ids"])
    assert tokens == ["[CLS]", "the", "cat", "sat", ".", "[SEP]", "a", "cat", "was", "sitting", ".", "[SEP]"]
    assert feats[0]["token_type_ids"] == [0] * 6 + [1] * 6
    assert feats[0]["labels"] == 1
    assert len(feats[1]["input_ids"]) == 16  # longest-first truncation keeps both segments
    assert feats[1]["token_type_ids"].count(1) == 8 and feats[1]["labels"] == 0
    assert "labels" not in feats[2]
    single = encode_sequence_pairs(
        [{"id": "0", "text_a": "Hello world", "text_b": None, "label": 0.25}],
        tokenizer,
        max_seq_length=8,
        label2id=None,
    )
    assert single[0]["token_type_ids"] == [0, 0, 0, 0] and single[0]["labels"] == 0.25
    with pytest.raises(FeatureError, match="not one of"):
        encode_sequence_pairs(
            [{"id": "x", "text_a": "a", "text_b": None, "label": "maybe"}],
            tokenizer,
            max_seq_length=8,
            label2id={"yes": 0, "no": 1},
        )


def _squad_example(context: str, answer: str, *, impossible: bool = False) -> dict:
    start = context.index(answer)
    return {
        "id": "q1",
        "title": "t",
        "context": context,
        "question": "  Where is the treasure hidden in this story?",
        "answers": {"text": [] if impossible else [answer], "answer_start": [] if impossible else [start]},
        "is_impossible": impossible,
    }


def test_squad_sliding_windows(tokenizer):
    words = [f"w{i}" for i in range(60)]
    context = " ".join(words[:41]) + " the treasure is under the old oak tree " + " ".join(words[41:])
    ex = _squad_example(context, "under the old oak tree")
    feats = encode_squad([ex], tokenizer, max_seq_length=40, doc_stride=10, max_query_length=5)
    assert len(feats) > 3
    q_tokens = tokenizer(ex["question"].strip(), add_special_tokens=False)["input_ids"][:5]
    n_context = len(tokenizer(context, add_special_tokens=False)["input_ids"])
    seen_max = [0] * n_context
    found = 0
    for f in feats:
        ids = f["input_ids"]
        assert len(ids) <= 40 and ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
        assert ids[1:6] == q_tokens and ids[6] == tokenizer.sep_token_id  # question cut to 5 tokens
        assert f["token_type_ids"] == [0] * 7 + [1] * (len(ids) - 7)
        assert f["offsets"][:7] == [None] * 7 and f["offsets"][-1] is None
        for pos, off in enumerate(f["offsets"]):
            if off is not None and f["max_context"][pos]:
                # map the offset back to the context token index by its character start
                starts = [
                    o[0]
                    for o in tokenizer(context, add_special_tokens=False, return_offsets_mapping=True)[
                        "offset_mapping"
                    ]
                ]
                seen_max[starts.index(off[0])] += 1
        if f["start_positions"]:
            found += 1
            s, e = f["start_positions"], f["end_positions"]
            assert context[f["offsets"][s][0] : f["offsets"][e][1]] == "under the old oak tree"
        else:
            assert f["end_positions"] == 0
    assert found >= 1
    assert seen_max == [1] * n_context  # every context token has exactly one max-context window
    # consecutive windows start doc_stride tokens apart
    firsts = [next(o for o in f["offsets"] if o is not None)[0] for f in feats]
    assert firsts == sorted(firsts) and len(set(firsts)) == len(firsts)

    lean = encode_squad(
        [ex], tokenizer, max_seq_length=40, doc_stride=10, max_query_length=5, with_offsets=False
    )
    assert [f["input_ids"] for f in lean] == [f["input_ids"] for f in feats]
    assert [f["start_positions"] for f in lean] == [f["start_positions"] for f in feats]
    assert "offsets" not in lean[0] and "max_context" not in lean[0]
    impossible = encode_squad(
        [_squad_example(context, "oak", impossible=True)],
        tokenizer,
        max_seq_length=40,
        doc_stride=10,
        max_query_length=5,
    )
    assert all(f["start_positions"] == 0 and f["end_positions"] == 0 for f in impossible)
    with pytest.raises(FeatureError, match="raise max_seq_length"):
        encode_squad([ex], tokenizer, max_seq_length=8, doc_stride=4, max_query_length=5)


def test_a_context_longer_than_the_model_is_windowed_without_transformers_indexing_warning(
    shared_data, capfd
):
    """The whole context is tokenised once, then cut into windows: transformers' warning that a sequence over
    ``model_max_length`` "will result in indexing errors" would be wrong, and alarm every SQuAD run."""
    context = " ".join(["the oak tree grew tall near the river bank"] * 80)  # ~720 tokens > 512
    from transformers import BertTokenizerFast

    vocab = str(shared_data / "checkpoints/bert-base-uncased/vocab.txt")
    tokenizer = BertTokenizerFast(vocab=vocab, model_max_length=512)  # as bert-base-uncased's files give it
    capfd.readouterr()
    feats = encode_squad([_squad_example(context, "oak")], tokenizer, max_seq_length=128, doc_stride=64)
    assert len(feats) > 1
    assert "indexing errors" not in capfd.readouterr().err


def test_multiple_choice_pairs(tokenizer):
    ex = {
        "id": "s1",
        "context": "Someone opens the door.",
        "start": "Then he",
        "endings": ["walks in.", "flies away.", "eats the door.", "sings loudly."],
        "label": 2,
    }
    feats = encode_multiple_choice([ex, {**ex, "id": "s2", "label": None}], tokenizer, max_seq_length=32)
    assert len(feats[0]["input_ids"]) == 4 and feats[0]["labels"] == 2 and "labels" not in feats[1]
    row = tokenizer.convert_ids_to_tokens(feats[0]["input_ids"][2])
    assert row == [
        "[CLS]",
        "someone",
        "opens",
        "the",
        "door",
        ".",
        "[SEP]",
        "then",
        "he",
        "eats",
        "the",
        "door",
        ".",
        "[SEP]",
    ]
    batch = pad_collate(feats)
    assert batch["input_ids"].shape == (2, 4, 14) and batch["attention_mask"].shape == (2, 4, 14)
    assert "labels" not in batch  # one unlabelled feature: no labels for the batch


def test_ner_first_subtoken_alignment(tokenizer):
    ex = {
        "id": "n1",
        "tokens": ["Johanson", "visited", "Washingtonians", "."],
        "tags": ["B-PER", "O", "B-MISC", "O"],
    }
    label2id = {t: i for i, t in enumerate(("O", "B-PER", "I-PER", "B-MISC", "I-MISC"))}
    (feat,) = encode_token_classification([ex], tokenizer, max_seq_length=32, label2id=label2id)
    tokens = tokenizer.convert_ids_to_tokens(feat["input_ids"])
    assert len(tokens) > 6  # the names split into several sub-tokens
    firsts = {}
    for pos, w in enumerate(feat["word_ids"]):
        if w is not None and w not in firsts:
            firsts[w] = pos
    for pos, label in enumerate(feat["labels"]):
        w = feat["word_ids"][pos]
        if w is not None and firsts[w] == pos:
            assert label == label2id[ex["tags"][w]]
        else:
            assert label == IGNORE_INDEX
    assert [feat["labels"][firsts[w]] for w in range(4)] == [1, 0, 3, 0]
    (cut,) = encode_token_classification([ex], tokenizer, max_seq_length=4, label2id=label2id)
    assert len(cut["input_ids"]) == 4 and cut["word_ids"][-1] is None
    with pytest.raises(FeatureError, match="tags"):
        encode_token_classification([{**ex, "tags": ["O"]}], tokenizer, max_seq_length=16, label2id=label2id)


def test_pad_collate_dynamic_padding():
    feats = [
        {"input_ids": [101, 5, 102], "token_type_ids": [0, 0, 0], "labels": [-100, 3, -100]},
        {
            "input_ids": [101, 5, 6, 7, 102],
            "token_type_ids": [0, 0, 0, 1, 1],
            "labels": [-100, 1, 2, 0, -100],
        },
    ]
    batch = pad_collate(feats, feature_indices=[7, 9])
    assert batch["input_ids"].tolist() == [[101, 5, 102, 0, 0], [101, 5, 6, 7, 102]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert batch["labels"][0].tolist() == [-100, 3, -100, -100, -100]
    assert batch["feature_index"].tolist() == [7, 9]
    assert pad_collate(feats, pad_to_multiple_of=8)["input_ids"].shape == (2, 8)
    reg = pad_collate([{"input_ids": [1], "token_type_ids": [0], "labels": 2.5}])
    assert reg["labels"].dtype == torch.float32
    qa = pad_collate(
        [{"input_ids": [1, 2], "token_type_ids": [0, 1], "start_positions": 1, "end_positions": 1}]
    )
    assert qa["start_positions"].tolist() == [1] and "labels" not in qa


def test_a_gpu_rounds_batch_widths_up_to_a_multiple_of_8_and_a_cpu_pads_to_the_exact_width():
    assert width_multiple("cuda") == width_multiple(torch.device("cuda", 1)) == 8
    assert width_multiple("cpu") is None and width_multiple(torch.device("cpu")) is None


def test_length_grouped_batches():
    lengths = [(i * 37) % 101 + 1 for i in range(1000)]
    sampler = LengthGroupedBatchSampler(lengths, 16, shuffle=True, seed=3, mega_batch_mult=10)
    batches = list(sampler)
    assert sorted(i for b in batches for i in b) == list(range(1000)) and len(batches) == len(sampler)
    assert batches == list(LengthGroupedBatchSampler(lengths, 16, shuffle=True, seed=3, mega_batch_mult=10))
    sampler.set_epoch(1)
    assert list(sampler) != batches
    # grouping cuts padding: padded tokens per batch are far below a random batching's
    padded = sum(len(b) * max(lengths[i] for i in b) for b in batches)
    assert padded < 1.25 * sum(lengths)
    ordered = list(LengthGroupedBatchSampler(lengths, 16, shuffle=False))
    flat = [lengths[i] for b in ordered for i in b]
    assert flat == sorted(lengths, reverse=True)


def test_make_loader_returns_every_feature_once():
    feats = [
        {"input_ids": [101] + [5] * n + [102], "token_type_ids": [0] * (n + 2), "labels": n % 2}
        for n in range(37)
    ]
    for grouped in (True, False):
        loader = make_loader(feats, 8, shuffle=True, seed=0, group_by_length=grouped)
        seen = []
        for batch in loader:
            seen += batch["feature_index"].tolist()
            assert batch["input_ids"].shape[1] == int(batch["attention_mask"].sum(1).max())
        assert sorted(seen) == list(range(37))


def _features(lengths: list[int], seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    return [
        {
            "input_ids": torch.randint(5, 90, (n,), generator=g).tolist(),
            "attention_mask": [1] * n,
            "token_type_ids": [0] * (n // 2) + [1] * (n - n // 2),
        }
        for n in lengths
    ]


@pytest.mark.parametrize("head", ["sequence", "token"])
def test_predict_gives_each_feature_its_own_output_in_order_padding_cut_off(head, caplog, monkeypatch):
    """Batches of mixed lengths, longest first, the last one short: each output is what the model gives the
    feature alone, in the features' order, per-token outputs cut to the feature's length."""
    from test_compile import tiny_config

    from bert_core.finetune.inference import predict
    from bert_core.model import BertForSequenceClassification, BertForTokenClassification

    torch.manual_seed(0)
    model_class = BertForSequenceClassification if head == "sequence" else BertForTokenClassification
    model = model_class(tiny_config(num_labels=3)).train()
    features = _features([5, 17, 9, 30, 2, 11, 23])
    monkeypatch.setenv("BERT_PROGRESS_INTERVAL_S", "0")  # a progress line per batch
    monkeypatch.setenv("BERT_PROGRESS_MIN_PERCENT", "0")
    with caplog.at_level("INFO", logger="bert_core.finetune.inference"):
        outputs = predict(model, features, batch_size=3, label="unit eval")
    assert model.training  # put back as it was
    model.eval()
    for feature, out in zip(features, outputs, strict=True):
        with torch.no_grad():
            alone = model(**{k: torch.tensor([v]) for k, v in feature.items()}).logits[0].numpy()
        assert out.dtype == np.float32 and out.shape == alone.shape
        np.testing.assert_allclose(out, alone, rtol=1e-4, atol=1e-5)
    assert "unit eval" in caplog.text and "3/3" in caplog.text
    assert predict(model, [], batch_size=3) == []
