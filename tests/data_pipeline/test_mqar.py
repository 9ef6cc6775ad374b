"""The MQAR generator against Zoology's layout (HazyResearch/zoology zoology/data/multiquery_ar.py)."""

import subprocess
import sys

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from data_pipeline import CorpusConfig, DataError, MQARConfig, TokenizerConfig, TokenLoader, prepare
from data_pipeline.mqar import IGNORE_INDEX, generate


def _gen(n=2000, vocab=64, seq=64, d=15, power_a=0.01, seed=0):
    return generate(n, vocab, seq, d, power_a, np.random.default_rng(seed))


def test_keys_and_values_are_distinct_within_each_example():
    # 15 values from 32: drawn with replacement, almost every example would repeat one.
    ids, _ = _gen()
    d, half = 15, 32
    keys, values = ids[:, 0 : 2 * d : 2], ids[:, 1 : 2 * d : 2]
    assert keys.min() >= 1 and keys.max() < half and values.min() >= half and values.max() < 64
    assert all(len(set(row)) == d for row in keys.tolist())
    assert all(len(set(row)) == d for row in values.tolist())
    assert len({tuple(r) for r in values.tolist()}) > 1900  # and random across examples


def test_labels_exactly_at_the_query_keys():
    ids, labels = _gen()
    d = 15
    x, y = ids[:, :-1], labels[:, 1:]
    for xi, yi, row in zip(x, y, ids):
        pairs = dict(zip(row[0 : 2 * d : 2].tolist(), row[1 : 2 * d : 2].tolist()))
        at = np.flatnonzero(yi != IGNORE_INDEX)
        assert len(at) == d and at.min() >= 2 * d and np.all((at - 2 * d) % 2 == 0)
        assert sorted(xi[at].tolist()) == sorted(pairs)  # each key queried once, at a labelled position
        assert all(yi[t] == pairs[xi[t]] for t in at)  # the label there is the key's value
        assert np.all(yi[yi != IGNORE_INDEX] >= 32)
    assert np.all(labels[:, 0] == IGNORE_INDEX)  # the first token is never a target


def test_input_after_a_query_key_is_filler_not_the_value():
    ids, labels = _gen()
    rows, cols = np.nonzero(labels != IGNORE_INDEX)  # cols = position after each query key
    # Zoology: the value is only the label; the input there is uniform filler (p = 1/64 to match).
    assert np.mean(ids[rows, cols] == labels[rows, cols]) < 0.05
    filler = np.ones(ids.shape, dtype=bool)
    filler[:, : 2 * 15] = False
    filler[rows, cols - 1] = False  # the query keys
    f = ids[filler]
    counts = np.bincount(f, minlength=64)
    assert len(counts) == 64 and counts.min() > 0.8 * len(f) / 64 and counts.max() < 1.2 * len(f) / 64


def test_query_slots_follow_the_power_law_with_pair_i_at_the_ith_draw():
    n, seq, d, power_a = 6000, 64, 4, 0.01
    ids, labels = generate(n, 256, seq, d, power_a, np.random.default_rng(1))
    rows, cols = np.nonzero(labels != IGNORE_INDEX)
    key_at = cols - 1
    first_key = ids[:, 0]
    slot_of_first = ((key_at - 2 * d) // 2)[ids[rows, key_at] == first_key[rows]]
    space = (seq - 2 * d) // 2
    p = np.arange(1, space + 1, dtype=float) ** (power_a - 1)
    p /= p.sum()
    # The first pair gets the first draw, whose law is p itself (a random pair order gives 0.18 at slot 0 here).
    freq = np.bincount(slot_of_first, minlength=space)[:3] / n
    assert np.allclose(freq, p[:3], atol=0.02), (freq, p[:3])


def test_same_rng_same_examples():
    a, b, c = _gen(n=50, seed=3), _gen(n=50, seed=3), _gen(n=50, seed=4)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and not np.array_equal(a[0], c[0])


def test_bad_parameters_raise_data_error_naming_the_field_under_python_O():
    code = """
import numpy as np
from data_pipeline.mqar import generate
for args in [(10, 256, 12, 4, 0.01), (10, 16, 64, 8, 0.01), (10, 256, 64, 0, 0.01),
             (10, 256, 64, 4, 0.0), (10, 256, 64, 4, float("nan")), (0, 256, 64, 4, 0.01)]:
    try:
        generate(*args, np.random.default_rng(0))
        print("accepted", args)
    except Exception as e:
        print(type(e).__name__, str(e))
"""
    out = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout.splitlines()
    expected = ["seq_len=12", "num_kv_pairs=8 needs vocab_size >= 18", "num_kv_pairs=0", "power_a=0.0", "power_a=nan", "num_train_examples"]
    assert len(out) == len(expected)
    for line, field in zip(out, expected):
        assert line.startswith("DataError mqar:") and field in line, line


def test_config_applies_the_generator_checks():
    with pytest.raises(ValidationError, match="seq_len=15"):
        MQARConfig(seq_len=15, num_kv_pairs=4)  # 4 pairs need 16: Zoology's 4 * D <= seq_len
    assert MQARConfig(seq_len=16, num_kv_pairs=4).resolved()["seq_len"] == 16


def test_prepared_examples_reach_the_loader_unchanged(tmp_path):
    cfg = MQARConfig(preset="easy", num_train_examples=64, num_val_examples=10)
    prep = prepare(CorpusConfig(source="mqar", mqar=cfg, seed=5), TokenizerConfig(), tmp_path, progress=False)
    ids, labels = generate(10, 256, 64, 4, 0.01, np.random.default_rng([5, 1]))  # the val split's rng
    val = TokenLoader(prep.path, "val", 64, 2, seed=0)
    assert val.labelled and val.num_windows == 10
    x, y = next(val.eval_xy(None, 10))
    order = val.eval_windows()
    assert torch.equal(x, torch.from_numpy(ids[order, :-1])) and torch.equal(y, torch.from_numpy(labels[order, 1:]))
    assert int((y != IGNORE_INDEX).sum()) == 10 * 4


def test_generator_version_is_part_of_the_content_hash(monkeypatch):
    import data_pipeline.mqar as mqar
    from data_pipeline.build import content_hash
    from data_pipeline.sources import fingerprint

    corpus = CorpusConfig(source="mqar")
    before = content_hash(corpus, TokenizerConfig(), fingerprint(corpus))
    monkeypatch.setattr(mqar, "GENERATOR_VERSION", mqar.GENERATOR_VERSION + 1)
    assert content_hash(corpus, TokenizerConfig(), fingerprint(corpus)) != before


def test_directory_from_the_old_generator_is_refused(tmp_path):
    import os

    import pyarrow as pa

    cfg = MQARConfig(preset="easy", num_train_examples=8, num_val_examples=4)
    prep = prepare(CorpusConfig(source="mqar", mqar=cfg), TokenizerConfig(), tmp_path, progress=False)
    shard = os.path.join(prep.path, "val-00000.arrow")
    table = pa.ipc.open_file(pa.memory_map(shard)).read_all()
    old = table.drop_columns(["labels"]).append_column("target_mask", table.column("labels"))
    with pa.OSFile(shard + ".tmp", "wb") as sink, pa.ipc.new_file(sink, old.schema) as w:
        w.write_table(old)
    os.replace(shard + ".tmp", shard)  # the old file stays mapped by `table` until then
    with pytest.raises(DataError, match="no 'labels' column"):
        TokenLoader(prep.path, "val", 64, 2, seed=0)
