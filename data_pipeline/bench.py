"""`python -m data_pipeline.bench`: prepare throughput vs SentencePiece's single-process encode.

Both numbers come from the same run on the same text (the default stdlib corpus, train + val):
  1. prepare() into a fresh temp cache with all cores: end-to-end (read, split, tokenizer
     training, tokenize, write shards) and its tokenize + write stage alone, in tokens/s;
  2. the tokenizer prepare trained, encoding the same documents in this one process
     (``encode(texts, num_threads=1)``), in tokens/s.
The issue's target: stage throughput >= 1.6x the single-process rate on a 2-core machine.
Appends a section to BENCHMARKS.md (machine, date, command).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import tempfile
import time

from .build import _default_num_proc, prepare, split_documents
from .config import CorpusConfig, TokenizerConfig
from .sources import load_documents
from .tokenizer import load_tokenizer


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def run(out: str = "BENCHMARKS.md", num_proc: int | None = None) -> dict:
    corpus, tokenizer = CorpusConfig(), TokenizerConfig()
    num_proc = num_proc or _default_num_proc()
    with tempfile.TemporaryDirectory() as cache:
        t0 = time.perf_counter()
        prep = prepare(corpus, tokenizer, cache, num_proc=num_proc, progress=False)
        total_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        prepare(corpus, tokenizer, cache, progress=False)
        noop_s = time.perf_counter() - t0
        m = prep.manifest
        tokens = m["splits"]["train"]["tokens"] + m["splits"]["val"]["tokens"]
        docs = m["splits"]["train"]["documents"] + m["splits"]["val"]["documents"]
        train, val = split_documents(load_documents(corpus), corpus.val_fraction, corpus.label())
        texts = [d.text for d in train + val]
        sp = load_tokenizer(prep.tokenizer_path)
        t0 = time.perf_counter()
        ids = sp.encode(texts, num_threads=1)
        single_s = time.perf_counter() - t0
    single_tokens = sum(len(x) for x in ids) + len(ids)  # + one EOD per document, as prepare counts
    assert single_tokens == tokens, (single_tokens, tokens)
    r = {
        "documents": docs, "tokens": tokens, "text_mb": m["text_bytes"] / 1e6, "num_proc": num_proc,
        "prepare_s": total_s, "stage_s": m["timings"]["tokenize_s"], "train_s": m["timings"]["tokenizer_train_s"],
        "single_s": single_s, "noop_s": noop_s,
    }
    r["prepare_tps"] = tokens / total_s
    r["stage_tps"] = tokens / r["stage_s"]
    r["single_tps"] = tokens / single_s
    r["speedup"] = r["stage_tps"] / r["single_tps"]
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    section = f"""
## data_pipeline: prepare throughput (stdlib corpus), {now}

Machine: {platform.node()}, {_cpu_model()}, {os.cpu_count()} CPUs visible, {num_proc} tokenizer processes;
Python {platform.python_version()}. Command: `python -m data_pipeline.bench` (`make bench`).
Corpus: CPython {platform.python_version()} stdlib `*.py` without tests/idlelib: {docs} documents,
{r['text_mb']:.1f} MB, {tokens:,} tokens (BPE, vocab {tokenizer.vocab_size}, incl. one EOD per document).

| measurement | seconds | tokens/s |
|---|---:|---:|
| sentencepiece encode, one process (`num_threads=1`) | {single_s:.2f} | {r['single_tps']:,.0f} |
| prepare: tokenize + write shards stage ({num_proc} processes) | {r['stage_s']:.2f} | {r['stage_tps']:,.0f} |
| prepare end to end (read, split, train tokenizer, tokenize, write) | {total_s:.2f} | {r['prepare_tps']:,.0f} |
| of which tokenizer training | {r['train_s']:.2f} | |
| prepare again (cache hit, no-op) | {noop_s:.3f} | |

Stage speed-up over single-process encode: **{r['speedup']:.2f}x** (target >= 1.6x on 2 cores).
"""
    with open(out, "a") as f:
        f.write(section)
    print(section)
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="BENCHMARKS.md")
    ap.add_argument("--num-proc", type=int, default=None)
    args = ap.parse_args()
    run(args.out, args.num_proc)


if __name__ == "__main__":
    main()
