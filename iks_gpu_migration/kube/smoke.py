"""SmokeTestVerification: judges a dra node's smoke pod by the four criteria, records the result on the node and
uncordons it; a failed pod is re-created by the next `up`."""
from typing import Any, Optional

import pulumi
from kubernetes import client
from pulumi.dynamic import Resource

from ..common import names
from ..common.waiting import WaitTimeout
from .cordon import uncordon_if_ours
from .cluster import TERMINAL
from .pods import _current_uid, _recreate_pod, _wait_for_pod_end, stuck_containers
from . import finished
from .provider import CheckFailed, _bullets, _Provider, _short
from .records import _last_record, _record
from .smoke_criteria import SmokeResult, capture_claim, verify_smoke


def _ended_without_claim(api, namespace: str, name: str, claims: dict[str, Any]) -> bool:
    """The pod has ended and its DRA extended-resource claim can no longer be read: kube-controller-manager's
    resourceclaim controller deletes it once the pod is done (kubernetes pkg/controller/resourceclaim/controller.go).
    A claim still there is kept in `claims`."""
    pod = client.CoreV1Api(api).read_namespaced_pod(name, namespace)
    capture_claim(api, pod, claims)
    status = pod.status
    return bool(status and status.phase in TERMINAL and status.extended_resource_claim_status and not claims)


class _SmokeTestVerificationProvider(_Provider):
    rerun_on = ("namespace", "pod_name", "pod_uid", "node", "driver", "extended_resource")

    def run(self, api, p):
        node, pod = p["node"], f"{p['namespace']}/{p['pod_name']}"
        uid = p.get("pod_uid")
        last, current = _last_record(api, node), _current_uid(api, p["namespace"], p["pod_name"])
        if current and last.get("pod") == pod and last.get("podUid") == current:
            # The pod judged by an earlier `up` (the Pod resource's, or one this provider re-created).
            uid = current
            if last.get("result") == "failed":
                pulumi.log.info(f"node {node}: smoke pod {pod} failed before; replacing it to run the test again")
                uid = _recreate_pod(api, p["namespace"], p["pod_name"])
        claims: dict[str, Any] = {}
        if current and uid == current and _ended_without_claim(api, p["namespace"], p["pod_name"], claims):
            # E.g. the pod of a killed `up` (adopted by `recover`): it finished while nothing watched it, so its
            # claim is gone and criterion 2 can't be judged. Run it again and judge that run.
            pulumi.log.info(f"node {node}: smoke pod {pod} ended before this run could read its ResourceClaim; "
                            f"replacing it to run the test again")
            uid = _recreate_pod(api, p["namespace"], p["pod_name"])
        try:
            ended = _wait_for_pod_end(api, p["namespace"], p["pod_name"], uid, p, 600, claims)
            stuck = stuck_containers(ended)
            if stuck:
                result = SmokeResult(problems=[f"criterion 4 (GPU operation): pod {pod} {s}"
                                                           for s in stuck])
            else:
                result = verify_smoke(api, p["namespace"], p["pod_name"], node, p["driver"],
                                                  p["extended_resource"], p.get("dra_namespace"), claims)
        except WaitTimeout as e:
            result = SmokeResult(problems=[f"criterion 4 (GPU operation): {e}"])
        passed = not result.problems
        note = _record(api, node, {"path": "dra", "result": "passed" if passed else "failed", "pod": pod,
                                   "podUid": uid, "gpu": result.gpu_uuid, "device": result.device,
                                   "problems": result.problems})
        if not passed:
            # The next `up` knows this pod failed only from the record; without it, it would judge the pod again.
            rerun = ("it replaces the pod and judges the new one" if not note else
                     f"as the result was not recorded, replace the pod yourself: `pulumi up --replace <URN of "
                     f"smoke-{p['pod_name'].removeprefix(names.SMOKE_POD_PREFIX)}>`")
            raise CheckFailed(
                f"smoke test {pod} on node {node} failed:{_bullets(result.problems)}\n"
                f"node {node} stays cordoned. Fix the cause and run `pulumi up` again: {rerun}"
                + (f"\n{note}" if note else "")
            )
        finished.record(node)  # a dra node's last check: its slot's peers count it back (kube/finished.py)
        summary = f"passed: {pod} used {result.device} ({result.gpu_uuid}) via {result.claim}"
        # The output (the stack output node:<name>.smokeTest) stays short: the CLI cuts a value's lines at 150
        # characters (pulumi/pulumi pkg/backend/display/object_diff.go); pod and claim are outputs of their own.
        short = f"passed: {result.gpu_uuid} ({result.device})"
        try:
            if uncordon_if_ours(api, node):
                summary += f"; node {node} uncordoned"
                short += "; uncordoned"
        except Exception as e:
            raise CheckFailed(
                f"smoke test {summary}, but uncordoning node {node} failed: {_short(e)}\n"
                f"run `pulumi up` again (it judges the same pod again) or `kubectl uncordon {node}`") from e
        pulumi.log.info(f"node {node}: smoke test {summary}")
        return {"gpu_uuid": result.gpu_uuid, "device": result.device, "claim": result.claim, "result": short}


class SmokeTestVerification(Resource, module="gpu-migration", name="SmokeTestVerification"):
    """Judges the node's smoke-test Pod by the four criteria; re-runs when the Pod is replaced (new uid)."""

    gpu_uuid: pulumi.Output[str]
    device: pulumi.Output[str]  # <driver>/<pool>/<device>
    claim: pulumi.Output[str]  # namespace/name of the ResourceClaim generated for the Pod
    result: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        kubeconfig: pulumi.Input[Optional[str]],
        namespace: pulumi.Input[str],
        pod_name: pulumi.Input[str],
        pod_uid: pulumi.Input[str],
        node: pulumi.Input[str],
        driver: pulumi.Input[str],
        extended_resource: pulumi.Input[str],
        timeout: pulumi.Input[float],
        poll_interval: pulumi.Input[float],
        dra_namespace: pulumi.Input[Optional[str]] = None,  # criterion 2 reads the DRA kubelet plugin's log there
        opts: Optional[pulumi.ResourceOptions] = None,
    ):
        props = dict(kubeconfig=kubeconfig, namespace=namespace, pod_name=pod_name, pod_uid=pod_uid, node=node,
                     driver=driver, extended_resource=extended_resource, dra_namespace=dra_namespace, timeout=timeout,
                     poll_interval=poll_interval, gpu_uuid=None, device=None, claim=None, result=None)
        super().__init__(_SmokeTestVerificationProvider(), name, props, opts)
