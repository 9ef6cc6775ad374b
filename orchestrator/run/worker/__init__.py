"""What runs inside each Ray Train worker process: the training loop, its optimizer and
schedule, checkpoints and resume, branch points, evaluation, the recorder and the watchdog.
Nothing here imports ``orchestrator.run.driver``."""
