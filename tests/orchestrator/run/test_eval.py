"""The worker's evaluation sums on real MQAR data and a real model (no Ray, no DeepSpeed: the
ranks' shares are added here as the all-reduce adds them): one fixed validation subset for
any worker count, a final pass that adds windows to the curve's, loss weighted by labelled
positions, accuracy on labelled positions only."""

import math

import pytest
import torch
import torch.nn.functional as F

from data_pipeline import CorpusConfig, TokenizerConfig, TokenLoader, prepare
from model import GPT, build_config
from orchestrator.run.evaluate import eval_sums, val_metrics

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    corpus = CorpusConfig.model_validate({"source": "mqar", "mqar": {"preset": "easy", "num_train_examples": 64, "num_val_examples": 37}})
    p = prepare(corpus, TokenizerConfig(), tmp_path_factory.mktemp("cache"), progress=False)
    loader = TokenLoader(p.path, "val", 64, 8, 0)
    model = GPT(build_config("cpu-xs", "standard", vocab_size=256, seq_len=64), seed=0).eval()
    return loader, model


def _sums(loader, model, m, world, start=0, micro=4):
    """eval_sums of every rank's share, added (what the worker's all-reduce does)."""
    total = [0.0, 0.0, 0.0]
    for rank in range(world):
        s = eval_sums(model, loader.eval_xy(m, micro, rank, world, start), CPU, accuracy=True)
        total = [a + b for a, b in zip(total, s)]
    return total


def _close(a, b, rel=1e-6):
    return all(math.isclose(x, y, rel_tol=rel, abs_tol=1e-9) for x, y in zip(a, b))


@pytest.mark.parametrize("m", [7, 13, None])
def test_same_windows_for_any_worker_count(setup, m):
    loader, model = setup
    one = _sums(loader, model, m, 1)
    n = loader.num_windows if m is None else m
    assert one[1] == n * 4  # easy: 4 labelled query keys per example
    for world in (2, 3):
        # odd window counts: no window dropped to even the ranks out (padding rows instead)
        assert _close(_sums(loader, model, m, world), one), (m, world)
    assert not _close(_sums(loader, model, 6, 2), _sums(loader, model, 7, 1))  # negative control: 6 windows differ


def test_all_padding_batches_add_nothing(setup):
    loader, model = setup
    # 4 windows over 3 ranks, 1 per batch: rank 1 and 2 each run one all-padding batch (loss NaN)
    assert _close(_sums(loader, model, 4, 3, micro=1), _sums(loader, model, 4, 1))


@pytest.mark.parametrize("world", [1, 2])
def test_final_pass_is_the_curve_windows_plus_the_added_ones(setup, world):
    loader, model = setup
    curve, added = _sums(loader, model, 7, world), _sums(loader, model, 13, world, start=7)
    assert _close([a + b for a, b in zip(curve, added)], _sums(loader, model, 13, 1))
    assert added[1] == 6 * 4  # only windows 7..12 were added
    rest = _sums(loader, model, None, world, start=7)
    assert _close([a + b for a, b in zip(curve, rest)], _sums(loader, model, None, 1))


def test_loss_is_weighted_by_labelled_positions_and_accuracy_counts_them(setup):
    loader, model = setup
    loss, acc = val_metrics(_sums(loader, model, 7, 2, micro=4), labelled=True)
    ((x, y),) = list(loader.eval_xy(7, 100))  # the 7 windows as one batch
    with torch.no_grad():
        logits, _ = model(x, y)
    flat_y = y.reshape(-1)
    keep = flat_y != -100
    expect = F.cross_entropy(logits.reshape(-1, logits.shape[-1])[keep], flat_y[keep]).item()
    assert loss == pytest.approx(expect, rel=1e-6)
    hits = (logits.argmax(-1) == y) & (y != -100)
    assert acc == pytest.approx(hits.sum().item() / keep.sum().item()) and 0.0 <= acc <= 1.0
    # an untrained model: about chance on the 128 value ids
    assert acc < 0.2


def testval_metrics():
    assert val_metrics([6.0, 4.0, 1.0], labelled=True) == (1.5, 0.25)
    assert val_metrics([6.0, 4.0, 1.0], labelled=False) == (1.5, None)
    loss, acc = val_metrics([0.0, 0.0, 0.0], labelled=True)
    assert math.isnan(loss) and acc is None
