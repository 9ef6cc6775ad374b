"""docker/ray-cluster.yaml: valid against Ray's own cluster-launcher schema (the check `ray up`
runs first), uses the qkstudy image, keeps the dashboard on loopback and holds no secret."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import jsonschema
import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

REPO = Path(__file__).resolve().parents[2]
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
    # Credentials reach the nodes only as the gitignored env file, sourced at ray start.
    assert cluster["file_mounts"] == {"~/qkstudy.env": "docker/.env"}
    for cmd in cluster["head_start_ray_commands"][1:] + cluster["worker_start_ray_commands"][1:]:
        assert cmd.startswith(
            "set -a && . ~/qkstudy.env && set +a && export RAY_AUTH_MODE=token && ray start"
        )
