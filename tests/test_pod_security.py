"""The pods the program runs (the smoke test as the stack declares it, the rollback check as its provider builds it)
are admitted by the real API server's PodSecurity admission in the smoke namespace the stack declares, which enforces
`restricted`; the same pods without their security settings are refused there."""
import copy
import json

import pytest
from kubernetes.client.exceptions import ApiException

from harness import run_program, stack_config

from iks_gpu_migration.kube.rollback import rollback_pod

NODE = "10.240.0.11"


@pytest.fixture(scope="module")
def declared():
    run = run_program(stack_config("pilot"))
    return run.named("smoke-namespace").inputs, run.named(f"smoke-{NODE}").inputs


def _json_numbers(value):
    """Mocks hand numbers over as floats (protobuf Struct); the Kubernetes provider sends them as JSON integers."""
    if isinstance(value, dict):
        return {k: _json_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_numbers(v) for v in value]
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _create(kube, namespace: str, pod: dict) -> dict:
    body = _json_numbers(copy.deepcopy(pod))
    body.setdefault("apiVersion", "v1")
    body.setdefault("kind", "Pod")
    body["metadata"] = {**body["metadata"], "namespace": namespace}
    return kube.api.sanitize_for_serialization(kube.core.create_namespaced_pod(namespace, body))


def _without_security(pod: dict) -> dict:
    bare = copy.deepcopy(pod)
    for key in ("securityContext", "automountServiceAccountToken"):
        bare["spec"].pop(key, None)
    for container in bare["spec"]["containers"]:
        container.pop("securityContext", None)
    bare["metadata"] = {k: v for k, v in bare["metadata"].items() if k != "name"}
    bare["metadata"]["generateName"] = "bare-"
    return bare


def test_check_pods_are_admitted_under_restricted_and_bare_ones_refused(kube, declared):
    namespace_inputs, smoke = declared
    labels = namespace_inputs["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    ns = kube.name("smoke")
    kube.core.create_namespace({"metadata": {"name": ns, "labels": labels}})
    rollback = rollback_pod(NODE, "nvidia.com/gpu", "nvcr.io/nvidia/cuda:12.9.1-base-ubi9", ["nvidia-smi", "-L"], 60)
    for pod in (smoke, rollback):
        created = _create(kube, ns, pod)  # admitted: PodSecurity would answer 403 Forbidden
        assert created["spec"]["automountServiceAccountToken"] is False
        assert created["spec"]["securityContext"]["runAsUser"] != 0
        with pytest.raises(ApiException) as refused:
            _create(kube, ns, _without_security(pod))
        assert refused.value.status == 403
        body = json.loads(refused.value.body)["message"]
        assert 'violates PodSecurity "restricted:latest"' in body
        for missing in ("allowPrivilegeEscalation != false", "unrestricted capabilities", "runAsNonRoot != true",
                        "seccompProfile"):
            assert missing in body, body
