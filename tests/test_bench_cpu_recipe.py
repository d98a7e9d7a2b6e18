"""bench/bench_cpu_recipe.py: every variant is valid params and changes what its name says (no training)."""

from __future__ import annotations

import pytest

from bench import bench_cpu_recipe as bench
from bert_core.corpus import CorpusParams
from bert_core.pretrain import PretrainParams
from bert_core.pretrain_data.params import PretrainDataParams
from bert_core.vocab import VocabParams


def _params(name: str, *base: dict) -> tuple[PretrainDataParams, PretrainParams]:
    layers = [bench.PAPER, *base, bench.VARIANTS[name]]
    return (
        bench.stage_params("params/pretrain_data.yaml", "pretrain_data", PretrainDataParams, *layers),
        bench.stage_params("params/pretrain.yaml", "pretrain", PretrainParams, *layers),
    )


@pytest.mark.parametrize("name", list(bench.VARIANTS))
def test_every_variant_parses_and_predicts_what_it_masks(name):
    data, pre = _params(name)
    assert [p.name for p in pre.phases] == data.phases
    for phase in data.phases:
        spec = data.phase_specs[phase]
        # the prediction budget never caps the masking rate (Google's 20 at 15% and 128 tokens)
        assert spec.max_predictions_per_seq >= data.masked_lm_prob * (spec.max_seq_length - 3)
    assert pre.nsp == (data.random_next_prob > 0)


def test_the_variants_change_what_their_names_say():
    paper_data, paper = _params("paper")  # the paper's recipe whatever the committed profile holds
    assert paper_data.phases == ["seq128", "seq512"] and paper.nsp and paper_data.mask_split.is_paper
    assert (paper_data.masked_lm_prob, paper_data.random_next_prob) == (
        0.15,
        0.5,
    ) and not paper.model.overrides
    assert [p.share for p in paper.phases] == [0.9, 0.1]
    data, pre = _params("no512_mask30_nonsp_nodropout")
    assert data.phases == ["seq128"] and [p.share for p in pre.phases] == [1.0]
    assert pre.phases[0].model_dump(exclude={"share"}) == paper.phases[0].model_dump(exclude={"share"})
    assert data.masked_lm_prob == 0.3 and data.phase_specs["seq128"].max_predictions_per_seq == 40
    assert data.random_next_prob == 0.0 and not pre.nsp
    assert pre.model.overrides == bench.NO_DROPOUT
    assert _params("no512_split100")[0].mask_split.mask == 1.0
    assert _params("no512_batch64")[1].phases[0].global_batch == 64
    assert _params("no512_lr4e-3")[1].phases[0].lr == 4.0e-3


def test_the_tiny_layer_parses():
    assert (
        bench.stage_params("params/corpus.yaml", "corpus", CorpusParams, bench.TINY).cap.max_bytes == 500_000
    )
    assert bench.stage_params("params/vocab.yaml", "vocab", VocabParams, bench.TINY).vocab_size == 3000
    assert _params("paper", bench.TINY)[0].dupe_factor == 1


def test_a_misspelt_override_names_the_key():
    layer = {"params/pretrain.yaml": {"pretrain.modle.overrides": {}}}
    with pytest.raises(SystemExit, match=r"params/pretrain.yaml: no key 'pretrain.modle.overrides'"):
        bench.stage_params("params/pretrain.yaml", "pretrain", PretrainParams, layer)
