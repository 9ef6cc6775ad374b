"""What every benchmark row carries (the machine it ran on) and how a row reaches BENCHMARKS.md."""

from __future__ import annotations

import os
import platform
import tempfile
from pathlib import Path


def machine_description() -> str:
    """CPU model, CPU count, torch build, threads and load average (and the GPU, if any):
    the machine line every benchmark row carries."""
    import torch  # only where a row is made: append_markdown needs none

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    if torch.cuda.is_available():
        cpu += f"; GPU {torch.cuda.get_device_name()}"
    return f"{cpu}, {os.cpu_count()} CPUs, torch {torch.__version__}, {torch.get_num_threads()} threads, load avg {os.getloadavg()[0]:.2f}"


def append_markdown(path: Path, text: str) -> None:
    """Append text to path atomically (temp file in the same folder, then rename)."""
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644  # mkstemp would leave 0600
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(old.rstrip("\n") + "\n\n" + text.rstrip("\n") + "\n")
    os.chmod(tmp, mode)
    os.replace(tmp, path)
