"""The KubeRay ray.io/v1 RayCluster and RayJob fields, as JSON Schema, typed as KubeRay's API
reference (v1.6, https://docs.ray.io/en/master/cluster/kubernetes/references/api.html) types
them: unknown fields refused (what the CRD's structural schema does at `kubectl apply`), enums
and integer bounds kept. KubeRay's own CRD files are on no package registry this project's CI
can reach (PyPI, npm, Debian), so this is written from the reference; the pod templates inside
are checked against Kubernetes' own schemas (kubernetes-validate) and the groups through Ray's
KubeRay autoscaler code, by tests/docker/test_kuberay.py."""

from __future__ import annotations

_OBJ = {"type": "object"}  # a Kubernetes type checked elsewhere (PodTemplateSpec, ResourceRequirements, ...)
_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}  # rayStartParams: strings only
_NONNEG = {"type": "integer", "minimum": 0}


def _closed(properties: dict, required: tuple[str, ...] = ()) -> dict:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


_METADATA = _OBJ
_AUTOSCALER_OPTIONS = _closed(
    {
        "resources": _OBJ,
        "image": {"type": "string"},
        "imagePullPolicy": {"enum": ["Always", "Never", "IfNotPresent"]},
        "securityContext": _OBJ,
        "idleTimeoutSeconds": {"type": "integer", "format": "int32"},
        "upscalingMode": {"enum": ["Default", "Aggressive", "Conservative"]},
        "version": {"enum": ["v1", "v2"]},
        "env": {"type": "array", "items": _OBJ},
        "envFrom": {"type": "array", "items": _OBJ},
        "volumeMounts": {"type": "array", "items": _OBJ},
    }
)
_HEAD_GROUP = _closed(
    {
        "serviceType": {"enum": ["ClusterIP", "NodePort", "LoadBalancer"]},
        "headService": _OBJ,
        "enableIngress": {"type": "boolean"},
        "rayStartParams": _STR_MAP,
        "template": _OBJ,
    },
    ("template",),
)
_WORKER_GROUP = _closed(
    {
        "groupName": {"type": "string", "minLength": 1},
        "replicas": _NONNEG,
        "minReplicas": _NONNEG,
        "maxReplicas": _NONNEG,
        "idleTimeoutSeconds": {"type": "integer"},
        "numOfHosts": {"type": "integer", "minimum": 1},
        "suspend": {"type": "boolean"},
        "rayStartParams": _STR_MAP,
        "template": _OBJ,
        "scaleStrategy": _OBJ,
    },
    ("groupName", "template", "minReplicas", "maxReplicas"),
)
RAY_CLUSTER_SPEC = _closed(
    {
        "rayVersion": {"type": "string"},
        "enableInTreeAutoscaling": {"type": "boolean"},
        "autoscalerOptions": _AUTOSCALER_OPTIONS,
        "authOptions": _OBJ,
        "headServiceAnnotations": _STR_MAP,
        "headGroupSpec": _HEAD_GROUP,
        "workerGroupSpecs": {"type": "array", "items": _WORKER_GROUP},
        "gcsFaultToleranceOptions": _OBJ,
        "managedBy": {"type": "string"},
        "suspend": {"type": "boolean"},
    },
    ("headGroupSpec",),
)
RAY_CLUSTER = _closed(
    {"apiVersion": {"const": "ray.io/v1"}, "kind": {"const": "RayCluster"}, "metadata": _METADATA, "spec": RAY_CLUSTER_SPEC},
    ("apiVersion", "kind", "metadata", "spec"),
)
RAY_JOB = _closed(
    {
        "apiVersion": {"const": "ray.io/v1"},
        "kind": {"const": "RayJob"},
        "metadata": _METADATA,
        "spec": _closed(
            {
                "entrypoint": {"type": "string", "minLength": 1},
                "runtimeEnvYAML": {"type": "string"},
                "metadata": _STR_MAP,
                "jobId": {"type": "string"},
                "submissionMode": {"enum": ["K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode"]},
                "backoffLimit": _NONNEG,
                "activeDeadlineSeconds": {"type": "integer", "minimum": 1},
                "shutdownAfterJobFinishes": {"type": "boolean"},
                "ttlSecondsAfterFinished": _NONNEG,
                "submitterPodTemplate": _OBJ,
                "submitterConfig": _OBJ,
                "rayClusterSpec": RAY_CLUSTER_SPEC,
                "clusterSelector": _STR_MAP,
                "entrypointNumCpus": {"type": "number"},
                "entrypointNumGpus": {"type": "number"},
                "entrypointResources": {"type": "string"},
                "suspend": {"type": "boolean"},
                "managedBy": {"type": "string"},
                "deletionStrategy": _OBJ,
            },
            ("entrypoint",),
        ),
    },
    ("apiVersion", "kind", "metadata", "spec"),
)
