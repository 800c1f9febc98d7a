"""The `pulumi preview` diff the README promises for each kind of config change (computed by preview_diff.py)."""
import copy

import pytest

from harness import stack_config
from preview_diff import preview

DRA, DP, IBM = "10.240.0.11", "10.240.0.12", "10.240.0.13"  # the pilot stack's nodes, one per stage


def changed(change) -> dict:
    raw = copy.deepcopy(stack_config("pilot"))
    change(raw)
    return raw


def stage(node: str, to: str):
    def change(raw):
        next(n for n in raw["nodes"] if n["name"] == node)["stage"] = to
    return change


def names(node: str, *parts: str) -> set[str]:
    return {f"{node}-{p}" for p in parts}


CASES = {
    # A node leaves ibm-managed: its replacement and path switch (a no-op switch with the node's rollback check,
    # readiness, operand placement and pending-pods report) are new; its fence runs again (it no longer requires IBM's
    # drivers); the deploy.operands=false labels go (the replacement is a new Node object without them).
    "stage ibm-managed -> device-plugin": (stage(IBM, "device-plugin"), {
        "+": names(IBM, "replacement", "switch") | {f"{IBM}-gate"},
        "-": names(IBM, "labels"), "~": {IBM}, "+-": names(IBM, "fence")}),
    "stage device-plugin -> dra": (stage(DP, "dra"), {
        "+": names(DP, "smoke-verification") | {f"smoke-{DP}", f"{DP}-dra-preflight"}, "-": set(),
        "~": {DP}, "+-": names(DP, "switch") | {f"{DP}-gate"}}),
    # Rollback of the last dra node: the DRA path (driver, DeviceClass, preflight, namespace) and smoke test go away.
    "stage dra -> device-plugin (rollback)": (stage(DRA, "device-plugin"), {
        "+": set(),
        "-": names(DRA, "smoke-verification") | {f"smoke-{DRA}", "device-class", "dra-driver", f"{DRA}-dra-preflight",
                                                 "smoke-namespace", "dra-path"},
        "~": {DRA}, "+-": names(DRA, "switch") | {f"{DRA}-gate"}}),
    "gpuOperator version or values": (lambda r: r["gpuOperator"].update(version="v25.10.2"), {
        "~": {"gpu-operator"}, "+": set(), "-": set(), "+-": set()}),
    "draDriver version or values": (lambda r: r["draDriver"]["values"].update(logVerbosity=6), {
        "~": {"dra-driver"}, "+": set(), "-": set(), "+-": set()}),
    "deviceSelectors": (lambda r: r.update(deviceSelectors=["device.attributes['gpu.nvidia.com'].index == 0"]), {
        "~": {"device-class"}, "+": set(), "-": set(), "+-": set()}),
    # The switches read the rollback check's image and their timeouts from their inputs when they run: nothing of
    # them changes (no step per node, each of which would save the whole state twice).
    "smokeTest.image": (lambda r: r["smokeTest"].update(image="nvcr.io/nvidia/cuda:13.0.0-base-ubi9"), {
        "+-": {f"smoke-{DRA}", f"{DRA}-smoke-verification"}, "~": set(), "+": set(), "-": set()}),
    "timeouts": (lambda r: r["timeouts"].update(drain=900, operatorReady=1200), {
        "~": {f"{DRA}-dra-preflight"}, "+": set(), "-": set(), "+-": set()}),
    "smokeTest.command": (lambda r: r["smokeTest"].update(command=["nvidia-smi", "-L"]), {
        "+-": {f"smoke-{DRA}", f"{DRA}-smoke-verification"}, "~": set(), "+": set(), "-": set()}),
    "IKS timeouts": (lambda r: r["timeouts"].update(masterUpdate=7200, workerReplace=7200, workerPool=7200), {
        "+": set(), "~": set(), "-": set(), "+-": set()}),
    "pilotLabel": (lambda r: r.update(pilotLabel="migration.example.com/gpu-dra=on"), {
        "~": {"dra-driver"},
        "+-": {f"smoke-{DRA}", f"{DRA}-smoke-verification", f"{DRA}-switch", f"{DP}-switch",
               f"{DRA}-dra-preflight"},
        "+": set(), "-": set()}),
    "tempGpuPool.enabled": (lambda r: r.update(tempGpuPool={"enabled": True, "flavor": "gx3.16x80.l4",
                                                            "zone": "us-south-1", "vpcId": "r006-v",
                                                            "subnetId": "0717-s"}), {
        # The slots grow by the pool's workers; no recorded gate or preflight runs again for that.
        "+": {"temp-gpu-pool"}, "~": set(), "-": set(), "+-": set()}),
    "hooks": (lambda r: r.update(hooks={"beforeReplace": "./move.sh", "afterVerification": "./notify.sh"}), {
        "+": names(DRA, "before-replace-hook", "after-verification-hook")
        | names(DP, "before-replace-hook", "after-verification-hook"), "~": set(), "-": set(), "+-": set()}),
    # After a replacement: recording the new worker ID changes nothing.
    "workerId set to the replaced worker": (lambda r: r["nodes"][0].update(workerId=f"{r['nodes'][0]['workerId']}-new"),
                                           {"+": set(), "~": set(), "-": set(), "+-": set()}),
}


# Checks that look at the cluster again on every `up` show as updated in every preview, whatever changed: three for
# the cluster, none per node (a no-op `up` of 1000 nodes must not re-run 1000 checks, each saving the whole state).
EVERY_UP = {"cluster-identity", "gpu-node-inventory", "operand-placement"}


@pytest.mark.parametrize("case", CASES)
def test_preview_diff(case):
    change, expected = CASES[case]
    diff = preview(stack_config("pilot"), changed(change))
    assert diff.pop("every up") == EVERY_UP
    assert diff == expected


def test_unknown_outputs_propagate():
    """A new kube version replaces both workers (an update of each WorkerReplacement, from the worker in state);
    everything addressed by their node names shows as replaced."""
    diff = preview(stack_config("pilot"), changed(lambda r: r.update(kubeVersion="1.38")))
    assert diff["~"] == {"master-version", *names(DRA, "replacement"), *names(DP, "replacement")}
    assert names(DRA, "switch", "smoke-verification") <= diff["+-"]
    assert names(DP, "switch") <= diff["+-"]
