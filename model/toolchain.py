"""Whether `torch.compile` can build kernels in this process, and why not.

Inductor writes C++ (CPU kernels) or Triton (CUDA kernels) and builds them on first use; on
CUDA, Triton also builds its kernel launcher, a C extension, with the host C compiler against
``Python.h``. An image's runtime stage without a compiler or the Python headers imports torch
and Triton fine and fails at the first compiled call, inside training. Asking first lets the QK
transform's "auto" fall back to eager (logged), and a run that asked for ``resources.compile``
fail at start-up with the reason, not on every retry.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import sysconfig
from pathlib import Path

__all__ = ["compile_unavailable"]

# The compiler each backend builds with: Triton's launcher (CUDA) a C compiler ($CC, else these),
# inductor's CPU kernels a C++ one ($CXX, else these).
COMPILERS = {"cuda": ("CC", ("cc", "gcc", "clang")), "cpu": ("CXX", ("g++", "c++", "clang++"))}


def _compiler(device_type: str, path: str, chosen: str) -> tuple[str | None, str]:
    """(the compiler's path or None, what was looked for) for ``device_type``'s builds;
    ``chosen``: the value of its variable ($CC or $CXX), "" when unset."""
    var, names = COMPILERS["cuda" if device_type == "cuda" else "cpu"]
    if chosen:
        return shutil.which(chosen, path=path), f"${var}={chosen!r}"
    return next((found for name in names if (found := shutil.which(name, path=path))), None), " / ".join(names) + " on PATH"


def compile_unavailable(device_type: str) -> str | None:
    """Why `torch.compile` cannot build kernels for ``device_type`` ("cpu", "cuda", ...) in this
    process, as one sentence; None when it can. Checks what a build needs: on CUDA an importable
    Triton and a C compiler ($CC, or cc / gcc / clang on PATH), elsewhere a C++ compiler ($CXX,
    or g++ / c++ / clang++), and ``Python.h`` in this interpreter's include directory. Answered
    once per device type, PATH, $CC and $CXX (every forward asks)."""
    env = os.environ
    return _unavailable(device_type, env.get("PATH", ""), env.get("CC", ""), env.get("CXX", ""))


@functools.lru_cache(maxsize=16)
def _unavailable(device_type: str, path: str, cc: str, cxx: str) -> str | None:
    missing = []
    if device_type == "cuda" and not _has_triton():
        missing.append("Triton (not importable)")
    found, looked_for = _compiler(device_type, path, cc if device_type == "cuda" else cxx)
    if found is None:
        missing.append(f"a {'C' if device_type == 'cuda' else 'C++'} compiler ({looked_for}: not found)")
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").is_file():
        missing.append(f"Python.h (not in {include})")
    if not missing:
        return None
    return f"torch.compile on {device_type} needs " + ", ".join(missing)


@functools.cache
def _has_triton() -> bool:
    return importlib.util.find_spec("triton") is not None
