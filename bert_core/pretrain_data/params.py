"""Typed params of the ``pretrain_data`` stage (``params/pretrain_data.yaml``, section ``pretrain_data``).

Defaults follow Google's ``create_pretraining_data.py`` and the BERT paper (Devlin et al., 2019, §3.1 and
appendix A.2): ``masked_lm_prob`` 0.15, ``short_seq_prob`` 0.1, ``dupe_factor`` 10, and the two phases
``seq128`` (20 predictions) and ``seq512`` (80 predictions), and the 80/10/10 [MASK]/random/keep split of
the masked positions (``mask_split``).
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, model_validator

from bert_core.params import StrictModel

MIN_SEQ_LENGTH = 8  # [CLS] A [SEP] B [SEP] needs at least 5; below 8 nothing useful remains to mask.


class PhaseSpec(StrictModel):
    """One output of the stage: a sequence length and the matching prediction budget.

    ``max_predictions_per_seq`` must agree with the pretraining stage (the reference implementations' users
    lost accuracy when it did not); it is recorded in each output's ``index.json``.
    """

    max_seq_length: int = Field(ge=MIN_SEQ_LENGTH, description="tokens per instance, [CLS]/[SEP] included")
    max_predictions_per_seq: int = Field(ge=1, description="most masked positions per instance")


class MaskSplit(StrictModel):
    """What becomes of a position chosen for prediction: ``[MASK]``, a random id, or kept as it is.

    The paper's 80/10/10 (§3.1) is the default; its ablation (appendix C.2) compares other splits such as
    100/0/0 (always ``[MASK]``, a token fine-tuning never sees), which cost most in its feature-based NER
    setting.
    """

    mask: float = Field(0.8, ge=0.0, le=1.0, description="share replaced by [MASK]")
    random: float = Field(0.1, ge=0.0, le=1.0, description="share replaced by a random vocabulary id")
    keep: float = Field(0.1, ge=0.0, le=1.0, description="share left unchanged")

    @model_validator(mode="after")
    def _sums_to_one(self) -> MaskSplit:
        total = self.mask + self.random + self.keep
        if not math.isclose(total, 1.0, abs_tol=1e-6):
            raise ValueError(
                f"mask + random + keep must add up to 1, got {self.mask:g} + {self.random:g} + {self.keep:g} "
                f"= {total:g}; e.g. {{mask: 0.8, random: 0.1, keep: 0.1}} (the paper's)"
            )
        return self

    @property
    def is_paper(self) -> bool:
        """The paper's 80/10/10 (outputs built with it record no ``mask_split``: the format's default)."""
        return self == MaskSplit()


class PretrainDataParams(StrictModel):
    """Everything that decides the stage's output (plus ``num_workers``, which never changes it)."""

    seed: int = Field(
        12345, ge=0, description="base seed; each (phase, split, task, window, pass) derives one"
    )
    phases: list[str] = Field(default_factory=lambda: ["seq128", "seq512"], min_length=1)
    phase_specs: dict[str, PhaseSpec] = Field(
        default_factory=lambda: {
            "seq128": PhaseSpec(max_seq_length=128, max_predictions_per_seq=20),
            "seq512": PhaseSpec(max_seq_length=512, max_predictions_per_seq=80),
        }
    )
    max_position_embeddings: int = Field(
        512,
        ge=MIN_SEQ_LENGTH,
        description="the model's position table (recorded in index.json; pretrain builds its model with it)",
    )
    dupe_factor: int = Field(10, ge=1, description="passes over the train split, each with fresh masks")
    heldout_dupe_factor: int = Field(1, ge=1, description="passes over the heldout split")
    short_seq_prob: float = Field(0.1, ge=0.0, le=1.0)
    masked_lm_prob: float = Field(0.15, gt=0.0, le=1.0)
    random_next_prob: float = Field(0.5, ge=0.0, le=1.0, description="NotNext share for NSP")
    nsp_balance: bool = Field(
        True,
        description="compensate the forced NotNext of single-sentence chunks so the NotNext share of each "
        "whole output is random_next_prob (or the forced share, when that alone is higher); false = "
        "Google's rule exactly",
    )
    mask_split: MaskSplit = Field(
        default_factory=MaskSplit, description="[MASK]/random/keep shares of the positions chosen for MLM"
    )
    whole_word_masking: bool = False
    masking: Literal["static", "dynamic"] = Field(
        "static", description="static: masks stored (dupe_factor passes); dynamic: masked at load time"
    )
    window_tokens: int = Field(
        2_000_000, ge=1_000, description="tokens of corpus held at once per worker (bounds memory)"
    )
    min_window_docs: int = Field(
        64, ge=2, description="documents per window at least (NotNext B is drawn from the same window)"
    )
    task_bytes: int = Field(
        4_000_000, ge=1, description="text bytes per task (the unit of parallel work and of output shards)"
    )
    track_docs: bool = Field(False, description="debug: store the corpus rows of A and B per instance")
    check_sample: int = Field(20_000, ge=100, description="instances per output validated by the checks")
    num_workers: int = Field(2, ge=1, description="worker processes; the output does not depend on it")

    @model_validator(mode="after")
    def _consistent(self) -> PretrainDataParams:
        if len(set(self.phases)) != len(self.phases):
            raise ValueError(f"phases lists a phase twice: {self.phases}")
        unknown = [p for p in self.phases if p not in self.phase_specs]
        if unknown:
            raise ValueError(
                f"phases {unknown} have no entry in phase_specs (defined: {sorted(self.phase_specs)})"
            )
        for name, spec in self.phase_specs.items():
            if spec.max_seq_length > self.max_position_embeddings:
                raise ValueError(
                    f"phase_specs.{name}.max_seq_length = {spec.max_seq_length} exceeds "
                    f"max_position_embeddings = {self.max_position_embeddings}: the model has no position "
                    f"embedding beyond it; lower max_seq_length or raise max_position_embeddings"
                )
            eligible = spec.max_seq_length - 3
            if spec.max_predictions_per_seq > eligible:
                raise ValueError(
                    f"phase_specs.{name}.max_predictions_per_seq = {spec.max_predictions_per_seq} is more "
                    f"than the {eligible} maskable positions of a {spec.max_seq_length}-token instance"
                )
        return self

    def data_params(self) -> dict:
        """The params that decide the bytes of the output (``num_workers`` and ``check_sample`` do not).

        ``mask_split`` is left out at the paper's 80/10/10, which readers assume when it is absent: an
        output built with the default split has the same bytes as one built before the split was a
        parameter (and those stay readable).
        """
        exclude = {"num_workers", "check_sample"} | ({"mask_split"} if self.mask_split.is_paper else set())
        return self.model_dump(mode="json", exclude=exclude)

    def index_fields(self) -> dict[str, Any]:
        """The masking settings that ``index.json`` records beside ``masked_lm_prob`` for the loader (the
        split only when it is not the paper's, see :meth:`data_params`)."""
        return {} if self.mask_split.is_paper else {"mask_split": self.mask_split.model_dump(mode="json")}
