import numpy as np
import pytest
import torch

from data_pipeline import CorpusConfig, MQARConfig, TokenizerConfig, TokenLoader, prepare

SEQ, BATCH = 64, 8


@pytest.fixture(scope="module")
def path(small_stdlib):
    return small_stdlib[0].path


def _stream(path: str, split: str) -> np.ndarray:
    """The split's token stream read independently of TokenLoader."""
    import os

    import pyarrow as pa

    from data_pipeline.storage import read_manifest

    parts = []
    for s in read_manifest(path)["splits"][split]["shards"]:
        t = pa.ipc.open_file(pa.memory_map(os.path.join(path, s["file"]))).read_all()
        parts += [np.asarray(r) for r in t.column("ids").to_pylist()]
    return np.concatenate(parts).astype(np.int64)


def test_batches_are_windows_of_the_stream(path):
    loader = TokenLoader(path, "train", SEQ, BATCH, seed=0)
    stream = _stream(path, "train")
    assert loader.num_tokens == len(stream) and loader.num_windows == (len(stream) - 1) // SEQ
    batch = loader.batch(5)
    assert batch.dtype == torch.int64 and batch.shape == (BATCH, SEQ + 1)
    for w, row in zip(loader.window_indices(5), batch):
        assert torch.equal(row, torch.from_numpy(stream[w * SEQ : w * SEQ + SEQ + 1]))
    x, y = loader.xy(5)
    assert torch.equal(x, batch[:, :-1]) and torch.equal(y, batch[:, 1:])


def test_same_seed_same_batches_other_seed_different(path):
    a = TokenLoader(path, "train", SEQ, BATCH, seed=0)
    b = TokenLoader(path, "train", SEQ, BATCH, seed=0)
    c = TokenLoader(path, "train", SEQ, BATCH, seed=1)
    for step in (0, 1, 17):
        assert torch.equal(a.batch(step), b.batch(step))
    assert not torch.equal(a.batch(0), c.batch(0))


def test_restart_at_step_k_continues_exactly(path):
    original = TokenLoader(path, "train", SEQ, BATCH, seed=3)
    seen = [original.batch(s) for s in range(12)]
    resumed = TokenLoader(path, "train", SEQ, BATCH, seed=3)  # fresh object, as after a restart
    for k in (7, 11):
        assert torch.equal(resumed.batch(k), seen[k])


@pytest.mark.parametrize("world_size", [2, 4, 8])
def test_rank_slices_concatenate_to_the_global_batch_and_never_overlap(path, world_size):
    loader = TokenLoader(path, "train", SEQ, BATCH, seed=0)
    for step in (0, 3):
        slices = [loader.window_indices(step, r, world_size) for r in range(world_size)]
        assert len(set(np.concatenate(slices).tolist())) == BATCH  # no window shared between ranks
        got = torch.cat([loader.batch(step, r, world_size) for r in range(world_size)])
        assert torch.equal(got, loader.batch(step))
    with pytest.raises(ValueError, match="divide"):
        loader.batch(0, 0, 3)


def test_each_epoch_visits_every_window_once_in_a_new_order(path):
    loader = TokenLoader(path, "val", 16, 4, seed=0)
    n = loader.num_windows
    steps = -(-2 * n // 4) + 1
    order = np.concatenate([loader.window_indices(s) for s in range(steps)])
    first, second = order[:n], order[n : 2 * n]
    assert sorted(first) == list(range(n)) and sorted(second) == list(range(n))
    assert not np.array_equal(first, second)


def test_eval_batches_fixed_subset_independent_of_seed(path):
    a = TokenLoader(path, "val", SEQ, BATCH, seed=0)
    b = TokenLoader(path, "val", SEQ, BATCH, seed=9)
    ea = list(a.eval_batches(max_windows=10, batch_size=4))
    assert [t.shape[0] for t in ea] == [4, 4, 2] and all(t.shape[1] == SEQ + 1 for t in ea)
    assert all(torch.equal(u, v) for u, v in zip(ea, b.eval_batches(10, 4)))
    xs = list(a.eval_xy(10, 4))
    assert all(torch.equal(x, t[:, :-1]) and torch.equal(y, t[:, 1:]) for (x, y), t in zip(xs, ea))
    everything = torch.cat(list(a.eval_batches(10**6, 64)))
    assert everything.shape[0] == a.num_windows


def test_windows_cross_shard_boundaries(tmp_path, monkeypatch):
    import data_pipeline.build as build

    monkeypatch.setattr(build, "CHUNK_CHARS", 20_000)
    prep = prepare(CorpusConfig(max_documents=20), TokenizerConfig(vocab_size=600), tmp_path, num_proc=1, progress=False)
    assert len(prep.manifest["splits"]["train"]["shards"]) > 3
    loader = TokenLoader(prep.path, "train", 200, 16, seed=0)
    stream = _stream(prep.path, "train")
    for step in range(loader.num_windows // 16):
        for w, row in zip(loader.window_indices(step), loader.batch(step)):
            assert np.array_equal(row.numpy(), stream[w * 200 : w * 200 + 201])


def test_mqar_labels_only_on_values(tmp_path):
    corpus = CorpusConfig(source="mqar", mqar=MQARConfig(preset="easy", num_train_examples=200, num_val_examples=20))
    prep = prepare(corpus, TokenizerConfig(), tmp_path, progress=False)
    assert prep.vocab_size == 256 and prep.tokenizer_path == ""
    loader = TokenLoader(prep.path, "train", 64, 16, seed=0)
    assert loader.num_windows == 200
    x, y = loader.xy(2)
    assert x.shape == y.shape == (16, 64)
    d = 4
    for xi, yi in zip(x, y):
        pairs = dict(zip(xi[0 : 2 * d : 2].tolist(), xi[1 : 2 * d : 2].tolist()))
        labelled = (yi != -100).nonzero().flatten().tolist()
        assert len(labelled) == d and min(labelled) >= 2 * d
        for t in labelled:  # the label at t is the value bound to the key x[t]
            assert yi[t].item() == pairs[xi[t].item()] and yi[t] >= 128
    with pytest.raises(Exception, match="seq_len must be 64"):
        TokenLoader(prep.path, "train", 128, 16, seed=0)
    val = TokenLoader(prep.path, "val", 64, 4, seed=0)
    assert not torch.equal(val.batch(0), loader.batch(0)[:4])


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 13, 64, 100, 257])
def test_eval_order_is_a_permutation_whose_prefixes_are_spread(n):
    from data_pipeline.loader import _van_der_corput_order

    order = _van_der_corput_order(n)
    assert sorted(order.tolist()) == list(range(n))
    j = 0
    while 1 << j <= n:  # a prefix of 2^j windows is exactly the grid floor(i * n / 2^j)
        assert sorted(order[: 1 << j].tolist()) == [i * n // (1 << j) for i in range(1 << j)]
        j += 1
    for m in range(1, n + 1):
        edges = np.concatenate([np.sort(order[:m]), [n]])
        assert np.diff(edges).max() <= 2 * n / m + 1


def test_eval_windows_fixed_nested_and_seed_independent(path):
    a = TokenLoader(path, "val", 16, 4, seed=0)
    b = TokenLoader(path, "val", 16, 4, seed=7)
    n = a.num_windows
    assert n > 40
    assert np.array_equal(a.eval_windows(20), b.eval_windows(20))
    assert np.array_equal(a.eval_windows(40)[:20], a.eval_windows(20))  # final pass contains the curve's
    assert sorted(a.eval_windows().tolist()) == list(range(n)) and len(a.eval_windows(10**6)) == n
    with pytest.raises(ValueError, match="max_windows"):
        a.eval_windows(0)


def _shards(loader, m, world, start=0):
    return [loader.eval_shard(m, r, world, start) for r in range(world)]


@pytest.mark.parametrize("m", [None, 7, 10])
def test_eval_shards_union_is_one_set_for_world_sizes_1_2_3(path, m):
    loader = TokenLoader(path, "val", 16, 4, seed=0)
    want = loader.eval_windows(m)
    x1, y1 = zip(*loader.eval_xy(m, 4))
    ref = {"tokens": int((torch.cat(y1) != -100).sum()), "sum": int(torch.cat(y1).clamp(min=0).sum())}
    for world in (1, 2, 3):
        shards = _shards(loader, m, world)
        assert len({len(s) for s in shards}) == 1  # equal work per rank (ZeRO-3 forwards are collective)
        real = np.concatenate([s[s >= 0] for s in shards])
        assert len(real) == len(want) and set(real.tolist()) == set(want.tolist())  # disjoint, same union
        got = {"tokens": 0, "sum": 0}
        per_rank = [list(loader.eval_xy(m, 3, r, world)) for r in range(world)]
        assert len({tuple(tuple(x.shape) for x, _ in batches) for batches in per_rank}) == 1
        for r, batches in enumerate(per_rank):
            y = torch.cat([b[1] for b in batches])
            assert torch.all(y[torch.from_numpy(shards[r] < 0)] == -100)  # padding rows are unscored
            got["tokens"] += int((y != -100).sum())
            got["sum"] += int(y.clamp(min=0).sum())
        assert got == ref  # a summed metric over the ranks does not depend on the world size


@pytest.mark.parametrize("world", [1, 2, 3])
def test_final_pass_adds_windows_after_the_curve_subset(path, world):
    loader = TokenLoader(path, "val", 16, 4, seed=0)
    curve = np.concatenate(_shards(loader, 10, world))
    extra = np.concatenate(_shards(loader, 25, world, start=10))
    curve, extra = curve[curve >= 0], extra[extra >= 0]
    assert set(curve.tolist()) == set(loader.eval_windows(10).tolist())
    assert not set(curve.tolist()) & set(extra.tolist())
    assert set(curve.tolist()) | set(extra.tolist()) == set(loader.eval_windows(25).tolist())
    assert all(len(s) == 0 for s in _shards(loader, 10, world, start=10))  # nothing left: no batches
