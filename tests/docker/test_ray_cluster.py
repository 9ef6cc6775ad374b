"""docker/ray-cluster.yaml: valid against Ray's own cluster-launcher schema (the check `ray up`
runs first), uses the qkstudy image, keeps the dashboard on loopback and holds no secret."""

from __future__ import annotations

import copy
import re

import jsonschema
import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from tests.helpers import REPO

CLUSTER = REPO / "docker" / "ray-cluster.yaml"


@pytest.fixture(scope="module")
def cluster() -> dict:
    return yaml.safe_load(CLUSTER.read_text())


def test_valid_for_ray_cluster_launcher(cluster: dict) -> None:
    validate_config(prepare_config(copy.deepcopy(cluster)))


def test_schema_check_can_fail(cluster: dict) -> None:
    broken = copy.deepcopy(cluster)
    broken["docker"]["imagee"] = broken["docker"]["image"]  # a typo'd key
    with pytest.raises(jsonschema.ValidationError, match="imagee"):
        validate_config(prepare_config(broken))


def test_uses_the_image_and_shared_defaults(cluster: dict) -> None:
    assert cluster["docker"]["image"].rsplit("/", 1)[-1].startswith("qkstudy:")
    head = " ".join(cluster["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head  # reached through `ray dashboard` (SSH tunnel)
    assert "--num-gpus=0" in head
    head_type = cluster["available_node_types"][cluster["head_node_type"]]
    assert head_type["resources"].get("GPU") == 0


def test_no_secret_in_cluster_yaml(cluster: dict) -> None:
    text = CLUSTER.read_text()
    assert not re.search(r"(?i)(password|secret|token|aws_access_key_id)\s*[:=]\s*\S", text)
    # Credentials reach the nodes only as the gitignored node env file, sourced at ray start.
    assert cluster["file_mounts"] == {"~/qkstudy.env": "docker/cluster.env"}
    env = "set -a && . ~/qkstudy.env && set +a && export RAY_AUTH_MODE=token RAY_TRAIN_V2_ENABLED=1 && "
    start = "python3 /usr/local/lib/qkstudy/check_env.py --role ray --exec ray start"
    # The head's drivers also learn what the cluster can grow to: the launcher's copy of this file.
    head = env + "export QKSTUDY_CLUSTER_CONFIG=$HOME/ray_bootstrap_config.yaml && " + start
    for cmd in cluster["head_start_ray_commands"][1:]:
        assert cmd.startswith(head), cmd
    for cmd in cluster["worker_start_ray_commands"][1:]:
        assert cmd.startswith(env + start), cmd


def test_nodes_get_only_what_a_node_needs() -> None:
    """The file synced to every node lists the training account and the Ray token, never the
    MLflow server's secrets (the stack's docker/.env holds those: it must not be what syncs)."""
    example = (REPO / "docker" / "cluster.env.example").read_text()
    keys = {line.partition("=")[0] for line in example.splitlines() if line.strip() and not line.startswith("#")}
    assert keys == {"MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "RAY_AUTH_TOKEN"}
    server_only = {"POSTGRES_PASSWORD", "MLFLOW_ADMIN_PASSWORD", "MLFLOW_FLASK_SERVER_SECRET_KEY"}
    stack_keys = {line.partition("=")[0] for line in (REPO / "docker" / ".env.example").read_text().splitlines()}
    assert server_only <= stack_keys and not server_only & keys


def test_gpus_only_on_gpu_workers(cluster: dict) -> None:
    assert "--gpus=all" not in cluster["docker"]["run_options"]
    assert cluster["docker"]["worker_run_options"] == ["--gpus=all"]
