"""Progress watchdog: a run whose start-up, step, eval or checkpoint stops making progress fails
with the stuck section and every thread's stack, instead of idling until an outer timeout.

The loop marks what it is doing with ``with wd.section("step"):``; entering and leaving cost a
``time.monotonic()`` call and a few attribute stores (no syscall, no lock: one tuple assignment
is atomic under the GIL). A daemon thread wakes every ``poll_s`` and, when the open section has
run past its bound, captures ``sys._current_frames()`` of every thread (the stuck one first)
and calls ``on_stall(section, elapsed_s, stack_text)`` once for that entry. The callback runs on
the watchdog thread while the stuck thread is still stuck (often inside a collective, in C,
where no exception can reach it): the worker records the failure in its log and MLflow, then
ends its process (``os._exit(STALL_EXIT_CODE)``) so Ray ends the group and the study goes on.

Bounds [s] (``WatchdogLimits``; ``$QKSTUDY_WATCHDOG`` overrides them, e.g. ``step=5,eval=60``):
start-up covers model build, DeepSpeed initialize (a JIT compile of a CPU op, ~1 min, when not
prebuilt) and checkpoint restore; a step is one optimizer step; eval the validation pass (the
final one is the longest); diag an eval's attention diagnostics (nested in it); checkpoint one
save and its persist to the study's storage. A
nested section is timed on its own; the outer one's clock keeps running underneath it.

``Watchdog.seconds`` keeps each section's total time, exclusive of the sections nested in it
(an eval's checkpoint counts as checkpoint, not eval): the run's time split
(``worker.RunLoop``: ``time/*_s``) comes from the brackets the watchdog needs anyway.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, fields, replace

WATCHDOG_ENV = "QKSTUDY_WATCHDOG"
STALL_EXIT_CODE = 18  # distinct from the fault-injection kill (17)
SECTIONS = ("startup", "step", "eval", "diag", "checkpoint")

# (section, elapsed seconds, every thread's stack)
StallCallback = Callable[[str, float, str], None]


@dataclass(frozen=True)
class WatchdogLimits:
    """Longest time [s] each section may take before the run counts as hung."""

    startup: float = 1800.0
    step: float = 900.0
    eval: float = 1800.0
    diag: float = 1800.0
    checkpoint: float = 1800.0

    def bound(self, section: str) -> float:
        """The bound of ``section``. Raises ValueError for a name outside ``SECTIONS``."""
        if section not in SECTIONS:
            raise ValueError(f"unknown watchdog section {section!r}; allowed: {', '.join(SECTIONS)}")
        return float(getattr(self, section))


def limits_from_env(base: WatchdogLimits | None = None, env: str | None = None) -> WatchdogLimits:
    """``base`` (default ``WatchdogLimits()``) with the bounds ``$QKSTUDY_WATCHDOG`` sets
    (``section=seconds`` pairs, comma separated). Raises ValueError naming a bad pair."""
    text = os.environ.get(WATCHDOG_ENV, "") if env is None else env
    out = base or WatchdogLimits()
    names = {f.name for f in fields(WatchdogLimits)}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = pair.partition("=")
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if key.strip() not in names or seconds <= 0:
            raise ValueError(
                f"{WATCHDOG_ENV}: bad entry {pair!r}; use section=seconds with section in {', '.join(SECTIONS)} and seconds > 0"
            )
        out = replace(out, **{key.strip(): seconds})
    return out


def all_stacks(first: int | None = None) -> str:
    """Every live thread's Python stack as text, thread ``first`` (an ident) on top."""
    names = {t.ident: t.name for t in threading.enumerate()}
    frames = sys._current_frames()
    order = sorted(frames, key=lambda ident: ident != first)
    parts = []
    for ident in order:
        label = names.get(ident, "?")
        parts.append(
            f"Thread {label!r} (ident {ident}){' <- stuck' if ident == first else ''}:\n" + "".join(traceback.format_stack(frames[ident]))
        )
    return "\n".join(parts)


class _Section:
    """Reusable context manager for one section name (no allocation per entry)."""

    __slots__ = ("wd", "name", "bound")

    def __init__(self, wd: Watchdog, name: str, bound: float):
        self.wd, self.name, self.bound = wd, name, bound

    def __enter__(self) -> None:
        wd = self.wd
        wd._stack.append(wd._open)
        wd._nested.append(0.0)
        wd._entry += 1
        wd._open = (self.name, self.bound, time.monotonic(), threading.get_ident(), wd._entry)

    def __exit__(self, *exc: object) -> None:
        wd = self.wd
        took = time.monotonic() - wd._open[2]  # type: ignore[index]  # open while inside
        wd.seconds[self.name] += took - wd._nested.pop()
        if wd._nested:
            wd._nested[-1] += took  # the enclosing section's exclusive time leaves this out
        wd._open = wd._stack.pop()


class Watchdog:
    """Watches one loop's sections (see the module doc). Use as a context manager, or call
    ``start()`` / ``stop()``.

    Args:
        on_stall: called as ``on_stall(section, elapsed_s, stack_text)``, once per stuck entry.
        limits: the bounds (default ``limits_from_env()``).
        poll_s: how often the thread looks [s] (default: a tenth of the smallest bound,
            clamped to [0.05, 5]); a stall is reported at most ``poll_s`` after its bound.
    """

    def __init__(self, on_stall: StallCallback, limits: WatchdogLimits | None = None, poll_s: float | None = None):
        self.on_stall = on_stall
        self.limits = limits or limits_from_env()
        smallest = min(self.limits.bound(s) for s in SECTIONS)
        self.poll_s = poll_s if poll_s is not None else min(5.0, max(0.05, smallest / 10))
        self._sections = {s: _Section(self, s, self.limits.bound(s)) for s in SECTIONS}
        # (name, bound, t0, thread ident, entry number) of the open section, or None
        self._open: tuple[str, float, float, int, int] | None = None
        self._stack: list[tuple[str, float, float, int, int] | None] = []
        self._nested: list[float] = []  # per open section: seconds spent in sections nested in it
        self.seconds = dict.fromkeys(SECTIONS, 0.0)  # exclusive seconds per section (module doc)
        self._entry = 0
        self._fired = 0  # entry number of the last report: each entry is reported once
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def section(self, name: str) -> _Section:
        """Context manager timing ``name`` (one of ``SECTIONS``). Raises KeyError otherwise."""
        return self._sections[name]

    def totals(self, now: float | None = None) -> dict[str, float]:
        """``seconds`` plus the time so far of the sections open now, each exclusive of the one
        open inside it (a checkpoint taken during an eval counts the eval's seconds until then)."""
        now = time.monotonic() if now is None else now
        out = dict(self.seconds)
        opens = [o for o in self._stack[1:] if o is not None] + ([self._open] if self._open else [])
        ends = [o[2] for o in opens[1:]] + [now]
        for (name, _, t0, _, _), end, nested in zip(opens, ends, self._nested):
            out[name] += end - t0 - nested
        return out

    def check(self, now: float | None = None) -> bool:
        """Report the open section if it is past its bound (the thread calls this); True if it
        reported."""
        cur = self._open
        if cur is None:
            return False
        name, bound, t0, ident, entry = cur
        elapsed = (time.monotonic() if now is None else now) - t0
        if elapsed <= bound or entry == self._fired:
            return False
        self._fired = entry
        self.on_stall(name, elapsed, all_stacks(ident))
        return True

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.check()

    def start(self) -> Watchdog:
        """Start the daemon thread (idempotent). Returns self."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._watch, name="qkstudy-watchdog", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread; open sections are no longer watched."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> Watchdog:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stall_reason(section: str, elapsed_s: float, bound_s: float, stack: str, max_chars: int = 4000) -> str:
    """The failure reason for a stall: section, time, bound, and the top of the stack text
    (the MLflow ``failure_reason`` tag holds 5000 characters; the full stack goes to the log)."""
    head = f"no progress: section '{section}' ran {elapsed_s:.0f} s, past its {bound_s:g} s bound (${WATCHDOG_ENV} sets bounds)\n"
    return head + stack[: max(0, max_chars - len(head))]
