"""qkstudy data pipeline: real corpora in, exact token streams out.

    prep = prepare(CorpusConfig(), TokenizerConfig())      # CPython stdlib, BPE 4096, cached
    loader = TokenLoader(prep.path, "train", seq_len=256, global_batch=32, seed=0)
    x, y = loader.xy(step, rank, world_size)               # int64 [32 // world_size, 256]

Why it is built this way: every variant of a study must see the same tokens in the same order,
on any number of workers, and a resumed run must continue exactly. So preparation is content-
addressed (same inputs + configs -> same directory, prepared once), and the loader's batch is a
pure function of (seed, step, rank, world_size) with no iterator state to checkpoint.

Exports are resolved lazily (PEP 562) so spawned tokenizer workers do not import torch.
"""

from importlib import import_module

_EXPORTS = {
    "CorpusConfig": "config",
    "TokenizerConfig": "config",
    "MQARConfig": "config",
    "MixtureComponent": "config",
    "DataError": "errors",
    "prepare": "build",
    "PreparedData": "build",
    "TokenLoader": "loader",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return __all__
