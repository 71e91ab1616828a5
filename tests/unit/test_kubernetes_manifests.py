"""deploy/kubernetes/: the KubeRay manifests docs/deploy.md shows, checked as far as this
machine can (no Kubernetes here): each parses, uses only fields of KubeRay's v1 CRDs (the
schemas below list the fields of ray.io_rayclusters.yaml and ray.io_rayjobs.yaml that a
manifest may set at each level), the pieces refer to each other, and the serve config in
the ConfigMap validates as the toolkit's config file."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from app_toolkit.config.file import parse_config

FOLDER = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"

_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_CONTAINER = {
    "type": "object",
    "required": ["name", "image"],
    "properties": {
        "name": {"type": "string"},
        "image": {"type": "string"},
        "ports": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["containerPort"],
                "properties": {"containerPort": {"type": "integer"}, "name": {"type": "string"}},
            },
        },
    },
}
_POD_TEMPLATE = {
    "type": "object",
    "required": ["spec"],
    "properties": {
        "spec": {
            "type": "object",
            "required": ["containers"],
            "properties": {"containers": {"type": "array", "minItems": 1, "items": _CONTAINER}},
        }
    },
}
_METADATA = {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}

RAY_CLUSTER = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "ray.io/v1"},
        "kind": {"const": "RayCluster"},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "required": ["headGroupSpec"],
            "additionalProperties": False,
            "properties": {
                "autoscalerOptions": {"type": "object"},
                "enableInTreeAutoscaling": {"type": "boolean"},
                "gcsFaultToleranceOptions": {"type": "object"},
                "headServiceAnnotations": _STRING_MAP,
                "managedBy": {"type": "string"},
                "rayVersion": {"type": "string"},
                "suspend": {"type": "boolean"},
                "upgradeStrategy": {"type": "object"},
                "headGroupSpec": {
                    "type": "object",
                    "required": ["template"],
                    "additionalProperties": False,
                    "properties": {
                        "enableIngress": {"type": "boolean"},
                        "headService": {"type": "object"},
                        "rayStartParams": _STRING_MAP,
                        "serviceType": {"type": "string"},
                        "template": _POD_TEMPLATE,
                    },
                },
                "workerGroupSpecs": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["groupName", "template"],
                        "additionalProperties": False,
                        "properties": {
                            "groupName": {"type": "string"},
                            "idleTimeoutSeconds": {"type": "integer"},
                            "maxReplicas": {"type": "integer"},
                            "minReplicas": {"type": "integer"},
                            "numOfHosts": {"type": "integer"},
                            "rayStartParams": _STRING_MAP,
                            "replicas": {"type": "integer"},
                            "scaleStrategy": {"type": "object"},
                            "suspend": {"type": "boolean"},
                            "template": _POD_TEMPLATE,
                        },
                    },
                },
            },
        },
    },
}

RAY_JOB = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "ray.io/v1"},
        "kind": {"const": "RayJob"},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "activeDeadlineSeconds": {"type": "integer"},
                "backoffLimit": {"type": "integer"},
                "clusterSelector": _STRING_MAP,
                "deletionStrategy": {"type": "object"},
                "entrypoint": {"type": "string"},
                "entrypointNumCpus": {"type": "number"},
                "entrypointNumGpus": {"type": "number"},
                "entrypointResources": {"type": "string"},
                "jobId": {"type": "string"},
                "managedBy": {"type": "string"},
                "metadata": _STRING_MAP,
                "rayClusterSpec": {"type": "object"},
                "runtimeEnvYAML": {"type": "string"},
                "shutdownAfterJobFinishes": {"type": "boolean"},
                "submissionMode": {"enum": ["K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode"]},
                "submitterConfig": {"type": "object"},
                "submitterPodTemplate": {"type": "object"},
                "suspend": {"type": "boolean"},
                "ttlSecondsAfterFinished": {"type": "integer"},
            },
        },
    },
}


def _manifests() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(FOLDER.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            found[document["kind"]] = document
    return found


MANIFESTS = _manifests()


def test_the_folder_holds_a_cluster_its_config_a_deploy_job_and_a_service() -> None:
    assert set(MANIFESTS) == {"RayCluster", "ConfigMap", "RayJob", "Service"}


@pytest.mark.parametrize(("kind", "schema"), [("RayCluster", RAY_CLUSTER), ("RayJob", RAY_JOB)])
def test_kuberay_objects_use_only_fields_of_the_crds(kind: str, schema: dict[str, Any]) -> None:
    jsonschema.validate(MANIFESTS[kind], schema)


def test_the_schemas_can_fail() -> None:
    cluster = MANIFESTS["RayCluster"]
    wrong = {**cluster, "spec": {**cluster["spec"], "serveConfigV2": "only a RayService has this"}}
    with pytest.raises(jsonschema.ValidationError, match="serveConfigV2"):
        jsonschema.validate(wrong, RAY_CLUSTER)


def test_the_pieces_fit_together() -> None:
    cluster, job, config, service = (MANIFESTS[k] for k in ("RayCluster", "RayJob", "ConfigMap", "Service"))
    name = cluster["metadata"]["name"]
    assert cluster["spec"]["rayVersion"] == "2.60.0"  # the Ray the toolkit is pinned to
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": name}  # the existing cluster
    assert service["spec"]["selector"] == {"ray.io/cluster": name}
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]
    (volume,) = head["volumes"]
    assert volume["configMap"]["name"] == config["metadata"]["name"]
    (mount,) = head["containers"][0]["volumeMounts"]
    command = shlex.split(job["spec"]["entrypoint"])
    assert command[:2] == ["app-toolkit", "deploy"] and command[2] == f"{mount['mountPath']}/serve.yaml"
    # Every pod exposes the proxy port the Service targets, and is ready once it serves.
    pods = [head, *(group["template"]["spec"] for group in cluster["spec"]["workerGroupSpecs"])]
    for pod in pods:
        container = pod["containers"][0]
        assert {"containerPort": 8000, "name": "serve"} in container["ports"]
        assert container["readinessProbe"]["httpGet"] == {"path": "/-/healthz", "port": 8000}
    assert service["spec"]["ports"][0]["targetPort"] == "serve"


def test_the_serve_config_is_a_valid_config_file_listening_on_the_pod_network() -> None:
    config = parse_config(yaml.safe_load(MANIFESTS["ConfigMap"]["data"]["serve.yaml"]), "serve.yaml")
    assert config.http().host == "0.0.0.0" and config.http().port == 8000
