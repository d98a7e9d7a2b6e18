"""Scaling suite (marker ``scale``, ``make test-scale``): the data stages on the real corpus at growing sizes.

corpus -> vocab -> pretrain_data, with the committed params, every size cap lifted and the paper's objective
(both phases, NSP pairs: the data a full-size run builds), on nested subsets of
``corpus/`` under the shared data root (about 4, 20, 40 and 80 MB of text; the recipe and the stage calls
are the ones ``bench/bench_scale.py`` measures, so the suite checks what the bench times). Every stage must
pass its critical data checks, and the IsNext share of every pretrain_data output must be within the bound
the params promise: ``1 - random_next_prob`` +- 1 point, widened to 3 standard errors of a share over the
output's instances when the output is too small for 1 point (the rule of
``bert_core/pretrain_data/checks.py``, applied to the whole output instead of a sample).

Minutes per size and a few GB of temporary disk at 80 MB; skipped when the real corpus is absent.
"""

from __future__ import annotations

import math

import pytest

from bench import bench_scale

pytestmark = pytest.mark.scale

SIZES_MB = (4, 20, 40, 80)
NSP_TOLERANCE = 0.01  # the checks' tolerance on the IsNext share


@pytest.fixture(scope="module")
def subsets(shared_data):
    corpus = shared_data / "corpus"
    if not (corpus / "gutenberg").is_dir() or not (corpus / "wikipedia").is_dir():
        pytest.skip(f"the real corpus ({corpus}/gutenberg, {corpus}/wikipedia) is not on this machine")
    return {s.target_mb: s for s in bench_scale.choose_subsets(corpus, list(SIZES_MB))}


def nsp_bound(target: float, instances: int) -> float:
    """Allowed distance of an output's IsNext share from ``target``."""
    return max(NSP_TOLERANCE, 3 * math.sqrt(target * (1 - target) / max(instances, 1)))


@pytest.mark.timeout(3 * 3600)
@pytest.mark.parametrize("size_mb", SIZES_MB)
def test_data_stages_pass_their_checks_at_scale(size_mb, subsets, shared_data, tmp_path):
    subset = subsets[size_mb]
    root = bench_scale.materialize(subset, shared_data, tmp_path)
    # corpus and vocab raise DataCheckError on a failed critical check
    corpus = bench_scale.run_corpus(root, tmp_path / "corpus")
    assert corpus["documents"] > 0, subset.describe()
    bench_scale.run_vocab(root, tmp_path / "corpus", tmp_path / "vocab")
    result = bench_scale.run_pretrain_data(
        tmp_path / "corpus", tmp_path / "vocab", tmp_path / "pretrain_data"
    )

    failed = {
        k: o["checks_failed_critical"] for k, o in result["outputs"].items() if o["checks_failed_critical"]
    }
    off = {
        k: f"IsNext {o['is_next_share']:.4f}, target {o['target_is_next_share']:.2f} "
        f"+- {nsp_bound(o['target_is_next_share'], o['instances']):.4f} over {o['instances']:,} instances"
        for k, o in result["outputs"].items()
        if abs(o["is_next_share"] - o["target_is_next_share"])
        > nsp_bound(o["target_is_next_share"], o["instances"])
    }
    assert not failed and not off, f"{subset.describe()}: failed critical checks {failed}; NSP balance {off}"
