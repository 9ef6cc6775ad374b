"""The unigram baseline (data_pipeline.unigram) on tokens with a known answer, and on prepared data."""

import math

import numpy as np
import pytest

from data_pipeline import CorpusConfig, DataError, MQARConfig, TokenizerConfig, prepare
from data_pipeline.loader import TokenLoader
from data_pipeline.unigram import prepared_unigram, unigram_of, unigram_perplexity


def test_uniform_train_split_gives_the_vocabulary_size():
    v = 97
    train = np.tile(np.arange(v, dtype=np.uint16), 5)  # every id equally often: p = 6 / (5V + V) = 1/V
    val = np.random.default_rng(0).integers(0, v, 1000)
    assert unigram_perplexity(train, val, v) == pytest.approx(v, rel=1e-12)
    assert unigram_perplexity(np.array([], dtype=np.int64), val, v) == pytest.approx(v, rel=1e-12)  # no data: uniform


def test_hand_computed_small_case():
    # V=3, train counts [2, 1, 0] -> add-one [3, 2, 1] / 6 -> p = [1/2, 1/3, 1/6]
    # val [0, 2]: exp(-(ln 1/2 + ln 1/6) / 2) = sqrt(12)
    assert unigram_perplexity(np.array([0, 0, 1]), np.array([[0], [2]]), 3) == pytest.approx(math.sqrt(12.0), rel=1e-12)


def test_large_sample_reaches_the_entropy_and_a_mismatched_val_does_not():
    """Val drawn from the train distribution p: ppl -> exp(H(p)). Negative control: val drawn
    from p with its ids permuted scores exp(cross-entropy), far above exp(H(p))."""
    rng = np.random.default_rng(1)
    v = 64
    p = rng.dirichlet(np.full(v, 0.3))
    train, val = rng.choice(v, 400_000, p=p), rng.choice(v, 200_000, p=p)
    entropy = -(p * np.log(p)).sum()
    assert unigram_perplexity(train, val, v) == pytest.approx(math.exp(entropy), rel=0.01)
    perm = rng.permutation(v)
    q = p[np.argsort(perm)]  # distribution of perm[val]
    smoothed = (np.bincount(train, minlength=v) + 1) / (train.size + v)
    cross = -(q * np.log(smoothed)).sum()
    mismatched = unigram_perplexity(train, perm[val], v)
    assert mismatched == pytest.approx(math.exp(cross), rel=0.02) and mismatched > 2 * math.exp(entropy)


@pytest.mark.parametrize(
    "train,val,v,match",
    [
        (np.array([0, 5]), np.array([1]), 5, r"train token ids span \[0, 5\], outside the vocabulary \[0, 5\)"),
        (np.array([0]), np.array([-1]), 5, "val token ids span"),
        (np.array([0]), np.array([], dtype=np.int64), 5, "no token to score"),
        (np.array([0.0]), np.array([1]), 5, "must be integer ids"),
        (np.array([0]), np.array([0]), 0, "vocab_size must be >= 1"),
    ],
)
def test_bad_input_is_named(train, val, v, match):
    with pytest.raises(DataError, match=match):
        unigram_perplexity(train, val, v)


def test_prepare_stores_it_in_the_manifest(small_stdlib):
    prep = small_stdlib[0]
    u = prep.manifest["unigram"]
    train = TokenLoader(prep.path, "train", 64, 1, seed=0)
    val = TokenLoader(prep.path, "val", 64, 1, seed=0)
    tokens = {s: np.concatenate(loader._parts) for s, loader in (("train", train), ("val", val))}
    assert u["val_tokens"] == prep.manifest["splits"]["val"]["tokens"] == tokens["val"].size
    assert u["train_tokens"] == prep.manifest["splits"]["train"]["tokens"]
    assert u["val_ppl"] == pytest.approx(unigram_perplexity(tokens["train"], tokens["val"], 512), rel=1e-12)
    assert 20 < u["val_ppl"] < 512  # code is far from uniform over 512 pieces
    old = {k: v for k, v in prep.manifest.items() if k != "unigram"}  # prepared before the key existed
    assert unigram_of(prep.path, old) == u == unigram_of(prep.path, prep.manifest)


def test_mqar_scores_only_the_labelled_positions(tmp_path):
    cfg = MQARConfig(preset="easy", num_train_examples=64, num_val_examples=10)
    prep = prepare(CorpusConfig(source="mqar", mqar=cfg, seed=5), TokenizerConfig(), tmp_path, progress=False)
    u = prep.manifest["unigram"]
    assert (u["val_tokens"], u["train_tokens"], u["vocab_size"]) == (10 * 4, 64 * 4, 256)
    assert u == prepared_unigram(prep.path, prep.manifest)
    assert 1.0 < u["val_ppl"] < 256
