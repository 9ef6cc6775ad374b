"""The run files of ``qkstudy plan --write-runs`` and ``qkstudy train``, apart from the command wiring.

``plan --write-runs DIR`` writes each planned run as ``DIR/<run_id>.yaml`` (the RunSpec as
JSON-compatible YAML, written to a temp file and renamed, so a folder never holds half a
run); ``train RUN.yaml`` reads one back. Bad input raises SpecError naming the file, which the
CLI turns into exit code 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.plan.specfile import SpecError

if TYPE_CHECKING:
    from orchestrator.plan.contract import RunSpec


def write_run_files(folder: Path, runs: list[RunSpec]) -> Path:
    """Each run as ``folder/<run_id>.yaml`` (temp file, then rename); returns the folder, absolute.

    Raises:
        SpecError: ``folder`` exists and is not a folder (nothing is written).
    """
    import yaml

    if folder.exists() and not folder.is_dir():
        raise SpecError(folder, [("", "--write-runs needs a folder, and this is a file")])
    folder.mkdir(parents=True, exist_ok=True)
    for r in runs:
        tmp = folder / f".{r.run_id}.yaml.tmp"
        tmp.write_text(yaml.safe_dump(r.model_dump(mode="json"), sort_keys=False))
        tmp.rename(folder / f"{r.run_id}.yaml")
    return folder.resolve()


def load_run_file(run_file: Path) -> RunSpec:
    """The RunSpec in a file written by ``plan --write-runs``.

    Raises:
        SpecError: naming the file: missing, not YAML, not a run (a study spec is told to use
            ``qkstudy run`` or ``plan --write-runs``).
    """
    import yaml
    from pydantic import ValidationError

    from orchestrator.plan.contract import RunSpec

    if not run_file.is_file():
        raise SpecError(run_file, [("", "no such file")])
    data = None
    try:
        data = yaml.safe_load(run_file.read_text())
        return RunSpec.model_validate(data)
    except (yaml.YAMLError, ValidationError) as e:
        if isinstance(data, dict) and {"scales", "variants"} <= set(data):
            raise SpecError(
                run_file,
                [
                    (
                        "",
                        "this is a study spec, not a run: use `qkstudy run SPEC`, or write "
                        "its runs with `qkstudy plan SPEC --write-runs DIR` and train one",
                    )
                ],
            ) from None
        raise SpecError(run_file, [("", f"not a run spec written by `qkstudy plan --write-runs`: {e}")]) from None
