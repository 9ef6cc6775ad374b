import pytest
import torch

from model.metrics import token_accuracy


def _logits(argmax: list[list[int]], vocab: int = 5) -> torch.Tensor:
    """[B, T, V] logits whose argmax at (b, t) is argmax[b][t] (a margin of 1 over the rest)."""
    out = torch.zeros(len(argmax), len(argmax[0]), vocab)
    for b, row in enumerate(argmax):
        for t, v in enumerate(row):
            out[b, t, v] = 1.0
    return out


def test_counts_only_labelled_positions():
    logits = _logits([[1, 2, 3, 4], [0, 0, 1, 2]])
    targets = torch.tensor([[1, -100, 0, 4], [0, 3, -100, -100]])
    # labelled: (0,0) hit, (0,2) miss, (0,3) hit, (1,0) hit, (1,1) miss
    correct, count = token_accuracy(logits, targets)
    assert (correct.item(), count.item()) == (3, 5)
    assert correct.dtype == count.dtype == torch.int64 and correct.dim() == 0
    assert [v.item() for v in token_accuracy(logits.bfloat16(), targets)] == [3, 5]  # autocast dtype


def test_ignored_positions_are_not_hits_even_when_the_argmax_matches():
    logits = _logits([[1, 2, 3, 4], [0, 0, 1, 2]])
    targets = torch.tensor([[1, 2, 0, 4], [2, 2, 1, 0]])
    # ignore_index=2: (0,1) predicts 2 == its target but is unlabelled; labelled are (0,0) hit,
    # (0,2) miss, (0,3) hit, (1,2) hit, (1,3) miss. Without the mask correct would be 4.
    correct, count = token_accuracy(logits, targets, ignore_index=2)
    assert (correct.item(), count.item()) == (3, 5)


def test_all_ignored_batch_counts_nothing():
    logits = _logits([[1, 2], [3, 4]])
    correct, count = token_accuracy(logits, torch.full((2, 2), -100))
    assert (correct.item(), count.item()) == (0, 0)


def test_sums_over_batches_equal_the_whole():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 7, 11, generator=g)
    targets = torch.randint(0, 11, (6, 7), generator=g)
    targets[torch.rand(6, 7, generator=g) < 0.5] = -100
    targets[0] = logits[0].argmax(-1)  # at least one fully correct row, so correct > 0
    whole = token_accuracy(logits, targets)
    parts = [token_accuracy(logits[i : i + 2], targets[i : i + 2]) for i in range(0, 6, 2)]
    assert sum(c for c, _ in parts).item() == whole[0].item() >= 7
    assert sum(n for _, n in parts).item() == whole[1].item() == int((targets != -100).sum())
    expected = sum(int(logits[b, t].argmax() == targets[b, t]) for b in range(6) for t in range(7))
    assert whole[0].item() == expected  # -100 never equals an argmax, so the plain count agrees


@pytest.mark.parametrize("shapes", [((2, 3), (2, 3)), ((2, 3, 5), (2, 4)), ((2, 3, 5), (2, 3, 1))])
def test_shape_mismatch_is_an_error(shapes):
    with pytest.raises(ValueError, match=r"\[B, T, V\]"):
        token_accuracy(torch.zeros(shapes[0]), torch.zeros(shapes[1], dtype=torch.int64))
