"""The local environment stays healthy for as long as it is up: kwok renews each node's Lease as a kubelet does, so
the node-lifecycle controller never marks a node Unknown or its pods not ready, and every GPU stays offered.

The node-lifecycle clock runs 5x faster than a real cluster's (gpu_migration_local/control_plane.py NodeHealth:
lease 8 s renewed every 2 s, grace 10 s, checked every second), so the minute watched after the migration covers six
grace periods; without Leases the first node goes Unknown 10 s after it registers."""
import time

import pytest
from kubernetes import client

from gpu_migration_local.control_plane import NodeHealth

from .scenario_env import A, B, C, PILOT_STAGES, new_name, three_workers

FAST = NodeHealth(lease_seconds=8, grace="10s", monitor_period="1s")
GRACE = 10
WATCH = 6 * GRACE


@pytest.fixture
def fast_env(project):
    yield from three_workers(project, node_health=FAST)


def health(env, dra: str, plugin: str, ibm: str) -> list[str]:
    """What is wrong right now (empty: healthy)."""
    core, wrong = env.core, []
    for name in (dra, plugin, ibm):
        node = core.read_node(name)
        ready = next(c for c in node.status.conditions if c.type == "Ready")
        if ready.status != "True":
            wrong.append(f"node {name} Ready={ready.status} ({ready.reason})")
        leases = client.CoordinationV1Api(env.cluster.api_client).list_namespaced_lease(
            "kube-node-lease", field_selector=f"metadata.name={name}").items
        age = time.time() - leases[0].spec.renew_time.timestamp() if leases else None
        if age is None or age > FAST.lease_seconds:
            wrong.append(f"lease of {name} " + ("missing" if age is None else f"last renewed {age:.0f} s ago"))
        for pod in core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}").items:
            if pod.status.phase == "Running" and not any(c.type == "Ready" and c.status == "True"
                                                         for c in pod.status.conditions or []):
                wrong.append(f"pod {pod.metadata.namespace}/{pod.metadata.name} on {name} not ready")
    for name in (plugin, ibm):
        offered = (core.read_node(name).status.allocatable or {}).get("nvidia.com/gpu", "0")
        if offered != "1":
            wrong.append(f"node {name} offers {offered} nvidia.com/gpu, not 1")
    slices = client.ResourceV1Api(env.cluster.api_client).list_resource_slice().items
    if not any(s.spec.node_name == dra and s.spec.devices for s in slices):
        wrong.append(f"no ResourceSlice offers the GPU of {dra}")
    return wrong


def test_nodes_and_gpus_stay_up_for_six_grace_periods(fast_env):
    env = fast_env
    result, _ = env.up(PILOT_STAGES)
    dra, plugin = new_name(result, A), new_name(result, B)
    end = time.monotonic() + WATCH
    while time.monotonic() < end:
        wrong = health(env, dra, plugin, C)
        assert not wrong, f"{WATCH - (end - time.monotonic()):.0f} s after the migration: {wrong}"
        time.sleep(1)
    # Not once, over the whole run, did the node-lifecycle controller find a node's Lease lapsed.
    lapsed = env.core.list_event_for_all_namespaces(field_selector="reason=NodeNotReady").items
    assert not lapsed, [(e.involved_object.name, e.message) for e in lapsed]
    # The doubles' cache followed the cluster throughout, across its watches' ends and bookmarks.
    assert env.cluster.cache.errors == [] and env.cluster.doubles.errors == []
