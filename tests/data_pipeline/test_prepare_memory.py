"""Prepare's memory does not grow with the corpus: a 160 MB corpus is prepared (two tokenizer
processes): the driving process's peak RSS grows by less than CAP_MB, a cap below the
corpus's size, and no tokenizer process peaks above CHILD_CAP_MB (absolute, its imports
included: each holds at most one ~1 MiB chunk, and its allocator settles near 200 MB whatever
the corpus, 192 MB at 1 GB in BENCHMARKS.md). Holding the same corpus as a list of documents,
what prepare did before it streamed, grows the same measurement past the corpus's size: the
negative control that shows it sees a held corpus."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.slow

CORPUS_MB = 160
CAP_MB = 150  # below the corpus: a prepare that held it could not pass
CHILD_CAP_MB = 250

MEASURE = """
import json, resource, sys
from data_pipeline import CorpusConfig, TokenizerConfig, prepare
from data_pipeline.sources import load_documents

def hwm_mb():  # peak resident set so far
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024

mode, root, cache = sys.argv[1:]
corpus = CorpusConfig(source="text", paths=[root])
before = hwm_mb()
if mode == "prepare":
    prep = prepare(corpus, TokenizerConfig(vocab_size=2048, max_sentences=20_000), cache, num_proc=2, progress=False)
    tokens = prep.manifest["splits"]["train"]["tokens"]
else:
    docs = load_documents(corpus)
    tokens = len(docs)
child_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # the largest child's peak
print(json.dumps({"growth_mb": hwm_mb() - before, "child_peak_mb": child_mb, "tokens": tokens}))
"""


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    """CORPUS_MB of seeded random-word text in 96 files (each ~0.5 MB: several shards' worth)."""
    root = tmp_path_factory.mktemp("big")
    rng = np.random.default_rng(11)
    words = np.array(["".join(chr(97 + c) for c in rng.integers(0, 26, rng.integers(2, 9))) for _ in range(3000)])
    per_file = CORPUS_MB * 2**20 // 96
    for i in range(96):
        line_words = rng.integers(3, 12, per_file // 45)  # ~45 bytes a line
        flat = words[rng.integers(0, len(words), int(line_words.sum()))]
        lines = np.split(flat, np.cumsum(line_words)[:-1])
        (root / f"f{i:03d}.txt").write_text("\n".join(" ".join(ws) for ws in lines) + "\n")
    return root


def _measure(mode: str, root, cache) -> dict:
    out = subprocess.run([sys.executable, "-c", MEASURE, mode, str(root), str(cache)], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_prepare_peak_memory_stays_far_below_the_corpus(corpus_dir, tmp_path):
    size_mb = sum(f.stat().st_size for f in corpus_dir.iterdir()) / 2**20
    assert size_mb > CAP_MB
    res = _measure("prepare", corpus_dir, tmp_path / "cache")
    assert res["tokens"] > 10_000_000
    assert res["growth_mb"] < CAP_MB and res["child_peak_mb"] < CHILD_CAP_MB, res


def test_holding_the_corpus_shows_in_the_same_measurement(corpus_dir, tmp_path):
    size_mb = sum(f.stat().st_size for f in corpus_dir.iterdir()) / 2**20
    res = _measure("hold", corpus_dir, tmp_path / "cache")
    assert res["growth_mb"] > size_mb, res
