"""The fault points tests arm through the environment (``run.faults``): off unless asked, the
kill limited to the run named, the kill exiting the process, the block never returning and the
hold waiting for its test."""

import subprocess
import sys
import threading
import time
import traceback

import pytest

from orchestrator.run import faults
from orchestrator.run.faults import HOLD_FILE_ENV, KILL_EXIT_CODE, KILL_RUN_ENV, FaultPoint, armed_at, hit, step_hook

KILL, BLOCK, HOLD = FaultPoint.KILL_AT_STEP, FaultPoint.BLOCK_AT_STEP, FaultPoint.HOLD_AT_STEP


def _disarm(monkeypatch):
    for name in (KILL.env, BLOCK.env, HOLD.env, KILL_RUN_ENV, HOLD_FILE_ENV):
        monkeypatch.delenv(name, raising=False)


def test_the_variable_names_tests_set():
    assert (KILL.env, BLOCK.env, KILL_RUN_ENV) == ("QKSTUDY_TEST_KILL_AT_STEP", "QKSTUDY_TEST_BLOCK_AT_STEP", "QKSTUDY_TEST_KILL_RUN")
    assert (HOLD.env, HOLD_FILE_ENV) == ("QKSTUDY_TEST_HOLD_AT_STEP", "QKSTUDY_TEST_HOLD_FILE")


def test_nothing_is_armed_unless_asked(monkeypatch):
    _disarm(monkeypatch)
    assert armed_at(KILL) is None and armed_at(BLOCK) is None and step_hook("r") is None
    monkeypatch.setenv(KILL.env, "0")
    assert armed_at(KILL) is None and step_hook("r") is None
    hit(KILL, 0, "r")  # disarmed: returns


def test_the_kill_is_limited_to_the_run_named(monkeypatch):
    _disarm(monkeypatch)
    monkeypatch.setenv(KILL.env, "3")
    monkeypatch.setenv(BLOCK.env, "5")
    monkeypatch.setenv(KILL_RUN_ENV, "b")
    assert armed_at(KILL, "a") is None and armed_at(KILL, "b") == 3 and armed_at(KILL) == 3
    assert armed_at(BLOCK, "a") == 5  # the run filter is the kill's alone


def test_the_kill_exits_after_its_step():
    code = (
        "import os\n"
        f"os.environ[{KILL.env!r}] = '3'\n"
        "from orchestrator.run.faults import step_hook\n"
        "hook = step_hook('r')\n"
        "hook(1); hook(2); print('alive at 2', flush=True)\n"
        "hook(3); print('alive at 3', flush=True)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == KILL_EXIT_CODE == 17 and out.stdout == "alive at 2\n", out.stderr[-2000:]


def test_the_block_never_returns_at_its_step(monkeypatch):
    _disarm(monkeypatch)
    monkeypatch.setenv(BLOCK.env, "2")
    hook = step_hook("r")
    hook(1)  # any other step returns
    t = threading.Thread(target=hook, args=(2,), daemon=True)
    t.start()
    t.join(1.0)
    assert t.is_alive()
    # the stall's reason shows the stuck thread's stack: the hook's frame reads "in block" there
    names = [f.name for f in traceback.extract_stack(sys._current_frames()[t.ident])]
    assert "block" in names, names


def test_the_kill_comes_before_the_block_at_the_same_step(monkeypatch):
    _disarm(monkeypatch)
    monkeypatch.setenv(KILL.env, "2")
    monkeypatch.setenv(BLOCK.env, "2")
    hits: list[FaultPoint] = []
    monkeypatch.setattr(faults, "hit", lambda point, step, run_name=None: hits.append(point))
    step_hook("r")(2)
    assert hits == [KILL, BLOCK]


def test_the_hold_says_it_is_held_and_goes_on_when_its_file_is_deleted(monkeypatch, tmp_path):
    _disarm(monkeypatch)
    held = tmp_path / "sub" / "held"
    monkeypatch.setenv(HOLD.env, "3")
    monkeypatch.setenv(HOLD_FILE_ENV, str(held))
    hook = step_hook("r")
    hook(2)  # any other step returns at once
    assert not held.exists()
    t = threading.Thread(target=hook, args=(3,), daemon=True)
    t.start()
    deadline = time.time() + 30
    while not held.exists():
        assert time.time() < deadline and t.is_alive(), "the held run never said so"
        time.sleep(0.01)
    t.join(0.5)
    assert t.is_alive()  # held while the file is there
    held.unlink()
    t.join(10)
    assert not t.is_alive()  # released: the step goes on


def test_a_hold_without_its_file_is_refused_by_name(monkeypatch):
    _disarm(monkeypatch)
    monkeypatch.setenv(HOLD.env, "3")
    with pytest.raises(ValueError, match="QKSTUDY_TEST_HOLD_AT_STEP is set but QKSTUDY_TEST_HOLD_FILE is not"):
        step_hook("r")


def test_a_point_that_fired_is_not_armed_again_for_the_run(monkeypatch, tmp_path):
    """A retried attempt that starts with no registered checkpoint (the kill landed before Ray
    Train registered one) must not be killed again: the first firing leaves a mark."""
    _disarm(monkeypatch)
    monkeypatch.setenv(KILL.env, "2")
    hits: list[FaultPoint] = []
    monkeypatch.setattr(faults, "hit", lambda point, step, run_name=None: hits.append(point))
    step_hook("r", fired_dir=str(tmp_path))(2)
    assert hits == [KILL] and faults.fired_mark(str(tmp_path), KILL, "r").is_file()
    assert step_hook("r", fired_dir=str(tmp_path)) is None  # the retry: disarmed
    assert step_hook("other", fired_dir=str(tmp_path)) is not None  # another run: still armed
    assert step_hook("r") is not None  # the control: without the shared folder it would fire again
