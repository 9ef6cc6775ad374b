"""README.md and the command reference it links (docs/commands.md) name only what the CLI has:
every `qkstudy <command> ... --option` they show ("Your first study", the reference, "On a
cluster") is a command and an option of `qkstudy` (a documented option the CLI lacks misleads
every reader), every command is in the reference, and README's layout table has every
top-level folder the repository ships."""

import re
from typing import Any

import typer

from orchestrator.cli import app
from tests.helpers import REPO

README = (REPO / "README.md").read_text() + "\n" + (REPO / "docs" / "commands.md").read_text()


def _commands() -> dict[str, set[str]]:
    """'data prepare' -> its option names, for every (sub)command of qkstudy."""
    out: dict[str, set[str]] = {}

    def walk(cmd: Any, prefix: str) -> None:
        if hasattr(cmd, "commands"):  # a group (typer vendors its own click)
            for name, sub in cmd.commands.items():
                walk(sub, f"{prefix} {name}".strip())
        else:
            out[prefix] = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")}

    walk(typer.main.get_command(app), "")
    return out


def test_every_documented_command_and_option_exists():
    commands = _commands()
    blocks = "\n".join(re.findall(r"```bash\n(.*?)```", README, re.S))
    uses = re.findall(r"`qkstudy ([^`]+)`", README) + re.findall(r"^qkstudy (.+)$", blocks, re.M)
    assert len(uses) > 20
    root = {o for p in typer.main.get_command(app).params for o in p.opts if o.startswith("--")}  # `qkstudy --version`
    for use in uses:
        words = use.split("#")[0].split()
        if words[0].startswith("--"):
            assert words[0] in root, f"README shows `qkstudy {use}`: qkstudy has no {words[0]}"
            continue
        name = next((c for c in sorted(commands, key=len, reverse=True) if words[: len(c.split())] == c.split()), None)
        assert name is not None, f"README shows `qkstudy {use}`: no such command"
        for opt in re.findall(r"(--[a-z][a-z-]*)", use.split("#")[0]):
            assert opt in commands[name] | {"--help"}, f"README shows `qkstudy {use}`: {name} has no {opt}"


def test_layout_table_has_every_top_level_folder():
    layout = README.split("## Layout", 1)[1].split("\n## ", 1)[0]
    rows = set(re.findall(r"^\| `([^`]+)/` \|", layout, re.M))
    for folder in ("model", "data_pipeline", "jobs", "docker", "tests", "docs"):
        assert folder in rows, folder


def test_the_command_reference_lists_every_command():
    table = (REPO / "docs" / "commands.md").read_text()
    listed = set(re.findall(r"`qkstudy ([a-z]+(?: [a-z]+)?)", table))
    missing = [c for c in _commands() if c not in listed and c.split()[0] not in listed]
    assert missing == [], missing
