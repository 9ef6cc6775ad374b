"""No input ends in a traceback (issue 51), property-style: seeded random specs (a valid tiny
study with random fields set to random values of every YAML type, and random YAML documents)
and random ``KEY=VALUE`` overrides, fed to ``validate`` and ``plan``. Each must end with exit 0
(the input was fine) or 2 (one line naming what is wrong), never an exception escaping the
command. A negative control shows the check can fail: a command that raises is caught."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from orchestrator.cli import app
from tests.helpers import tiny_spec

BASE = tiny_spec("fuzz", corpus={"source": "mqar", "mqar": {"preset": "easy"}}, tokenizer={"vocab_size": 512})
BASE["train"] = {"global_batch": 8, "seq_len": 64}
FIELDS = [
    ("name",),
    ("scales",),
    ("variants",),
    ("seeds",),
    ("budget",),
    ("budget", "tokens"),
    ("budget", "mode"),
    ("budget", "tokens_per_param"),
    ("budget", "max_epochs"),
    ("extend",),
    ("reference",),
    ("train", "global_batch"),
    ("train", "seq_len"),
    ("train", "micro_batch"),
    ("train", "lr"),
    ("train", "schedule"),
    ("eval", "num_evals"),
    ("eval", "max_windows"),
    ("eval", "diagnostics_every_evals"),
    ("resources", "workers"),
    ("resources", "zero_stage"),
    ("resources", "gpus_per_worker"),
    ("resources", "device_memory_gb"),
    ("corpus",),
    ("corpus", "source"),
    ("corpus", "paths"),
    ("tokenizer", "vocab_size"),
    ("protocol",),
    ("tune",),
    ("storage_path",),
    ("tracking_uri",),
    ("extends",),
    ("plugins",),
]


def _value(rng: random.Random, depth: int = 0) -> Any:
    """A random YAML value: scalars of every type, edge numbers, markup-like text, nesting."""
    kinds = ["int", "big", "neg", "float", "inf", "bool", "none", "str", "markup", "path"] + (["list", "dict"] if depth < 2 else [])
    kind = rng.choice(kinds)
    if kind == "int":
        return rng.randint(0, 10_000)
    if kind == "big":
        return rng.choice([2**63, 10**30, 2**64 + 1])
    if kind == "neg":
        return -rng.randint(1, 10**6)
    if kind == "float":
        return rng.choice([0.5, 1e-12, 3.7, 1e300, 2.0])
    if kind == "inf":
        return rng.choice([float("inf"), float("-inf"), float("nan")])
    if kind == "bool":
        return rng.choice([True, False])
    if kind == "none":
        return None
    if kind == "str":
        return rng.choice(["", "cpu-xs", "standard", "coupled", "x" * 300, "60m", "wsd", "flops", "tokens", "auto", "s3://"])
    if kind == "markup":
        return rng.choice(["[/x]", "[bold]", "[red]oops[/red]", "{}", "[[]]"])
    if kind == "path":
        return rng.choice(["/nonexistent/*.txt", "../../etc/passwd", "~/nothing", "/dev/null", "."])
    if kind == "list":
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(["a", "tokens", "cpu-xs", "preset", "lr", "source"]): _value(rng, depth + 1) for _ in range(rng.randint(0, 2))}


def _mutated(rng: random.Random) -> Any:
    """The base study with 1-3 random fields set to random values, or a random document."""
    if rng.random() < 0.1:
        return _value(rng)
    spec: dict[str, Any] = yaml.safe_load(yaml.safe_dump(BASE))
    for _ in range(rng.randint(1, 3)):
        path = rng.choice(FIELDS)
        node = spec
        for key in path[:-1]:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        node[path[-1]] = _value(rng)
    return spec


def _override(rng: random.Random) -> str:
    key = ".".join(rng.choice(FIELDS))
    return f"{key}={yaml.safe_dump(_value(rng), default_flow_style=True).strip().removesuffix('...').strip()}"


def _ended_cleanly(res) -> bool:
    return res.exit_code in (0, 2) and (res.exception is None or isinstance(res.exception, SystemExit))


@pytest.mark.parametrize("seed", range(4))
def test_random_specs_and_overrides_end_in_exit_0_or_2_never_a_traceback(tmp_path, monkeypatch, seed):
    monkeypatch.chdir(tmp_path)
    rng = random.Random(seed)
    runner = CliRunner()
    bad = []
    for i in range(40):
        f = tmp_path / f"s{i}.yaml"
        f.write_text(yaml.safe_dump(_mutated(rng), allow_unicode=True))
        overrides = [_override(rng) for _ in range(rng.randint(0, 2))] if rng.random() < 0.5 else []
        for command in ("validate", "plan"):
            res = runner.invoke(app, [command, str(f), *overrides])
            if not _ended_cleanly(res):
                bad.append((command, f.read_text(), overrides, res.exit_code, repr(res.exception), res.output[-500:]))
    assert not bad, bad[0]


def test_the_check_catches_an_exception_that_escapes_a_command():
    """Negative control: a command that raises ends neither with exit 0 nor 2 cleanly."""
    broken = typer.Typer()

    @broken.command()
    def boom(spec: Path) -> None:
        raise OverflowError("escaped")

    assert not _ended_cleanly(CliRunner().invoke(broken, ["x.yaml"]))
    assert _ended_cleanly(CliRunner().invoke(app, ["validate", "/nonexistent/spec.yaml"]))
