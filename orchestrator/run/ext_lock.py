"""Torch-extension build locks: prebuild the ops the product JIT-compiles, and clear a lock that
a killed build left behind (it would make every later run on the machine wait forever).

Which op: on CPU, DeepSpeed's communication backend (``deepspeed.comm.torch.TorchBackend``)
builds ``deepspeed_shm_comm`` (``ShareMemCommBuilder``, shared-memory collectives for ranks on
one machine) on its first ``deepspeed.initialize``, under
``~/.cache/torch_extensions/py311_cpu/deepspeed_shm_comm/`` (``$TORCH_EXTENSIONS_DIR/<op>``
when set). Nothing else compiles: the product's optimizer is ``torch.optim.AdamW``, not a
DeepSpeed fused or CPU Adam, and on CUDA the accelerator has no shm builder.
``python -m orchestrator.run.ext_lock --prebuild`` builds it once at install / image time.

The lock: torch's ``cpp_extension.load`` takes ``<build dir>/lock`` with ``torch.utils.
file_baton.FileBaton`` (``O_CREAT | O_EXCL``, fd kept open during the build, file removed when
done); everyone else polls until the file is gone, with no timeout and no owner recorded. The
staleness rule here, since the file names no pid: a lock is stale when

1. it is older than ``min_age_s`` (default 5 s), and
2. no live process on this machine has it open (every ``/proc/<pid>/fd``; the builder holds its
   fd for the whole build), and no live process has the build dir (or a folder below it) as its
   cwd (a ninja or compiler a killed builder left running), and
3. the same file (same inode) is still there and still unheld after ``recheck_s`` (a lock
   between a finishing builder's ``close`` and its ``remove`` is gone by then).

The builder: torch runs ``ninja`` from ``PATH``, and ninja 1.13 records each command in the
build dir's ``.ninja_log`` under another hash than 1.11 does (``ninja -d explain``: "command
line changed", either way round), so a process that finds the
system's ninja (Debian's 1.11) and one that finds this environment's (the ``ninja`` wheel
DeepSpeed depends on; its ``bin`` is first on PATH in an activated venv or a Ray node started
from it) each take the other's build for a changed command and rebuild the op: about a
minute of compiling, with every other run on the machine waiting on the lock. ``pin_ninja``
puts the environment's own ninja first, in the prebuild and in every training worker.

Limits: only this machine's processes are visible, so a cache shared between machines (an NFS
home) must not be swept: point ``TORCH_EXTENSIONS_DIR`` at a local folder there, or prebuild.
Processes whose ``/proc`` entries cannot be read (other users) are not seen; the cache is
per-user. Without ``/proc`` (not Linux) nothing is ever removed.
"""

from __future__ import annotations

import argparse
import os
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from pathlib import Path

LOCK_NAME = "lock"
MIN_AGE_S = 5.0
RECHECK_S = 0.5
# DeepSpeed op builders (accelerator class names) the product's runs JIT-build, with why.
PRODUCT_OPS = {"ShareMemCommBuilder": "shared-memory collectives of DeepSpeed's CPU comm backend"}


def pin_ninja(environ: MutableMapping[str, str] | None = None) -> Path | None:
    """Put this Python environment's scripts folder first on ``PATH`` (of ``environ``, default
    ``os.environ``) when it holds a ``ninja``, so every op build and up-to-date check of the
    environment runs the same ninja (the module docstring says why). Idempotent; the folder
    leaves its later place on PATH. Returns the folder, or None (PATH untouched) when the
    environment has no ninja of its own."""
    env = os.environ if environ is None else environ
    scripts = Path(sysconfig.get_path("scripts"))
    if not os.access(scripts / "ninja", os.X_OK):
        return None
    rest = [p for p in env.get("PATH", "").split(os.pathsep) if p and Path(p) != scripts]
    env["PATH"] = os.pathsep.join([str(scripts), *rest])
    return scripts


def extension_roots() -> list[Path]:
    """Folders torch builds extensions under: ``$TORCH_EXTENSIONS_DIR`` (ops directly below),
    else torch's default build root (``~/.cache/torch_extensions``, one ``py*_*`` level)."""
    env = os.environ.get("TORCH_EXTENSIONS_DIR")
    if env:
        return [Path(env)]
    from torch.utils.cpp_extension import get_default_build_root

    return [Path(get_default_build_root())]


def find_locks(roots: list[Path] | None = None) -> list[Path]:
    """Every ``lock`` file one or two levels below the roots (``<op>/lock``, ``<tag>/<op>/lock``)."""
    out: list[Path] = []
    for root in roots if roots is not None else extension_roots():
        out += [p for pattern in (f"*/{LOCK_NAME}", f"*/*/{LOCK_NAME}") for p in root.glob(pattern) if p.is_file()]
    return sorted(set(out))


def _pids() -> list[str]:
    return [d for d in os.listdir("/proc") if d.isdigit()]


def lock_users(lock: Path) -> list[int] | None:
    """Live pids that have ``lock`` open or work inside its folder; None when this machine has
    no ``/proc`` to tell (then nothing may be assumed stale)."""
    if not Path("/proc/self/fd").is_dir():
        return None
    target, folder = os.path.realpath(lock), os.path.realpath(lock.parent)
    users = []
    for pid in _pids():
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
            if cwd == folder or cwd.startswith(folder + os.sep):
                users.append(int(pid))
                continue
            fd_dir = f"/proc/{pid}/fd"
            if any(os.readlink(os.path.join(fd_dir, fd)) == target for fd in os.listdir(fd_dir)):
                users.append(int(pid))
        except OSError:  # exited meanwhile, or not ours to read
            continue
    return users


def _unheld_inode(lock: Path, min_age_s: float) -> int | None:
    """The lock's inode if it is old enough and nobody uses it, else None."""
    try:
        st = lock.stat()
    except FileNotFoundError:
        return None
    if time.time() - st.st_mtime < min_age_s:
        return None
    users = lock_users(lock)
    return st.st_ino if users == [] else None


def clear_stale_lock(lock: Path, min_age_s: float = MIN_AGE_S, recheck_s: float = RECHECK_S) -> str | None:
    """Remove ``lock`` if it is stale (the module's rule); return the message to log, or None
    when it is held, young, gone, or cannot be judged."""
    inode = _unheld_inode(lock, min_age_s)
    if inode is None:
        return None
    time.sleep(recheck_s)
    if _unheld_inode(lock, min_age_s) != inode:
        return None
    age = time.time() - lock.stat().st_mtime
    try:
        lock.unlink()
    except FileNotFoundError:
        return None
    return (
        f"removed stale torch-extension build lock {lock} ({age:.0f} s old, no live process holds it "
        f"or builds in {lock.parent}): a build was killed while holding it"
    )


def clear_stale_locks(roots: list[Path] | None = None, min_age_s: float = MIN_AGE_S, recheck_s: float = RECHECK_S) -> list[str]:
    """``clear_stale_lock`` on every lock under ``roots`` (default ``extension_roots()``);
    returns one message per removed lock."""
    msgs = [clear_stale_lock(p, min_age_s, recheck_s) for p in find_locks(roots)]
    return [m for m in msgs if m]


@contextmanager
def sweeping(log: Callable[[str], None], interval_s: float = 5.0, roots: list[Path] | None = None) -> Iterator[None]:
    """Clear stale locks now and every ``interval_s`` while the block runs (wrap a worker's
    DeepSpeed start-up: a peer killed mid-build is then noticed while this process waits on its
    lock). ``log`` receives each removal message."""
    stop = threading.Event()
    # Resolved here, not in the thread: its first import of torch.utils.cpp_extension, racing
    # DeepSpeed's imports in the caller's thread, deadlocked on the import locks (seen: rank 1 hung).
    roots = extension_roots() if roots is None else roots

    def sweep() -> None:
        while True:
            for msg in clear_stale_locks(roots):
                log(msg)
            if stop.wait(interval_s):
                return

    t = threading.Thread(target=sweep, name="ext-lock-sweeper", daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()


def prebuild(ops: dict[str, str] | None = None, log: Callable[[str], None] = print) -> list[str]:
    """Build (or load, if built) each DeepSpeed op of ``ops`` (default ``PRODUCT_OPS``) that
    this machine's accelerator offers and supports; returns the names built or found.
    Clears stale locks first. Raises RuntimeError (from DeepSpeed) when a build fails."""
    if not _cuda_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # as the worker does
    pin_ninja()  # as the worker does: the build it leaves is the one the worker finds up to date
    for msg in clear_stale_locks():
        log(msg)
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    done = []
    for cls, why in (ops or PRODUCT_OPS).items():
        builder = get_accelerator().create_op_builder(cls)
        if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
            log(f"{cls}: not used on this accelerator ({get_accelerator()._name}); nothing to build")
            continue
        t0 = time.perf_counter()
        builder.load(verbose=False)
        log(f"{builder.NAME} ({why}): ready in {time.perf_counter() - t0:.1f} s")
        done.append(builder.NAME)
    return done


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def main(argv: list[str] | None = None) -> int:
    """``python -m orchestrator.run.ext_lock [--prebuild] [--clear-stale]``; exit 0 on success."""
    ap = argparse.ArgumentParser(prog="python -m orchestrator.run.ext_lock", description=__doc__.split("\n")[0])
    ap.add_argument("--prebuild", action="store_true", help="build the DeepSpeed ops the product JIT-compiles")
    ap.add_argument("--clear-stale", action="store_true", help="remove stale torch-extension build locks")
    args = ap.parse_args(argv)
    if not (args.prebuild or args.clear_stale):
        ap.error("give --prebuild and/or --clear-stale")
    if args.clear_stale and not args.prebuild:
        for msg in clear_stale_locks():
            print(msg)
    if args.prebuild:
        prebuild()
    return 0


if __name__ == "__main__":
    sys.exit(main())
