"""What the driver hands a Ray Train worker group for each run of its pack.

The driver (``run.driver.packing``) builds one ``PackItem`` per run; the workers
(``run.worker.loop``) read them back. On the way they travel inside the TorchTrainer's
``train_loop_config``, which Ray pickles and keeps with the trainer's state, so they cross as
plain dicts of JSON values (``to_dict`` / ``from_dict``): a restored trainer reads them without
the classes of the process that wrote them, and the run travels as its JSON form, which
``RunSpec`` validates again on the worker's side.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.plan.contract import RunSpec

__all__ = ["PackItem"]


@dataclass(frozen=True)
class PackItem:
    """One run of a pack: its spec, its prepared data (folder and content hash: a checkpoint of
    the same run on other data is never resumed) and the MLflow run it writes."""

    run: RunSpec
    data_path: str
    data_hash: str | None
    mlflow_run_id: str

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (the run as JSON), as it travels in the trainer's config."""
        return {
            "run": self.run.model_dump(mode="json"),
            "data_path": self.data_path,
            "data_hash": self.data_hash,
            "mlflow_run_id": self.mlflow_run_id,
        }

    @classmethod
    def from_dict(cls, item: dict[str, Any]) -> PackItem:
        """The item ``to_dict`` wrote (the run validated again); a missing ``data_hash`` is None.

        Raises pydantic.ValidationError for a run that is not a valid ``RunSpec``, KeyError for
        a missing run, data_path or mlflow_run_id."""
        return cls(
            run=RunSpec.model_validate(item["run"]),
            data_path=item["data_path"],
            data_hash=item.get("data_hash"),
            mlflow_run_id=item["mlflow_run_id"],
        )
