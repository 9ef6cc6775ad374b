"""docker/kuberay/: the RayCluster, RayJob and shared-volume manifests, checked offline: every
pod template and core object against Kubernetes' own OpenAPI schemas (kubernetes-validate,
strict: unknown fields refused), the KubeRay objects against KubeRay's field types
(tests/docker/kuberay_schema.py), and the worker groups through Ray's own KubeRay autoscaler
translation, which is also what the study driver reads to judge what the cluster can grow to.
Each check has a negative control that shows it can fail."""

from __future__ import annotations

import copy
import re

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import ValidationError as K8sValidationError

from orchestrator.plan.planner import plan
from orchestrator.plan.spec import parse_spec
from orchestrator.run.driver.placement import ClusterConfigError, growth_from_file, unschedulable_reason
from tests.docker.kuberay_schema import RAY_CLUSTER, RAY_JOB
from tests.helpers import REPO, tiny_spec

KUBE = REPO / "docker" / "kuberay"
K8S_VERSION = kubernetes_validate.utils.latest_version()
NODE_ENV_KEYS = {"MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "RAY_AUTH_TOKEN"}


def _load(name: str) -> dict:
    return yaml.safe_load((KUBE / name).read_text())


@pytest.fixture(scope="module")
def cluster() -> dict:
    return _load("raycluster.yaml")


@pytest.fixture(scope="module")
def job() -> dict:
    return _load("rayjob.yaml")


def _pod_templates(cluster: dict, job: dict) -> dict[str, dict]:
    spec = cluster["spec"]
    out = {"head": spec["headGroupSpec"]["template"], "submitter": job["spec"]["submitterPodTemplate"]}
    out.update({g["groupName"]: g["template"] for g in spec["workerGroupSpecs"]})
    return out


def _validate_pod_template(name: str, template: dict) -> None:
    """Kubernetes' schema of a PodTemplateSpec (the type KubeRay embeds), through a core v1 PodTemplate."""
    doc = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name}, "template": template}
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_pod_templates_and_the_volume_claim_are_valid_kubernetes(cluster, job):
    templates = _pod_templates(cluster, job)
    assert set(templates) == {"head", "submitter", "gpu"}
    for name, template in templates.items():
        _validate_pod_template(name, template)
    kubernetes_validate.validate(_load("shared-volume.yaml"), K8S_VERSION, strict=True)


def test_kubernetes_schema_check_can_fail(cluster):
    template = copy.deepcopy(cluster["spec"]["workerGroupSpecs"][0]["template"])
    template["spec"]["containers"][0]["imagePullPolice"] = "Always"  # a typo'd key
    with pytest.raises(K8sValidationError, match="imagePullPolice"):
        _validate_pod_template("gpu", template)


def test_raycluster_and_rayjob_have_kuberays_fields(cluster, job):
    jsonschema.validate(cluster, RAY_CLUSTER)
    jsonschema.validate(job, RAY_JOB)


@pytest.mark.parametrize(
    "path, value, match",
    [
        (("spec", "workerGroupSpecs", 0, "minReplica"), 0, "minReplica"),
        (("spec", "headGroupSpec", "rayStartParams", "num-cpus"), 0, "is not of type 'string'"),
        (("spec", "autoscalerOptions", "upscalingMode"), "Fast", "is not one of"),
    ],
)
def test_kuberay_field_check_can_fail(cluster, path, value, match):
    broken = copy.deepcopy(cluster)
    node = broken
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError, match=match):
        jsonschema.validate(broken, RAY_CLUSTER)


def test_rayjob_runs_the_same_cluster_and_retries_a_failed_driver(cluster, job):
    assert job["spec"]["rayClusterSpec"] == cluster["spec"], "rayjob.yaml's cluster drifted from raycluster.yaml"
    spec = job["spec"]
    assert spec["backoffLimit"] >= 1 and spec["shutdownAfterJobFinishes"] is True
    assert spec["submissionMode"] == "K8sJobMode"
    assert re.fullmatch(r"qkstudy run /shared/specs/\S+\.yaml", spec["entrypoint"])


def test_ray_reads_an_autoscaling_gpu_group_from_zero_and_a_head_without_workers(cluster):
    """Ray's KubeRay autoscaler translation of the groups (``growth_from_file`` uses it): the
    head holds no CPU or GPU for Ray, the gpu group grows from 0 to 8 one-GPU pods."""
    spec = cluster["spec"]
    assert spec["enableInTreeAutoscaling"] is True
    (gpu,) = spec["workerGroupSpecs"]
    assert gpu["minReplicas"] == 0 and gpu["maxReplicas"] == 8
    growth = growth_from_file(KUBE / "raycluster.yaml")
    head, *workers = growth.nodes
    assert head.get("CPU", 0) == 0 and head.get("GPU", 0) == 0
    assert len(workers) == 8 and all(n["CPU"] == 8 and n["GPU"] == 1 and n["memory"] == 64 * 2**30 for n in workers)
    assert growth_from_file(KUBE / "rayjob.yaml").nodes == growth.nodes


def _gpu_run(workers: int):
    resources = {"workers": workers, "cpus_per_worker": 8, "gpus_per_worker": 1}
    study = parse_spec(tiny_spec("k8s", resources=resources, train={"global_batch": 16, "seq_len": 64}))
    return plan(study)[0]


def test_the_driver_judges_runs_against_what_the_cluster_can_grow_to():
    growth = growth_from_file(KUBE / "raycluster.yaml")
    head_only = [growth.nodes[0]]
    assert unschedulable_reason(_gpu_run(8), head_only) is not None, "against the head alone no GPU run fits"
    assert unschedulable_reason(_gpu_run(8), head_only, growth) is None
    reason = unschedulable_reason(_gpu_run(16), head_only, growth)
    assert reason and "can grow to 9 node(s)" in reason and "'GPU': 8.0" in reason and str(KUBE / "raycluster.yaml") in reason


def test_the_launcher_config_is_read_the_same_way():
    growth = growth_from_file(REPO / "docker" / "ray-cluster.yaml")
    assert growth.nodes[0] == {"CPU": 8.0, "GPU": 0.0}
    assert growth.nodes[1:] == [{"CPU": 48.0, "GPU": 4.0}] * 8


@pytest.mark.parametrize(
    "text, match",
    [
        ("kind: Deployment\n", "neither a Ray cluster config"),
        ("available_node_types: {w: {max_workers: 2}}\nhead_node_type: h\n", r"available_node_types\.w\.resources"),
        ("kind: RayCluster\nspec: {}\n", "not a RayCluster KubeRay's autoscaler can read"),
        ("a: [\n", "cannot read the cluster config"),
    ],
)
def test_a_bad_cluster_config_is_an_input_error_naming_the_file(tmp_path, text, match):
    f = tmp_path / "cluster.yaml"
    f.write_text(text)
    with pytest.raises(ClusterConfigError, match=match) as e:
        growth_from_file(f)
    assert str(f) in str(e.value)


def _token_only(c: dict) -> bool:
    """The container takes the Ray token, and only it, from the Secret `qkstudy-node`."""
    ref = {"secretKeyRef": {"name": "qkstudy-node", "key": "RAY_AUTH_TOKEN"}}
    return "envFrom" not in c and [e for e in c["env"] if "valueFrom" in e] == [{"name": "RAY_AUTH_TOKEN", "valueFrom": ref}]


def test_secrets_come_only_from_the_node_secret(cluster, job):
    """No literal credential in any manifest. The Ray pods take the four node keys
    (docker/cluster.env.example) from the Secret `qkstudy-node`; the autoscaler sidecar and the
    RayJob's submitter, which never log to MLflow, take the Ray token only."""
    for f in KUBE.glob("*.yaml"):
        assert not re.search(r"(?i)(password|secret|token)\w*\s*[:=]\s*['\"]?[A-Za-z0-9+/_-]{12,}", f.read_text()), f
    example = (REPO / "docker" / "cluster.env.example").read_text()
    assert {line.partition("=")[0] for line in example.splitlines() if line.strip() and not line.startswith("#")} == NODE_ENV_KEYS
    templates = _pod_templates(cluster, job)
    for name in ("head", "gpu"):
        (c,) = templates[name]["spec"]["containers"]
        assert c["envFrom"] == [{"secretRef": {"name": "qkstudy-node"}}]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["RAY_AUTH_MODE"] == "token" and not NODE_ENV_KEYS & set(env)
    for c in (cluster["spec"]["autoscalerOptions"], templates["submitter"]["spec"]["containers"][0]):
        assert _token_only(c) and {e["name"]: e.get("value") for e in c["env"]}["RAY_AUTH_MODE"] == "token"
    leaky = copy.deepcopy(templates["submitter"]["spec"]["containers"][0])
    leaky["envFrom"] = [{"secretRef": {"name": "qkstudy-node"}}]
    assert not _token_only(leaky)  # negative control: the whole Secret is not "the token only"


def test_same_image_shared_volume_and_non_root_as_the_other_stacks(cluster, job):
    launcher_image = yaml.safe_load((REPO / "docker" / "ray-cluster.yaml").read_text())["docker"]["image"]
    for name, t in _pod_templates(cluster, job).items():
        (c,) = t["spec"]["containers"]
        assert c["image"] == launcher_image, name
        assert t["spec"]["securityContext"]["runAsNonRoot"] is True and t["spec"]["securityContext"]["runAsUser"] == 10001
        if name != "submitter":
            assert {"name": "shared", "mountPath": "/shared"} in c["volumeMounts"]
            assert {"name": "shared", "persistentVolumeClaim": {"claimName": "qkstudy-shared"}} in t["spec"]["volumes"]
            assert {e["name"]: e["value"] for e in c["env"]}["QKSTUDY_CACHE"] == "/shared/cache"
    assert _load("shared-volume.yaml")["spec"]["accessModes"] == ["ReadWriteMany"]
    assert cluster["spec"]["headGroupSpec"]["serviceType"] == "ClusterIP"
