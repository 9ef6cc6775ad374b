"""Where a gated ladder records the arms it stopped: one experiment tag per (corpus, variant).

The gated protocol (``run.driver.study``, ``orchestrator.plan.gate``) does not create MLflow
runs for the runs a stopped arm skips; it writes the evidence that stopped the arm as the
experiment tag ``qkstudy.gate.<corpus>.<variant>`` (a ``GateEvidence`` as JSON: rung, paired
Δloss, interval, pairs, the scales skipped). The report reads the tags back to mark the arm
as stopped and its missing runs as gated, not missing. A resubmit decides again from the
same finished runs (the same answer); an arm the gate no longer stops (the spec's bound
changed) has its tag removed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.plan.gate import GateEvidence
from orchestrator.track.tracking import client_for

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

GATE_TAG = "qkstudy.gate"


def gate_tag(corpus: str, variant: str) -> str:
    """The experiment tag key of (corpus, variant)'s gate record."""
    return f"{GATE_TAG}.{corpus}.{variant}"


def record_gate(client: MlflowClient, experiment_id: str, evidence: GateEvidence) -> None:
    """Record ``evidence`` of a stopped arm; remove an earlier record of an arm that now
    continues (``evidence.stopped`` False)."""
    key = gate_tag(evidence.corpus, evidence.variant)
    if evidence.stopped:
        client.set_experiment_tag(experiment_id, key, evidence.to_json())
    elif key in client.get_experiment(experiment_id).tags:
        client.delete_experiment_tag(experiment_id, key)


def gates_from_tags(tags: dict[str, str]) -> list[GateEvidence]:
    """The stopped arms' evidence in an experiment's ``tags`` (those ``record_gate`` wrote),
    sorted by (corpus, variant); a tag that does not parse is left out."""
    out = []
    for key, value in tags.items():
        if key.startswith(GATE_TAG + "."):
            try:
                out.append(GateEvidence.from_json(value))
            except ValueError:
                continue
    return sorted(out, key=lambda e: (e.corpus, e.variant))


def recorded_gates(tracking_uri: str, study: str) -> list[GateEvidence]:
    """``gates_from_tags`` of the study's experiment; [] when the store or experiment is missing."""
    exp = client_for(tracking_uri).get_experiment_by_name(study)
    return [] if exp is None else gates_from_tags(exp.tags)
