"""Where a gated ladder records the arms it stopped: one experiment tag per (corpus, variant).

The gated protocol (``run.driver.study``, ``orchestrator.plan.gate``) does not create MLflow
runs for the runs a stopped arm skips; it writes the evidence that stopped the arm as the
experiment tag ``qkstudy.gate.<corpus>.<variant>`` (a ``GateEvidence`` as JSON: rung, paired
Δloss, interval, pairs, the scales skipped). The report reads the tags back to mark the arm
as stopped and its missing runs as gated, not missing. A resubmit decides again from the
same finished runs (the same answer); an arm the gate no longer stops (the spec's bound
changed) has its tag removed. ``qkstudy.gate_ran`` records that a gate ran at all, with its
settings and the rungs it decided after, so a gate that stopped no arm is known too.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from orchestrator.plan.gate import GateEvidence, GateSpec
from orchestrator.track.tracking import client_for

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

GATE_TAG = "qkstudy.gate"
GATE_RAN_TAG = "qkstudy.gate_ran"  # not under GATE_TAG + ".": that prefix is the stopped arms'


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


def record_gate_ran(client: MlflowClient, experiment_id: str, gate: GateSpec, scale: str) -> None:
    """Record that ``gate`` decided after rung ``scale``: ``GATE_RAN_TAG`` = {"gate": its
    settings, "decided_after": [scales, in order, each once]}; settings other than the recorded
    ones (the spec changed between submits) start the list again."""
    ran = gate_ran_from_tags(client.get_experiment(experiment_id).tags)
    after = ran["decided_after"] if ran and ran["gate"] == gate.model_dump() else []
    record = {"gate": gate.model_dump(), "decided_after": after + ([scale] if scale not in after else [])}
    client.set_experiment_tag(experiment_id, GATE_RAN_TAG, json.dumps(record))


def gate_ran_from_tags(tags: dict[str, str]) -> dict[str, Any] | None:
    """``record_gate_ran``'s record in an experiment's ``tags``, or None (no gate ran, or a
    record that does not parse)."""
    try:
        record = json.loads(tags[GATE_RAN_TAG])
        return {"gate": dict(record["gate"]), "decided_after": list(record["decided_after"])}
    except (KeyError, TypeError, ValueError):
        return None
