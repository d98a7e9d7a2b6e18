"""The declared stage table: every pipeline stage, in the order DVC runs them, and what it is made of.

One row per stage: its params file, section and model, its library entry, the flow module DVC runs, its
command-line options with their default paths, its outputs, metrics and plots, and the data it takes from
upstream. The runner, the serving, the profiles and the tests read it; ``tests/test_stages.py`` checks it
against ``dvc.yaml``, whose code deps ``python -m flows.stages sync-deps [--check]`` derives from the
imports (:mod:`flows.stages.deps`). Import-light (no ``bert_core``, no Prefect): every stage flow imports it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from pkgutil import resolve_name as resolve  # "module:attribute" -> the object
from typing import Any

#: The DVC stage before every other: it records what each stage reads from outside the repository
#: (:mod:`bert_core.inputs`) under :data:`INPUTS_DIR`, one file per stage whose ``reads`` says so, and runs on
#: every ``dvc repro`` (``always_changed``); a stage depends on its record. Not a row of the table: it has
#: no params, flow or tracking of its own (``python -m flows.stages inputs``).
INPUTS = "inputs"
INPUTS_DIR = "data/inputs"


def details_file(metrics_path: str | os.PathLike[str]) -> Path:
    """Every statistic of a stage, beside its headline metrics file: ``metrics/details/corpus.json``."""
    path = Path(metrics_path)
    return path.parent / "details" / path.name


def positive_int(text: str) -> int:
    """An option's whole number of 1 or more (``--workers 0`` is refused with the usage line, at once)."""
    if (value := int(text)) < 1:
        raise ValueError(text)
    return value


@dataclass(frozen=True)
class Option:
    """One command-line option of a stage flow, mapped to a parameter of the flow function."""

    flag: str  # "--out", or a name without dashes for a positional argument
    dest: str  # the flow function's parameter
    default: Any = None
    type: Any = str
    help: str | None = None

    @property
    def positional(self) -> bool:
        return not self.flag.startswith("-")


@dataclass(frozen=True)
class Stage:
    """One pipeline stage. Paths are relative to the repository root; ``${key}`` is the foreach item."""

    name: str  # also its params file's section: params/<name>.yaml, key <name>
    params_model: str  # "module:Class", imported on demand
    entry: str  # the library function doing the stage's work, "module:function"
    flow: str  # "module:attribute": a Prefect flow, or a function that builds one (lazy Prefect import)
    options: tuple[Option, ...]  # besides --params and --metrics, which every stage has
    outs: tuple[str, ...]
    metrics: tuple[str, ...] = ()  # default metrics/<name>.json
    plots: tuple[str, ...] = ()
    data_deps: tuple[str, ...] = ()  # outputs of upstream stages
    extra_params: tuple[tuple[str, str], ...] = ()  # (params file, dotted key) read besides the section
    foreach: str | None = None  # dotted params key whose entries each get one stage (``finetune@<key>``)
    # "module:function": what it reads from outside the repository (bert_core.inputs.Reads); its record,
    # written by the DVC stage INPUTS, is its first dep
    reads: str | None = None
    # The figures of the DVC metrics file, in order (fnmatch patterns over the flat keys; ``{main}``: the
    # task's main metric; ``name=pattern``: under that name): what a user compares across runs, so that
    # ``dvc metrics show/diff`` fit a terminal. Every other statistic goes to the details file (``details``)
    # and MLflow. (DVC itself sorts the columns by name.)
    headline: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        metrics = self.metrics or (f"metrics/{self.name}.json",)
        first = [o for o in self.options if o.positional]
        item = f"<{self.foreach.rpartition('.')[2].rstrip('s')}>" if self.foreach else ""
        default = metrics[0].replace("${key}", item)
        help_ = f"metrics JSON, the headline figures (default {default}); every statistic: details/<name> beside it"
        options = (
            *first,
            Option("--params", "params_file", self.params_file),
            *(o for o in self.options if not o.positional),
            Option("--metrics", "metrics_path", None, help=help_),
        )
        object.__setattr__(self, "metrics", metrics)
        object.__setattr__(self, "options", options)

    @property
    def params_file(self) -> str:
        return f"params/{self.name}.yaml"

    @property
    def section(self) -> str:
        return self.name

    @property
    def details(self) -> tuple[str, ...]:
        """The details file of each metrics file (:func:`details_file`; a plain JSON out, not a DVC metric)."""
        return tuple(details_file(m).as_posix() for m in self.metrics)

    @property
    def record(self) -> str | None:
        """The record of what it reads from outside the repository (``reads``), a dep written by :data:`INPUTS`."""
        if self.reads is None:
            return None
        return f"{INPUTS_DIR}/{self.name}/${{key}}.json" if self.foreach else f"{INPUTS_DIR}/{self.name}.json"

    @property
    def flow_module(self) -> str:
        return self.flow.partition(":")[0]

    @property
    def module_name(self) -> str:
        """The ``<stage>`` of ``python -m flows.<stage>``."""
        return self.flow_module.rsplit(".", 1)[-1]

    def default(self, dest: str) -> Any:
        """The default of the option that sets flow parameter ``dest``."""
        for option in self.options:
            if option.dest == dest:
                return option.default
        raise KeyError(f"stage {self.name} has no option for {dest!r}")

    def expand(self, template: str, key: str) -> str:
        """A path of the table for one foreach instance: ``${key}`` replaced by ``key``."""
        return template.replace("${key}", key)

    def model(self) -> type:
        """The params model class (imports its module)."""
        return resolve(self.params_model)

    def entry_function(self) -> Any:
        return resolve(self.entry)

    def load_params(self, params_file: str | None = None) -> Any:
        """Read and validate this stage's params section (default file: the stage's own), and check that
        this machine can run them (``device: cuda`` where torch sees no GPU is refused here, naming the key,
        rather than after the data has loaded)."""
        from bert_core.params import check_device, load_params

        path = params_file or self.params_file
        params = load_params(path, self.section, self.model())
        check_device(params, where=str(path), key=f"{self.section}.device")
        return params


STAGES: tuple[Stage, ...] = (
    Stage(
        name="corpus",
        params_model="bert_core.corpus:CorpusParams",
        entry="bert_core.corpus:build_corpus",
        flow="flows.corpus:corpus_flow",
        options=(
            Option("--out", "out_dir", "data/corpus"),
            Option("--workers", "workers", None, positive_int),
        ),
        outs=("data/corpus",),
        reads="bert_core.corpus.units:corpus_reads",
        headline=(
            "documents",
            "documents_train",
            "documents_heldout",
            "sentences",
            "words",
            "bytes",
            "documents_dropped_total",
            "duplicates",
            "utf8_replacements",
            "shards_train",
            "shards_heldout",
            "checks_failed",
            "elapsed_s",
            "input_mb_per_s",
        ),
    ),
    Stage(
        name="vocab",
        params_model="bert_core.vocab:VocabParams",
        entry="bert_core.vocab:train_vocab",
        flow="flows.vocab:vocab_flow",
        options=(
            Option("--corpus", "corpus_dir", "data/corpus"),
            Option("--out", "out_dir", "data/vocab"),
        ),
        outs=("data/vocab",),
        reads="bert_core.vocab.checkpoint:vocab_reads",
        headline=(
            "vocab_size",
            "heldout.unk_rate",
            "heldout.subwords_per_word",
            "heldout.words_with_unk",
            "reference_bert_base_uncased.unk_rate",
            "reference_bert_base_uncased.subwords_per_word",
            "continuation_pieces",
            "sample_documents",
            "checks_failed",
            "train_seconds",
        ),
        data_deps=("data/corpus",),
    ),
    Stage(
        name="pretrain_data",
        params_model="bert_core.pretrain_data.params:PretrainDataParams",
        entry="bert_core.pretrain_data.build:build_pretrain_data",
        flow="flows.pretrain_data:pretrain_data_flow",
        options=(
            Option("--corpus", "corpus_dir", "data/corpus"),
            Option("--vocab", "vocab_dir", "data/vocab"),
            Option("--out", "out_dir", "data/pretrain_data"),
            Option("--workers", "workers", None, positive_int),
        ),
        outs=("data/pretrain_data",),
        headline=(
            "*.train.instances",
            "*.heldout.instances",
            "*.train.tokens",
            "elapsed_s",
            "instances_per_s",
            "tokens_per_s",
            "workers",
        ),
        data_deps=("data/corpus", "data/vocab"),
    ),
    Stage(
        name="pretrain",
        params_model="bert_core.pretrain:PretrainParams",
        entry="bert_core.pretrain:pretrain",
        flow="flows.pretrain:prefect_flow",  # built lazily: torchrun's worker ranks never import Prefect
        options=(
            Option("--data", "data_dir", "data/pretrain_data"),
            Option("--vocab", "vocab_dir", "data/vocab"),
            Option("--out", "out_dir", "models/pretrained"),
            Option("--checkpoints", "checkpoint_root", "data/pretrain/checkpoints"),
            Option("--loss-plot", "loss_plot", "plots/pretrain_loss.csv"),
            Option("--heldout-plot", "heldout_plot", "plots/pretrain_heldout.csv"),
        ),
        outs=("models/pretrained",),
        headline=(
            "heldout.mlm_loss",
            "heldout.mlm_acc",
            "heldout.baseline_mlm_acc",
            "heldout.nsp_acc",
            "heldout_before.mlm_loss",  # continued pretraining: the checkpoint it started from
            "steps",
            "train_seconds",
            "parameters_m",
            "phases.*.steps",
            "phases.*.train_seq_per_s",
            "phases.*.train_tokens_per_s",
            "phases.*.seconds",
            "registry.version",
        ),
        plots=("plots/pretrain_loss.csv", "plots/pretrain_heldout.csv"),
        data_deps=("data/pretrain_data", "data/vocab"),
    ),
    Stage(
        name="finetune",
        params_model="bert_core.finetune.params:FinetuneParams",
        entry="bert_core.finetune.run:finetune_task",
        flow="flows.finetune:finetune_flow",
        options=(
            Option("task", "task", help="task name, e.g. sst2, mnli, squad_v1, conll2003"),
            Option("--model-source", "model_source", None, help="override finetune.model.source"),
            Option("--out", "out_dir", None, help="predictions dir (default results/finetune/<task>)"),
            Option("--model-out", "model_out", None, help="model dir (default models/finetuned/<task>)"),
            Option("--plots", "plots_dir", None, help="learning-curve CSVs (default plots/finetune/<task>)"),
            Option(
                "--trials", "trials_root", "data/finetune/trials", help="finished trials kept for a rerun"
            ),
        ),
        outs=("models/finetuned/${key}", "results/finetune/${key}"),
        metrics=("metrics/finetune/${key}.json",),
        headline=(
            # the same columns for every task (name=pattern), whatever its main metric
            "score=dev.{main}",
            "score_mean=dev.{main}_mean",
            "score_std=dev.{main}_std",
            "seeds",
            "main_metric",
            "dev_split",  # 1: trained and scored on halves of the dev file, not an official dev score
            "score_mismatched=dev_mismatched.{main}",
            "score_test=test.{main}",  # a labelled test set (CoNLL-2003, an own task's test_file)
            "best_baseline=best_baseline.{main}",
            "random_init=random_init.dev.{main}",
            "gap_random_init=gap.dev.{main}",
            "reference=reference.dev.{main}",
            "selected.learning_rate",
            "train.examples",
            "train.examples_per_second",
            "train.seconds",
            "trials",
        ),
        plots=("plots/finetune/${key}/train.csv", "plots/finetune/${key}/dev.csv"),
        # the checkpoint it starts from: models/pretrained (the pretrain stage's output, so DVC runs
        # pretraining first) or, in the released profile, a released checkpoint's directory (no upstream)
        data_deps=("${finetune.model.source}",),
        foreach="finetune.tasks",
        reads="bert_core.finetune.params:task_reads",
    ),
    Stage(
        name="evaluate",
        params_model="bert_core.evaluate.params:EvaluateParams",
        entry="bert_core.evaluate.report:evaluate_results",
        flow="flows.evaluate:evaluate_flow",
        options=(Option("--finetune-params", "finetune_params_file", "params/finetune.yaml"),),
        outs=("reports/evaluate.md", "reports/evaluate.html", "reports/evaluate"),
        # the rows' task scores come first (bert_core.evaluate.report.score_keys), then these; the
        # thirteen tasks of the paper fit MAX_HEADLINE
        headline=(
            "glue.average",
            "glue.reference_average",
            "glue.random_init_average",
            "gap.mean",
            "baseline.tasks_beating",
        ),
        data_deps=("results/finetune",),
        extra_params=(("params/finetune.yaml", "finetune.tasks"),),
    ),
)

BY_NAME: dict[str, Stage] = {s.name: s for s in STAGES}


def get(name: str) -> Stage:
    """The stage ``name``; ``finetune@sst2`` (a foreach instance) gives ``finetune``."""
    base = name.split("@", 1)[0]
    try:
        return BY_NAME[base]
    except KeyError:
        raise KeyError(f"no stage {name!r}; stages: {', '.join(BY_NAME)}") from None


def producer(path: str) -> str | None:
    """The stage that writes ``path`` (one of its outs, relative to the repository as the table writes them)."""
    return next((s.name for s in STAGES if path in s.outs), None)


def by_params_file(file: str) -> Stage | None:
    """The stage whose own params section lives in ``file`` (``params/<stage>.yaml``), if any."""
    return next((s for s in STAGES if s.params_file == file), None)
