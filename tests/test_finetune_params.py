"""Fine-tuning params: the shipped YAML parses, per-task settings merge in order, errors name the key."""

from __future__ import annotations

import pytest

from bert_core.constants import REPO_ROOT as REPO
from bert_core.evaluate.params import EvaluateParams
from bert_core.finetune.params import PAPER_LEARNING_RATES, FinetuneParams
from bert_core.params import ParamsError, load_params, parse_params


def test_shipped_params_parse_and_run_offline(shared_data):
    from bert_core.tasks import get_task
    from bert_core.tasks.datasource import resolve_task_source

    params = load_params(REPO / "params" / "finetune.yaml", "finetune", FinetuneParams)
    load_params(REPO / "params" / "evaluate.yaml", "evaluate", EvaluateParams)
    assert params.tasks, "the default profile fine-tunes at least one task"
    assert any(params.for_task(t).random_init_baseline for t in params.tasks), "a random-init baseline runs"
    for (
        task
    ) in params.tasks:  # the default profile must run offline against shared/data, as the stage reads it
        s = params.for_task(task)
        source = resolve_task_source(
            get_task(task),
            dev_split=s.dev_split,
            train_file=s.train_file,
            dev_file=s.dev_file,
            data_root=shared_data,
        )
        for split in ("train", "dev"):
            assert source.load(split, limit=1)
    assert params.for_task("squad_v1").dev_split, (
        "SQuAD v1.1 on real text: the dev split (no train file here)"
    )


def test_paper_protocol_is_the_code_default():
    settings = FinetuneParams().for_task("sst2")
    assert (settings.batch_size, settings.epochs, settings.warmup_ratio) == (32, 3.0, 0.1)
    assert tuple(settings.learning_rates) == PAPER_LEARNING_RATES and settings.seeds == [1]
    assert FinetuneParams().for_task("mrpc").seeds == [1, 2, 3]  # small tasks: several restarts


def test_override_order():
    params = parse_params(
        {
            "defaults": {"train_limit": 100, "seeds": [7]},
            "small_task_seeds": [1, 2],
            "tasks": {"rte": {"epochs": 2}, "cola": {"seeds": [5]}, "sst2": {"max_grad_norm": None}},
        },
        FinetuneParams,
    )
    assert params.for_task("rte").seeds == [1, 2] and params.for_task("rte").epochs == 2.0
    assert params.for_task("cola").seeds == [5]  # the task's own seeds win over small_task_seeds
    assert params.for_task("sst2").seeds == [7] and params.for_task("sst2").max_grad_norm is None
    assert params.for_task("qnli").train_limit == 100


@pytest.mark.parametrize(
    "data, message",
    [
        ({"tasks": {"sst3": {}}}, "unknown task"),
        ({"tasks": {"sst2": {"learning_rate": 1e-4}}}, "finetune.tasks.sst2.learning_rate"),
        ({"defaults": {"learning_rates": [0.0]}}, "learning rates must be > 0"),
        ({"defaults": {"seeds": [1, 1]}}, "seeds must be distinct"),
        ({"model": {"init": "scratch"}}, "finetune.model.init"),
    ],
)
def test_bad_params_name_the_key(data, message):
    with pytest.raises(ParamsError, match=message):
        parse_params(data, FinetuneParams, where="params/finetune.yaml", prefix="finetune")


@pytest.mark.parametrize(
    "data, message",
    [
        (
            {"tasks": {"sst2": {"learning_rates": [0.0]}}},
            r"'finetune.tasks.sst2.learning_rates' = \[0.0\]: learning rates must be > 0",
        ),
        (
            {"tasks": {"rte": {"seeds": [2, 2]}}},
            r"'finetune.tasks.rte.seeds' = \[2, 2\]: seeds must be distinct",
        ),
        (
            {"tasks": {"sst2": {"batch_size": 0}}},
            r"'finetune.tasks.sst2.batch_size' = 0: .*greater than or equal to 1",
        ),
        (
            {"tasks": {"sst2": {"max_seq_length": 1024}}},
            r"'finetune.tasks.sst2.max_seq_length' = 1024: .*less than or equal to 512",
        ),
        ({"tasks": {"sst2": {"epochs": None}}}, r"'finetune.tasks.sst2.epochs' = None"),
        ({"small_task_seeds": [1, 1]}, r"'finetune.small_task_seeds' = \[1, 1\]: seeds must be distinct"),
    ],
)
def test_per_task_values_are_validated_as_under_defaults(data, message):
    """A per-task value gets the checks and the message (file + dotted key) it gets under ``defaults``."""
    with pytest.raises(ParamsError, match=rf"^params/finetune.yaml: {message}"):
        parse_params(data, FinetuneParams, where="params/finetune.yaml", prefix="finetune")


def test_overrides_are_derived_from_the_settings():
    """Every TaskSettings field can be overridden per task, with the same bounds; none is restated."""
    from bert_core.finetune.params import TaskOverrides, TaskSettings

    assert list(TaskOverrides.model_fields) == list(TaskSettings.model_fields)
    for name, info in TaskSettings.model_fields.items():
        over = TaskOverrides.model_fields[name]
        assert over.default is None and not over.is_required(), name
        assert over.metadata == info.metadata, name
    assert TaskOverrides().model_dump(exclude_unset=True) == {}


def test_train_config_comes_from_the_settings():
    settings = FinetuneParams().for_task("sst2")
    config = settings.train_config(100, learning_rate=3e-5, seed=4, device="cpu", precision="fp32")
    assert (config.max_steps, config.lr, config.seed, config.device, config.precision) == (
        12,
        3e-5,
        4,
        "cpu",
        "fp32",
    )
    assert (config.warmup_ratio, config.weight_decay, config.max_grad_norm) == (0.1, 0.01, 1.0)
    assert (config.eval_every, config.log_every, config.checkpoint_every) == (4, 1, 0)
    assert settings.steps_per_epoch(100) == 4
