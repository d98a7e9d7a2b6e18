"""The progress reporter (bert_core.progress): rate limiting and the line, on a fake clock; and that the
long steps use it (a fine-tune on a few rows logs its progress; stage flows show bert_core INFO lines)."""

from __future__ import annotations

import logging

import pytest

from bert_core.progress import Progress, format_duration

LOGGER = "bert_core.test_progress"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def _progress(clock, total=100, **kwargs) -> Progress:
    kwargs.setdefault("interval_s", 10.0)
    kwargs.setdefault("min_fraction", 0.05)
    return Progress("sst2 train", total, logger=logging.getLogger(LOGGER), clock=clock, **kwargs)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (42.4, "42s"), (185, "3m05s"), (7300, "2h01m40s"), (float("inf"), "?"), (float("nan"), "?")],
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_line_has_step_total_percent_rate_elapsed_and_eta(clock, caplog):
    p = _progress(clock, detail=lambda step: f"epoch {step / 50:.2f}/2")
    clock.now += 30
    with caplog.at_level(logging.INFO, logger=LOGGER):
        p.advance(25, examples=800)
    assert _lines(caplog) == [
        "sst2 train: step 25/100 (25.0%), epoch 0.50/2, 26.7 examples/s, elapsed 30s, ETA 1m30s"
    ]


def test_time_and_share_both_must_pass_whichever_is_rarer(clock, caplog):
    p = _progress(clock, total=1000)  # a line at most every 10 s and every 50 steps
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for _ in range(100):  # 100 fast steps: 1 s apart, 10 s pass at step 10, 5 % at step 50
            clock.now += 1
            p.advance(1)
        assert [line.split(",")[0] for line in _lines(caplog)] == [
            "sst2 train: step 50/1000 (5.0%)",
            "sst2 train: step 100/1000 (10.0%)",
        ]
        caplog.clear()
        for _ in range(100):  # slow steps, 20 s each: the 10 s limit is rarer than 5 %
            clock.now += 20
            p.advance(50)
        assert len(_lines(caplog)) == 100
        caplog.clear()
        clock.now += 5  # far enough, too soon
        p.advance(500)
    assert _lines(caplog) == []


def test_a_short_loop_is_silent_and_a_long_one_closes_with_a_done_line(clock, caplog):
    with caplog.at_level(logging.INFO, logger=LOGGER):
        short = _progress(clock, total=10)
        for _ in range(10):
            clock.now += 0.1
            short.advance(1)
        short.finish()
        assert _lines(caplog) == []
        long = _progress(clock, total=10)
        for _ in range(10):
            clock.now += 3
            long.advance(1, examples=32)
        long.finish()
        long.finish()  # once
    lines = _lines(caplog)
    assert len(lines) == 3  # after 12 s, after 24 s, and the closing line
    assert lines[-1] == "sst2 train: done, step 10/10 (100.0%), 10.7 examples/s, elapsed 30s"


def test_unknown_total_has_no_percent_nor_eta(clock, caplog):
    p = _progress(clock, total=None, noun="rows", unit="rows")
    clock.now += 11
    with caplog.at_level(logging.INFO, logger=LOGGER):
        p.update(3300)
    assert _lines(caplog) == ["sst2 train: rows 3300, 300 rows/s, elapsed 11s"]


def test_reset_starts_the_clock_and_a_resumed_count(clock, caplog):
    p = _progress(clock, total=100)
    clock.now += 500  # setup time before training must not count
    p.reset(initial=40)  # resumed at step 40: the rate counts only this run's steps
    clock.now += 20
    with caplog.at_level(logging.INFO, logger=LOGGER):
        p.update(50, examples=320)
    assert _lines(caplog) == ["sst2 train: step 50/100 (50.0%), 16 examples/s, elapsed 20s, ETA 1m40s"]


def test_disabled_level_costs_no_line(clock, caplog):
    p = _progress(clock, total=10)
    clock.now += 100
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        p.advance(10)
        p.finish()
    assert _lines(caplog) == [] and p.lines == 0


def test_settings_from_the_environment(monkeypatch, clock):
    monkeypatch.setenv("BERT_PROGRESS_INTERVAL_S", "2.5")
    monkeypatch.setenv("BERT_PROGRESS_MIN_PERCENT", "10")
    p = Progress("x", 10, clock=clock)
    assert (p.interval_s, p.min_fraction) == (2.5, 0.1)
    monkeypatch.setenv("BERT_PROGRESS_INTERVAL_S", "soon")
    with pytest.raises(ValueError, match=r"BERT_PROGRESS_INTERVAL_S='soon' is invalid"):
        Progress("x", 10, clock=clock)
    monkeypatch.delenv("BERT_PROGRESS_INTERVAL_S")
    monkeypatch.setenv("BERT_PROGRESS_MIN_PERCENT", "150")
    with pytest.raises(ValueError, match=r"BERT_PROGRESS_MIN_PERCENT='150' is invalid"):
        Progress("x", 10, clock=clock)


def test_finetune_on_a_few_rows_logs_progress(tmp_path, shared_data, monkeypatch, caplog):
    """Training steps (with the epoch), the dev evaluation pass and feature building all report."""
    import shutil

    import torch

    from bert_core.config import BertConfig
    from bert_core.finetune.params import FinetuneParams
    from bert_core.finetune.run import finetune_task
    from bert_core.model import BertForPreTraining

    model = tmp_path / "model"
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    BertForPreTraining(config).save_pretrained(model)
    shutil.copy(shared_data / "checkpoints" / "bert-base-uncased" / "vocab.txt", model / "vocab.txt")
    params = FinetuneParams(
        defaults=dict(
            train_limit=24,
            eval_limit=16,
            learning_rates=[1e-3],
            seeds=[1],
            epochs=1,
            batch_size=8,
            eval_batch_size=8,
            max_seq_length=32,
            predict_test=False,
        ),
        small_task_seeds=[1],
        data_checks=False,
        device="cpu",
    )
    monkeypatch.setenv("BERT_PROGRESS_INTERVAL_S", "0")  # a line at every update: no timing in the test
    monkeypatch.setenv("BERT_PROGRESS_MIN_PERCENT", "0")
    with caplog.at_level(logging.INFO, logger="bert_core"):
        finetune_task("sst2", params, model, tmp_path / "out", data_root=shared_data)
    lines = [r.getMessage() for r in caplog.records]
    train = [m for m in lines if m.startswith("sst2-pretrained-lr0.001-seed1 train: ")]
    assert train[0].startswith("sst2-pretrained-lr0.001-seed1 train: step 1/3 (33.3%), epoch 0.33/1, ")
    assert all("examples/s" in m and "elapsed" in m for m in train)
    assert all("ETA" in m for m in train if ": done," not in m)
    assert train[-1].startswith("sst2-pretrained-lr0.001-seed1 train: done, step 3/3 (100.0%), epoch 1.00/1")
    evals = [m for m in lines if m.startswith("sst2-pretrained-lr0.001-seed1 dev eval: batch ")]
    assert evals and "batch 2/2 (100.0%)" in evals[-1]
    assert any(m.startswith("sst2 train: 24 rows -> 24 features in ") for m in lines)
    # a train window's metrics line is DEBUG (the progress lines report training); evaluations stay INFO
    assert not any(m.startswith("step 3 train: ") for m in lines)
    done, final_eval = (
        lines.index(train[-1]),
        next(i for i, m in enumerate(lines) if m.startswith("step 3 eval: ")),
    )
    assert done < final_eval  # training's closing line comes before the final evaluation's lines


def test_squad_feature_building_reports_examples_and_features(caplog, monkeypatch):
    from bert_core.kinds.span_qa import encode_squad

    class Tokenizer:  # whitespace "tokens": enough for the encoding loop
        cls_token_id, sep_token_id = 101, 102

        def __call__(self, texts, return_offsets_mapping=False, **_):
            ids = [[1000 + len(w) for w in t.split()] for t in texts]
            out = {"input_ids": ids}
            if return_offsets_mapping:
                offsets = []
                for t in texts:
                    pos, spans = 0, []
                    for w in t.split():
                        pos = t.index(w, pos)
                        spans.append((pos, pos + len(w)))
                        pos += len(w)
                    offsets.append(spans)
                out["offset_mapping"] = offsets
            return out

    examples = [
        {
            "id": str(i),
            "question": "who is it",
            "context": " ".join(["word"] * 40),
            "answers": {"text": ["word"], "answer_start": [0]},
            "is_impossible": False,
        }
        for i in range(4)
    ]
    monkeypatch.setenv("BERT_PROGRESS_INTERVAL_S", "0")
    monkeypatch.setenv("BERT_PROGRESS_MIN_PERCENT", "0")
    with caplog.at_level(logging.INFO, logger="bert_core"):
        features = encode_squad(
            examples, Tokenizer(), max_seq_length=32, doc_stride=16, label="squad_v1 eval features"
        )
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("squad_v1 eval features: ")]
    per_example = len(features) // 4
    assert lines[1].startswith(f"squad_v1 eval features: example 2/4 (50.0%), {2 * per_example} features, ")
    assert lines[-1].startswith(
        f"squad_v1 eval features: done, example 4/4 (100.0%), {len(features)} features"
    )


def _window(clock, progress, step, *, steps=25, seconds=5.0, seq_per_s=40.0, loss=6.5):
    """One Trainer train window of ``steps`` steps in ``seconds``, ending at ``step``."""
    clock.now += seconds
    metrics = {
        "loss": loss,
        "seq_per_s": seq_per_s,
        "tokens_per_s": seq_per_s * 128,
        "step_time_s": seconds / steps,
        "elapsed_s": clock.now - 1000.0,
    }
    progress.window(step, metrics)


def test_pretraining_progress_is_rate_limited_with_phase_and_run_eta(clock, caplog):
    from bert_core.training.progress import LaterPhase, TrainProgress

    caplog.set_level(logging.INFO, logger=LOGGER)
    # a later phase of 100 steps at 4x the tokens per step: 100 x 0.2 s x 4 = 80 s
    progress = TrainProgress(
        "pretrain phase seq128",
        1000,
        log_every=25,
        later=[LaterPhase(100, None, 4.0)],
        interval_s=20.0,
        min_fraction=0.05,
        logger=logging.getLogger(LOGGER),
        clock=clock,
    )
    for step in range(25, 501, 25):  # a window every 5 s: 100 s, 500 steps
        _window(clock, progress, step)
    lines = _lines(caplog)
    assert 3 <= len(lines) <= 5, lines  # every >= 20 s and >= 5 %, not one per window (20 windows)
    last = lines[-1]
    assert last.startswith("pretrain phase seq128: step ") and "/1000 (" in last
    assert "loss 6.5" in last and "5,120 tokens/s" in last and "40 seq/s" in last
    # 0.2 s per step: the phase's steps left x 0.2 s, and the run's 80 s more
    step = int(last.split("step ")[1].split("/")[0])
    assert f"ETA {format_duration((1000 - step) * 0.2)}" in last
    assert f"run ETA {format_duration((1000 - step) * 0.2 + 80)}" in last


def test_a_time_budget_nearer_than_the_steps_sets_the_phase_eta(clock, caplog):
    from bert_core.training.progress import TrainProgress

    caplog.set_level(logging.INFO, logger=LOGGER)
    progress = TrainProgress(
        "pretrain phase seq128",
        10_000,
        log_every=25,
        budget_s=300.0,
        interval_s=0.0,
        min_fraction=0.0,
        logger=logging.getLogger(LOGGER),
        clock=clock,
    )
    for step in (25, 50):
        _window(clock, progress, step)
    # 10 s trained of a 300 s budget: 290 s left, far sooner than 9,950 steps at 0.2 s
    assert _lines(caplog)[-1].endswith("ETA 4m50s") and "run ETA" not in _lines(caplog)[-1]


def test_a_resumed_phase_counts_its_earlier_steps_toward_the_percentage_not_the_rate(clock, caplog):
    from bert_core.training.progress import TrainProgress

    caplog.set_level(logging.INFO, logger=LOGGER)
    progress = TrainProgress(
        "pretrain phase seq128",
        1000,
        log_every=25,
        interval_s=0.0,
        min_fraction=0.0,
        logger=logging.getLogger(LOGGER),
        clock=clock,
    )
    _window(clock, progress, 525)  # resumed at step 500: its first window, 25 steps in 5 s
    line = _lines(caplog)[-1]
    assert "step 525/1000 (52.5%)" in line and "ETA 1m35s" in line  # 475 steps x 0.2 s


def test_pretraining_logs_the_window_line_at_debug_only():
    import inspect

    from bert_core.training import loop

    assert 'logging.DEBUG if kind == "train"' in inspect.getsource(loop.Trainer._emit)
