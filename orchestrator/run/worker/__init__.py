"""What runs inside each Ray Train worker process: the training loop, its optimizer and
schedule, when it evaluates and checkpoints, weights-only checkpoint loads, branch points, the
recorder and the watchdog.
Nothing here imports ``orchestrator.run.driver``."""
