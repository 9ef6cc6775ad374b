"""Requirement lines an image installs, read from pyproject.toml (the one list of dependencies).

    python3 docker/requirements.py [--extra NAME]... [--only-extras] [--exclude NAME]... [PYPROJECT]

Prints one PEP 508 requirement per line: the project's dependencies (unless --only-extras)
followed by those of each --extra, without the packages named by --exclude (compared by
canonical name, so ``--exclude DeepSpeed`` drops ``deepspeed>=0.16``). Versions are not
pinned here: every caller installs with ``-c constraints.txt``. Standard library only (runs in
an image before anything is installed; Python >= 3.11 for tomllib).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import tomllib


def canonical(name: str) -> str:
    """PEP 503 normalised name: ``Foo_Bar.baz`` -> ``foo-bar-baz``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(req: str) -> str:
    """The distribution name at the start of a PEP 508 requirement string."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
    if match is None:
        raise ValueError(f"not a requirement: {req!r}")
    return canonical(match[1])


def requirements(pyproject: Path, extras: list[str], *, only_extras: bool = False,
                 exclude: frozenset[str] = frozenset()) -> list[str]:
    """The requirement strings of `pyproject` for `extras`, in file order, minus `exclude`.

    Raises:
        KeyError: an extra that pyproject.toml does not define (the message names it).
    """
    project = tomllib.loads(pyproject.read_text())["project"]
    defined = project.get("optional-dependencies", {})
    reqs = [] if only_extras else list(project["dependencies"])
    for extra in extras:
        if extra not in defined:
            raise KeyError(f"{pyproject}: no optional-dependencies.{extra} (defined: {sorted(defined)})")
        reqs += defined[extra]
    drop = {canonical(n) for n in exclude}
    return [r for r in reqs if requirement_name(r) not in drop]


def main(argv: list[str] | None = None) -> int:
    """CLI entry: print the requirements, one per line; exit 2 on an unknown extra."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pyproject", nargs="?", default=str(Path(__file__).resolve().parents[1] / "pyproject.toml"))
    parser.add_argument("--extra", action="append", default=[])
    parser.add_argument("--only-extras", action="store_true")
    parser.add_argument("--exclude", action="append", default=[])
    args = parser.parse_args(argv)
    try:
        lines = requirements(Path(args.pyproject), args.extra, only_extras=args.only_extras,
                             exclude=frozenset(args.exclude))
    except KeyError as err:
        print(f"error: {err.args[0]}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
