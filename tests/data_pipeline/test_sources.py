"""Each source prepares end to end from tiny fixtures written into tmp_path."""

import json
import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_pipeline import CorpusConfig, MixtureComponent, TokenizerConfig, TokenLoader, prepare
from data_pipeline.sources import Document, iter_documents, load_documents
from data_pipeline.tokenizer import load_tokenizer
from tests.helpers import REPO, write_words_corpus

TOK = TokenizerConfig(vocab_size=400, byte_fallback=True)
WORDS = (
    "the river valley holds ancient stone bridges built by farmers who crossed water each "
    "spring while merchants traded grain salt wool and iron along roads"
).split()


def _paragraphs(n: int, seed: int, words_per: int = 60) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, words_per)) + "." for _ in range(n)]


def _wikitext_rows(titles: list[str], seed: int) -> list[str]:
    """The HF WikiText-103 layout: one line per row, '' rows, ' = Title = ' starts an article."""
    rows = [""]
    for i, title in enumerate(titles):
        rows += [f" = {title} = \n", "", " = = History = = \n", ""]
        rows += [p + " \n" for p in _paragraphs(4, seed + i)]
        rows += [""]
    return rows


def _decoded_documents(prep) -> list[str]:
    sp = load_tokenizer(prep.tokenizer_path)
    out = []
    for split in ("train", "val"):
        for s in prep.manifest["splits"][split]["shards"]:
            table = pa.ipc.open_file(pa.memory_map(os.path.join(prep.path, s["file"]))).read_all()
            out += [sp.decode(r[:-1]) for r in table.column("ids").to_pylist()]
    return out


def test_parquet_with_wikitext103_layout_end_to_end(tmp_path):
    data = tmp_path / "wikitext-103-raw-v1"
    data.mkdir()
    titles = [f"Article {chr(65 + i)}" for i in range(12)]
    pq.write_table(pa.table({"text": _wikitext_rows(titles, 0)}), data / "train-00000-of-00001.parquet")
    pq.write_table(pa.table({"text": _wikitext_rows(["Held Out", "Another"], 100)}), data / "validation-00000-of-00001.parquet")
    corpus = CorpusConfig(
        source="parquet",
        paths=[str(data / "train-*.parquet")],
        val_paths=[str(data / "validation-*.parquet")],
        document_boundary="wikitext_heading",
    )
    prep = prepare(corpus, TOK, tmp_path / "cache", num_proc=1, progress=False)
    m = prep.manifest
    assert (m["splits"]["train"]["documents"], m["splits"]["val"]["documents"]) == (12, 2)
    assert set(m["source_hashes"]) == {"train-00000-of-00001.parquet", "val:validation-00000-of-00001.parquet"}
    docs = _decoded_documents(prep)
    assert docs[0].startswith(" = Article A = \n") and " = = History = = \n" in docs[0]
    assert docs[12].startswith(" = Held Out = \n")
    loader = TokenLoader(prep.path, "val", seq_len=16, global_batch=2, seed=0)
    assert loader.num_tokens == m["splits"]["val"]["tokens"]


def test_parquet_row_documents(tmp_path):
    texts = _paragraphs(20, 1)
    pq.write_table(pa.table({"id": list(range(20)), "abstract": texts}), tmp_path / "pubmed.parquet")
    corpus = CorpusConfig(source="parquet", paths=[str(tmp_path / "pubmed.parquet")], text_column="abstract")
    docs = load_documents(corpus)
    assert [d.text for d in docs] == texts and docs[3].id == "pubmed.parquet#3"


def test_text_files_and_blank_line_documents(tmp_path):
    root = tmp_path / "docs"
    (root / "sub").mkdir(parents=True)
    paras = _paragraphs(6, 2)
    (root / "a.txt").write_text("\n\n".join(paras[:3]))
    (root / "sub" / "b.txt").write_text("\n  \n".join(paras[3:]))
    (root / ".hidden").write_text("ignored")
    per_file = load_documents(CorpusConfig(source="text", paths=[str(root)]))
    assert [d.id for d in per_file] == ["a.txt", "sub/b.txt"]
    per_para = load_documents(CorpusConfig(source="text", paths=[str(root)], document_boundary="blank_lines"))
    assert [d.text for d in per_para] == paras
    globbed = load_documents(CorpusConfig(source="text", paths=[str(root / "**" / "*.txt")]))
    assert [d.id for d in globbed] == ["a.txt", "sub/b.txt"]
    prep = prepare(
        CorpusConfig(source="text", paths=[str(root)], document_boundary="blank_lines"), TOK, tmp_path / "cache", num_proc=1, progress=False
    )
    assert sorted(_decoded_documents(prep)) == sorted(paras)


def test_jsonl(tmp_path):
    texts = _paragraphs(15, 3)
    with open(tmp_path / "owt.jsonl", "w") as f:
        for t in texts:
            f.write(json.dumps({"text": t, "url": "x"}) + "\n")
    corpus = CorpusConfig(source="jsonl", paths=[str(tmp_path / "owt.jsonl")], val_fraction=0.2)
    prep = prepare(corpus, TOK, tmp_path / "cache", num_proc=1, progress=False)
    assert sorted(_decoded_documents(prep)) == sorted(texts)
    assert prep.manifest["splits"]["val"]["documents"] >= 1


def test_undecodable_bytes_are_counted_and_replaced(tmp_path):
    good = _paragraphs(8, 4)
    for i, t in enumerate(good):
        (tmp_path / f"{i}.txt").write_text(t)
    (tmp_path / "bad.txt").write_bytes(b"latin-1 caf\xe9 and \xff\xfe broken " + good[0].encode())
    prep = prepare(CorpusConfig(source="text", paths=[str(tmp_path / "*.txt")]), TOK, tmp_path / "cache", num_proc=1, progress=False)
    assert prep.manifest["decode_errors"] == {"documents": 1, "replaced_chars": 3}
    assert any(d.startswith("latin-1 caf\ufffd and \ufffd\ufffd broken") for d in _decoded_documents(prep))


def test_mixture_samples_documents_by_weight(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for i in range(40):
        (tmp_path / "a" / f"{i:02d}.txt").write_text(f"alpha {i} " + _paragraphs(1, i)[0])
        (tmp_path / "b" / f"{i:02d}.txt").write_text(f"beta {i} " + _paragraphs(1, 100 + i)[0])
    corpus = CorpusConfig(
        source="mixture",
        seed=1,
        components=[
            MixtureComponent(corpus=CorpusConfig(source="text", paths=[str(tmp_path / "a")]), weight=3.0),
            MixtureComponent(corpus=CorpusConfig(source="text", paths=[str(tmp_path / "b")]), weight=1.0),
        ],
    )
    docs = load_documents(corpus)
    n_a = sum(d.text.startswith("alpha") for d in docs)
    n_b = sum(d.text.startswith("beta") for d in docs)
    assert (n_a, n_b) == (40, 13)  # a is exhausted first: 40 / 0.75 = 53 documents in all
    assert docs == load_documents(corpus)  # deterministic
    assert [d.id for d in docs] != sorted(d.id for d in docs)  # interleaved, not blocked
    prep = prepare(corpus, TOK, tmp_path / "cache", num_proc=1, progress=False)
    m = prep.manifest
    assert m["splits"]["train"]["documents"] + m["splits"]["val"]["documents"] == 53


def test_stdlib_default_excludes_tests_and_idlelib():
    ids = [d.id for d in load_documents(CorpusConfig(max_documents=10_000))]
    assert ids == sorted(ids) and "os.py" in ids and "json/decoder.py" in ids
    assert not [i for i in ids if i.startswith(("test/", "idlelib/")) or "/tests/" in i or "/test/" in i]
    assert len(load_documents(CorpusConfig(exclude=[]))) > len(ids)


def test_caps_keep_the_first_documents():
    capped = load_documents(CorpusConfig(max_bytes=200_000))
    assert sum(len(d.text.encode()) for d in capped) <= 200_000
    assert [d.id for d in capped] == [d.id for d in load_documents(CorpusConfig(max_documents=len(capped)))]


def test_hf_without_datasets_is_a_clear_error(monkeypatch):
    import sys

    from data_pipeline import DataError

    monkeypatch.setitem(sys.modules, "datasets", None)  # as if the optional extra were absent
    with pytest.raises(DataError, match="source 'hf' \\(wikitext\\).*hf"):
        load_documents(CorpusConfig(source="hf", hf_path="wikitext", hf_name="wikitext-103-raw-v1"))


def test_text_source_from_a_uri(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "one.txt").write_text("first document")
    (tmp_path / "d" / "sub" / "two.txt").write_text("second document")
    docs = load_documents(CorpusConfig(source="text", paths=[f"file://{tmp_path / 'd'}"]))
    assert [(d.id, d.text) for d in docs] == [("one.txt", "first document"), ("sub/two.txt", "second document")]


def _mixture_in_memory(corpus: CorpusConfig) -> list[Document]:
    """The list-based mixture prepare used before it streamed (the oracle): every component's
    documents loaded, picked, permuted."""
    pools = [load_documents(c.corpus) for c in corpus.components]
    w = np.array([c.weight for c in corpus.components], dtype=np.float64)
    w /= w.sum()
    total = min(len(p) / wi for p, wi in zip(pools, w))
    if corpus.max_documents is not None:
        total = min(total, corpus.max_documents)
    rng = np.random.default_rng(corpus.seed)
    picked = []
    for i, (pool, wi) in enumerate(zip(pools, w)):
        n = max(1, min(len(pool), int(round(wi * total))))
        for j in np.sort(rng.choice(len(pool), size=n, replace=False)):
            picked.append(Document(f"{i}:{pool[j].id}", pool[j].text, pool[j].split))
    return [picked[j] for j in rng.permutation(len(picked))]


def _words_mixture(tmp_path, copies: int, **kw) -> CorpusConfig:
    components = []
    for name, weight in (("a", 2.0), ("b", 1.0)):
        for c in range(copies):
            d = tmp_path / name / f"c{c:02d}"
            d.mkdir(parents=True)
            write_words_corpus(d)
        components.append(MixtureComponent(corpus=CorpusConfig(source="text", paths=[str(tmp_path / name)]), weight=weight))
    return CorpusConfig(source="mixture", seed=3, components=components, **kw)


@pytest.mark.parametrize("kw", [{}, {"max_documents": 50}])
def test_streamed_mixture_gives_the_in_memory_mixtures_documents_in_its_order(tmp_path, kw):
    corpus = _words_mixture(tmp_path, 2, **kw)
    streamed = load_documents(corpus)
    assert streamed == _mixture_in_memory(corpus) and len(streamed) == (50 if kw else 240)  # 160 of a, 80 of b: weights 2:1


def _peak_mb(fn) -> float:
    """Peak of Python's own allocations (tracemalloc, MB) while ``fn`` runs."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 1e6
    finally:
        tracemalloc.stop()


def _mixture_peaks(corpus_json: str) -> None:
    """Print the streamed and the in-memory mixture's peaks and the texts' total characters."""
    corpus = CorpusConfig.model_validate_json(corpus_json)
    for _ in iter_documents(corpus):  # warm-up: one-time imports and caches are not the stream's
        pass
    chars: list[int] = []
    streamed = _peak_mb(lambda: chars.extend(len(d.text) for d in iter_documents(corpus)))
    held = _peak_mb(lambda: _mixture_in_memory(corpus))
    print(json.dumps({"streamed": streamed, "held": held, "chars": sum(chars)}))


@pytest.mark.slow  # waits on child processes (CONTRIBUTING.md: test tiers)
def test_iterating_a_mixture_holds_none_of_its_texts(tmp_path):
    """A 5 MB mixture iterated one document at a time: Python's own allocations stay under
    1 MB (ids, offsets and one document); the in-memory mixture, the negative control, holds
    the picked texts (over 3 MB). Measured in a fresh interpreter: tracemalloc traces every
    thread, and a test worker's other threads and earlier tests would be counted too."""
    corpus = _words_mixture(tmp_path, 6)
    code = "import sys; from tests.data_pipeline.test_sources import _mixture_peaks; _mixture_peaks(sys.argv[1])"
    out = subprocess.run([sys.executable, "-c", code, corpus.model_dump_json()], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    m = json.loads(out.stdout.splitlines()[-1])
    assert m["chars"] > 3_000_000  # the picked text is far larger than the bound
    assert m["streamed"] < 1 and m["held"] > 3, m
