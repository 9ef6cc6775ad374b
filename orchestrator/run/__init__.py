"""Running: planned runs trained on a Ray cluster with DeepSpeed ZeRO.

Why it is built this way: a study must survive faults without repeating work, so every run
is idempotent by identity (finished runs are skipped, unfinished ones resume from their Ray
Train checkpoint) and progress lives in MLflow, not in the driver. Ray owns placement and
retries; the worker loop owns the model, the engine and the MLflow writes of rank 0.

The process boundary is the layout: ``driver/`` runs in the study's driver and the Ray tasks it
starts, ``worker/`` inside the Ray Train workers (it never imports ``driver/``), and the modules
here serve both and import neither: the progress board, checkpoints (format and resume),
validation sums, final weights, the handoff of a pack's runs, fault points, torch-extension locks.
"""
