"""The benchmarks `make bench` runs; each appends a dated section to BENCHMARKS.md.

What they measure, one module each (``python -m benchmarks.<module>``):

- ``model_steps``: optimizer-step time of every attention variant at a preset, paired against
  ``standard``, beside the FLOP ratios (and MFU and step memory on CUDA; scripts/gpu_check.sh);
- ``profile_step``: which operators a variant's extra step time goes to (PyTorch profiler);
- ``prepare``: ``data_pipeline.prepare`` throughput against SentencePiece's single-process encode;
- ``report``: ``qkstudy report`` of a 1,000-run study from a SQLite MLflow store;
- ``training``: validate and plan a 200-run study; ``--training``: cpu-s training through Ray
  Train and DeepSpeed; ``--startup``: what starting a Ray Train worker group costs per run;
- ``cli_latency``: ``qkstudy`` commands, one fresh process each, and the heavy modules they load;
- ``bare_steps``: the stack's optimizer steps against a plain PyTorch loop of the same run.

``record`` holds what every row carries (the machine) and the append. Not part of the installed
product: run from the repository root. Product code never imports this package (tests/test_structure.py).
"""
