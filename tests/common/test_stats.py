"""The noise estimate on quality figures: paired bootstrap intervals of plugin − AR."""

import numpy as np
import pytest

from mmspec.common.stats import PER_SAMPLE, paired_bootstrap, split_quality


def accuracy_parts(hits):
    return (list(map(float, hits)), [1.0] * len(hits))


def test_a_real_quality_cost_is_outside_the_noise():
    """200 samples, accuracy 0.80 for AR and 0.60 for the plugin (paired: the plugin fails where AR did and on
    40 more): the interval excludes 0 and holds the true difference."""
    rng = np.random.default_rng(1)
    base = rng.random(200) < 0.8
    acc = base.copy()
    acc[rng.choice(np.flatnonzero(base), size=40, replace=False)] = False
    cost = paired_bootstrap({"acc": accuracy_parts(base)}, {"acc": accuracy_parts(acc)})["acc"]
    assert cost["n"] == 200 and cost["delta"] == pytest.approx(-40 / 200)
    assert cost["high"] < 0 and cost["low"] < cost["delta"] < cost["high"]


def test_noise_alone_gives_an_interval_around_zero():
    """Two independent draws of the same 0.8 accuracy on 50 samples: no real cost, the interval holds 0."""
    rng = np.random.default_rng(2)
    base, acc = rng.random(50) < 0.8, rng.random(50) < 0.8
    cost = paired_bootstrap({"acc": accuracy_parts(base)}, {"acc": accuracy_parts(acc)})["acc"]
    assert cost["low"] < 0 < cost["high"]
    assert cost["high"] - cost["low"] > 0.1  # 50 samples cannot resolve a few points


def test_ratio_metrics_identical_sides_and_one_sided_metrics():
    """A per-token figure (Σ nats / Σ tokens) is resampled as a ratio; identical sides give [0, 0]; a metric
    only one side has, or a single sample, gives no interval."""
    parts = ([3.0, 10.0, 4.0], [2, 5, 2])
    same = paired_bootstrap({"nll": parts, "only_base": parts}, {"nll": parts})
    assert set(same) == {"nll"} and same["nll"]["delta"] == 0 and same["nll"]["low"] == same["nll"]["high"] == 0
    shifted = paired_bootstrap({"nll": parts}, {"nll": ([4.0, 12.0, 5.0], [2, 5, 2])})["nll"]
    assert shifted["delta"] == pytest.approx(21 / 9 - 17 / 9) and shifted["low"] > 0
    assert paired_bootstrap({"nll": ([1.0], [1])}, {"nll": ([2.0], [1])}) == {}


def test_split_quality_leaves_the_figures_untouched():
    quality = {"acc": 0.5, PER_SAMPLE: {"acc": ([1.0, 0.0], [1.0, 1.0])}}
    figures, parts = split_quality(quality)
    assert figures == {"acc": 0.5} and parts == {"acc": ([1.0, 0.0], [1.0, 1.0])}
    assert PER_SAMPLE in quality  # the caller's dict is not changed
    assert split_quality({"acc": 0.5}) == ({"acc": 0.5}, {})
