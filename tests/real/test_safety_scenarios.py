"""The migration's safety rules under the real Pulumi CLI and engine, against the local control plane and the IKS
emulator (each test gets its own cluster): the GPU Operator never runs next to IBM's drivers, a node that fails its
checks stops the nodes after it, a dra node stays cordoned until its smoke test passed, a second `up` changes
nothing, `up` stops, naming the culprit, on a config or cluster it must not act on, and a rollback of the last dra
node goes step by step and then removes the DRA path.

A `Recorder` watches Nodes, Pods and ResourceSlices throughout, so the tests see what happened in between, not only
the end."""
import json
import re

import pytest
from pulumi.automation import CommandError

from gpu_migration_local.gpu_doubles import IBM_DRIVER_ANNOTATION, OPERANDS_LABEL, gpu_uuid

from .kube import eventually
from .project import meaningful
from .recorder import Recorder
from .scenario_env import A, B, C, PILOT, PILOT_STAGES, PLUGIN, VERIFICATION, WORKERS, Events, new_name

DRIVER_LABEL = "nvidia.com/gpu.deploy.driver"
REPLACE = "/v2/vpc/replaceWorker"
NVIDIA_NAMESPACES = ("gpu-operator", "nvidia-dra-driver-gpu")  # the operator's operands, the DRA kubelet plugin


def record_iks_writes(iks) -> list[tuple[str, str, dict]]:
    """(method, path, body) of every IKS request that may change something, from now on (the emulator keeps no
    bodies)."""
    writes, route = [], iks.route

    def recording(method, path, query, body, *role):  # role: the caller's IAM role (the emulator enforces it)
        if method != "GET":
            writes.append((method, path, body))
        return route(method, path, query, body, *role)
    iks.route = recording
    return writes


def replaced(writes) -> list[str]:
    """Worker IDs of the replaceWorker requests, in order."""
    return [body.get("workerID") for method, path, body in writes if (method, path) == ("POST", REPLACE)]


def resources(stack) -> dict[str, dict]:
    """Resource name -> its state in the stack (outputs, inputs, type)."""
    return {r["urn"].rsplit("::", 1)[1]: r for r in stack.export_stack().deployment.get("resources", [])}


def started(events: Events) -> set[str]:
    return {name for op, name, kind in events.steps if kind == "pre" and op != "same"}


def changed(events: Events) -> dict[str, str]:
    """Resources the engine did something to (not `same`, not providers), by operation."""
    return {name: op for op, name, kind in events.steps
            if kind == "pre" and op != "same" and not name.startswith("default")}


def failing_up(env, stages: dict[str, str], **extra) -> tuple[str, Events]:
    env.project.write_stack(env.config(stages, **extra))
    events = Events()
    with pytest.raises(CommandError) as failed:
        env.project.stack().up(on_output=print, on_event=events)
    return str(failed.value), events


def deploy_labels(labels: dict) -> dict:
    return {k: v for k, v in labels.items() if k.startswith("nvidia.com/gpu.deploy.")}


def test_gpu_operator_never_runs_next_to_ibm_drivers(env, capsys):
    writes = record_iks_writes(env.iks)
    with Recorder(env.cluster.kubeconfig) as rec:
        result, events = env.up(PILOT_STAGES)
    ibm = {s.name for s in rec.nodes if s.annotations.get(IBM_DRIVER_ANNOTATION) == "true"}
    assert ibm == {A, B, C}
    new_a, new_b = new_name(result, A), new_name(result, B)

    # No operand or DRA plugin pod was ever bound to a node with IBM's drivers; none was ever told to go there.
    # NFD's worker (the chart's subchart) runs on every node, as it does on IKS: it only reads the hardware. Only the
    # nodes that stay are sure to get one: the first node can be drained and gone before the DaemonSet controller
    # reaches it (the CI failure of 084ef86).
    daemon_pods = [p for p in rec.pods if p.namespace in NVIDIA_NAMESPACES and p.owner == "DaemonSet" and p.node]
    nfd = [p for p in daemon_pods if p.name.startswith("gpu-operator-node-feature-discovery-worker-")]
    assert {p.node for p in nfd} >= {C, new_a, new_b}
    assert [p for p in daemon_pods if p.node in ibm and p not in nfd] == []
    assert {p.node for p in daemon_pods if p.name.startswith("nvidia-driver-daemonset-")} == {new_a, new_b}
    assert [(s.name, deploy_labels(s.labels)) for s in rec.nodes
            if s.name in ibm and "true" in deploy_labels(s.labels).values()] == []
    # Every node on IBM's drivers was fenced before the operator was installed.
    operator = events.index("gpu-operator", "pre")
    assert max(events.index(f"{n}-fence", "done") for n in (A, B, C)) < operator
    assert events.index(f"{C}-labels", "done") < operator

    # The ibm-managed node: fenced with both runbook labels, then the operator deleted deploy.driver
    # (removeAllGPUStateLabels) and only deploy.operands=false is left; never cordoned, verified or replaced.
    c_states = rec.of_node(C)
    fenced = next(i for i, s in enumerate(c_states) if s.labels.get(DRIVER_LABEL) == "false")
    assert any(DRIVER_LABEL not in s.labels for s in c_states[fenced:])
    assert deploy_labels(env.node(C).metadata.labels) == {OPERANDS_LABEL: "false"}
    assert not any(s.unschedulable for s in c_states) and VERIFICATION not in c_states[-1].annotations
    assert WORKERS[C] not in replaced(writes) and env.iks.workers[WORKERS[C]]["lifecycle"]["desiredState"] == "deployed"

    # What else the fresh up did: the master went 1.35 -> 1.36 -> 1.37 (one minor at a time); the workers were
    # replaced once each, in config order; their nodes are new, the old ones left with them; nothing asks the user
    # to rename the config entries.
    masters = [body.get("version") for method, path, body in writes if path == f"/v1/clusters/{env.iks.cluster_name}"]
    assert masters == ["1.36", "1.37"] and env.iks.cluster["masterKubeVersion"].startswith("1.37.")
    assert replaced(writes) == [WORKERS[A], WORKERS[B]]
    state = resources(env.project.stack())
    for config_name, node in ((A, new_a), (B, new_b)):
        outs = state[f"{config_name}-replacement"]["outputs"]
        worker = env.iks.workers[outs["new_worker_id"]]
        assert outs["old_worker_id"] == WORKERS[config_name] != outs["new_worker_id"]
        assert node == worker["networkInterfaces"][0]["ipAddress"] and node not in (A, B, C)
        assert worker["kubeVersion"]["actual"] == env.iks.worker_versions["1.37"]  # newest worker fix pack
        assert config_name not in {n.metadata.name for n in env.core.list_node().items}
    output = capsys.readouterr().out
    # The rename is said as info (the new node is in state), never as a warning to edit gpu-migration:nodes.
    assert "replaced; its node is now" in output
    assert not [line for line in output.splitlines() if "warning" in line and "gpu-migration:nodes" in line]


def test_failed_readiness_of_node_1_stops_node_2_and_the_dra_path(env):
    env.cluster.doubles.publish_slices = False  # the DRA kubelet plugin runs, but no devices appear on the dra node
    writes = record_iks_writes(env.iks)
    timeouts = {**env.config(PILOT_STAGES)["timeouts"], "operatorReady": 8}
    with Recorder(env.cluster.kubeconfig) as rec:
        message, events = failing_up(env, PILOT_STAGES, timeouts=timeouts)
    new_a = resources(env.project.stack())[f"{A}-replacement"]["outputs"]["node_name"]
    assert f"GPU Operator on node {new_a} (dra) did not pass" in message
    assert f"node {new_a}: no DRA devices in ResourceSlices of driver gpu.nvidia.com" in message
    # Node 2 is not replaced, and nothing of the DRA verification ran.
    assert replaced(writes) == [WORKERS[A]]
    assert env.iks.workers[WORKERS[B]]["lifecycle"]["desiredState"] == "deployed"
    state = resources(env.project.stack())
    for name in (f"{B}-replacement", f"{A}-dra-preflight", f"smoke-{A}", f"{A}-smoke-verification"):
        assert name not in state and name not in started(events)
    assert [p for p in rec.pods if p.namespace == "gpu-pilot"] == []
    # The dra node stays cordoned: its switch cordoned it, and only a passed smoke test uncordons it.
    assert env.node(new_a).spec.unschedulable


def test_dra_node_stays_cordoned_until_its_smoke_test_passed(env):
    with Recorder(env.cluster.kubeconfig) as rec:
        result, _ = env.up(PILOT_STAGES)
    new_a, new_b = new_name(result, A), new_name(result, B)
    states = rec.of_node(new_a)

    def first(what, predicate, start=0):
        found = next((i for i, s in enumerate(states) if i >= start and predicate(s)), None)
        assert found is not None, f"node {new_a} never showed {what}: {states}"
        return found

    def record(s):
        return json.loads(s.annotations.get(VERIFICATION, "{}"))

    cordon = first("a cordon", lambda s: s.unschedulable)
    plugin_off = first("the device plugin off", lambda s: s.labels.get(PLUGIN) == "false")
    pilot = first("the pilot label", lambda s: s.labels.get(PILOT) == "pilot")
    passed = first("a passed smoke test", lambda s: record(s).get("result") == "passed")
    uncordon = first("an uncordon", lambda s: not s.unschedulable, start=cordon)
    # Never one patch: cordon, then the device plugin off, then the pilot label; the smoke test's pass is recorded
    # while the node is still cordoned, and only then is it uncordoned, once.
    assert cordon < plugin_off < pilot < passed < uncordon, (cordon, plugin_off, pilot, passed, uncordon)
    assert all(s.unschedulable for s in states[cordon:uncordon])
    assert not any(s.unschedulable for s in states[uncordon:])
    assert record(states[passed])["pod"] == f"gpu-pilot/gpu-smoke-test-{A}"

    # What else the fresh up left on the DRA path: devices only on the dra node, the preflight checked it, the smoke
    # pod used its first GPU through DRA and the record says so; the device-plugin node keeps its plugin.
    slices = env.cluster.doubles.custom.list_cluster_custom_object("resource.k8s.io", "v1", "resourceslices")["items"]
    assert {s["spec"]["nodeName"] for s in slices} == {new_a}
    state = resources(env.project.stack())
    assert state[f"{A}-dra-preflight"]["outputs"]["checked_nodes"] == [new_a]
    assert state[f"{A}-smoke-verification"]["outputs"]["device"] == f"gpu.nvidia.com/{new_a}/gpu-0"
    final = env.record(new_a)
    assert (final["path"], final["result"], final["problems"]) == ("dra", "passed", [])
    b_labels = env.node(new_b).metadata.labels
    assert PILOT not in b_labels and b_labels.get(PLUGIN) == "true"  # the operator's own label, never switched off


def test_a_second_up_changes_nothing_although_the_operator_deleted_a_label(env):
    with Recorder(env.cluster.kubeconfig) as first_rec:
        env.up(PILOT_STAGES)
    # The fence set deploy.driver=false on the ibm-managed node; the GPU Operator then deleted it
    # (removeAllGPUStateLabels), although the program had set it.
    c_states = first_rec.of_node(C)
    fenced = next(i for i, s in enumerate(c_states) if s.labels.get(DRIVER_LABEL) == "false")
    assert DRIVER_LABEL not in c_states[-1].labels and fenced < len(c_states) - 1
    before = {n.metadata.name: (n.metadata.labels, n.metadata.annotations, bool(n.spec.unschedulable), n.spec.taints)
              for n in env.core.list_node().items}
    writes = record_iks_writes(env.iks)

    with Recorder(env.cluster.kubeconfig) as rec:
        _, events = env.up(PILOT_STAGES)
    # No node was written to: labels, annotations, cordon and taints as before, all through the run.
    moved = [s for s in rec.nodes if (s.labels, s.annotations, s.unschedulable) != before.get(s.name, ())[:3]]
    assert moved == []
    assert {n.metadata.name: n.spec.taints for n in env.core.list_node().items} == \
        {name: b[3] for name, b in before.items()}
    # The engine changed nothing but the read-only checks that run on every up; IKS got no request that changes.
    assert meaningful({name: op for name, op in changed(events).items()}) == {}
    assert writes == []


def test_a_replaced_node_set_back_to_ibm_managed_is_refused(env):
    first, _ = env.up(PILOT_STAGES)
    new_b = new_name(first, B)
    cfg = env.config(PILOT_STAGES)
    cfg["nodes"][1].update(name=new_b, stage="ibm-managed")
    env.project.write_stack(cfg)
    events = Events()
    with Recorder(env.cluster.kubeconfig) as rec, pytest.raises(CommandError) as failed:
        env.project.stack().up(on_output=print, on_event=events)
    assert f"node {new_b} is set to stage ibm-managed but runs kubelet v1.37" in str(failed.value)
    assert "going back to ibm-managed is not supported" in str(failed.value)
    # The node was never fenced off the operator (that would take its GPUs away).
    assert [s for s in rec.of_node(new_b) if s.labels.get(OPERANDS_LABEL) == "false"] == []
    assert env.node(new_b).status.allocatable["nvidia.com/gpu"] == "1"


def test_operator_pods_on_an_ibm_managed_node_stop_up_naming_node_and_pods(env):
    # Another automation removes the fence from the IBM-managed node as soon as it is set: the real operator then
    # labels the node like any other GPU node (deploy.driver=false, set by the fence, it keeps: addGPUStateLabels
    # honours a label that is there) and its DaemonSets put their pods there, one state after the other (toolkit
    # first, the device plugin once the earlier states are ready): the check names whichever it finds.
    env.cluster.doubles.fence_removed_by_someone = True
    writes = record_iks_writes(env.iks)
    message, events = failing_up(env, PILOT_STAGES)
    culprit = next((line for line in message.splitlines()
                    if f"node {C}: runs IBM-managed drivers (kubelet v1.35" in line
                    and "below 1.36) but has GPU Operator pods " in line), "")
    assert re.search(r"gpu-operator/nvidia-(container-toolkit|device-plugin)-daemonset-", culprit), message
    assert "GPU Operator pods run on nodes with IBM-managed drivers" in message
    # Nothing past the check: the second node and the ibm-managed one are never replaced. (Whether the check after
    # the operator's install or the one after node 1's readiness sees the pods first depends on when the DaemonSet
    # controller creates them; either stops node 2.)
    assert WORKERS[B] not in replaced(writes) and WORKERS[C] not in replaced(writes)
    assert f"{B}-replacement" not in started(events)
    assert {f"{A}-smoke-verification", f"{A}-dra-preflight"}.isdisjoint(started(events))


def training_pod(node: str, seconds: int, name: str = "training") -> dict:
    """A GPU workload the real scheduler places on `node` through whichever path offers nvidia.com/gpu there."""
    return {"metadata": {"name": name, "namespace": "ml"},
            "spec": {"restartPolicy": "Never", "nodeSelector": {"kubernetes.io/hostname": node},
                     "containers": [{"name": "train", "image": "nvcr.io/nvidia/cuda:12.9.1-base-ubi9",
                                     "command": ["sh", "-c", f"nvidia-smi -L && sleep {seconds}"],
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def test_rollback_of_the_last_dra_node_goes_step_by_step_and_removes_the_dra_path(env):
    first, _ = env.up(PILOT_STAGES)
    new_a, new_b = new_name(first, A), new_name(first, B)
    # A GPU workload runs on the dra node (through DRA) and finishes while the rollback's drain waits for it.
    env.core.create_namespace({"metadata": {"name": "ml"}})
    env.core.create_namespaced_pod("ml", training_pod(new_a, 12))
    eventually(lambda: (p := env.core.read_namespaced_pod("training", "ml")).status.phase == "Running"
               and p.status.extended_resource_claim_status, "the training pod running on a DRA GPU")

    with Recorder(env.cluster.kubeconfig) as rec:
        second, events = env.up({**PILOT_STAGES, A: "device-plugin"})
    node = rec.of_node(new_a)

    def rv(what, states, predicate, after=0):
        found = next((s.rv for s in states if s.rv > after and predicate(s)), None)
        assert found is not None, f"never saw {what}: {states}"
        return found

    cordon = rv("the cordon", node, lambda s: s.unschedulable)
    finished = rv("the training pod's end", rec.pod("ml", "training"), lambda s: s.phase == "Succeeded")
    unlabel = rv("the pilot label removed", node, lambda s: PILOT not in s.labels)
    wiped = rv("the node's slices wiped", rec.slices, lambda s: s.node == new_a and s.event == "DELETED")
    plugin_on = rv("the device plugin on", node, lambda s: s.labels.get(PLUGIN) == "true")
    checked = rv("the check pod bound", rec.pod("gpu-pilot", f"gpu-rollback-check-{new_a}-"),
                 lambda s: s.node == new_a)
    uncordon = rv("the uncordon", node, lambda s: not s.unschedulable, after=cordon)
    assert cordon < finished < unlabel < wiped < plugin_on < checked < uncordon, \
        (cordon, finished, unlabel, wiped, plugin_on, checked, uncordon)
    assert all(s.unschedulable for s in node if cordon <= s.rv < uncordon)

    # The check pod got its GPU from the returning device plugin and was deleted; the record says so.
    state = resources(env.project.stack())
    assert state[f"{A}-switch"]["outputs"]["gpu_uuid"] == gpu_uuid(new_a, 0)  # its rollback check's GPU
    assert state[f"{A}-switch"]["outputs"]["rolling_back"] is True
    assert state[f"{B}-switch"]["outputs"]["rolling_back"] is False
    assert env.core.list_namespaced_pod("gpu-pilot").items == []
    record = env.record(new_a)
    assert (record["path"], record["result"], record["gpu"]) == ("device-plugin", "passed", gpu_uuid(new_a, 0))
    # Final state: plugin back, no DRA devices, uncordoned; nothing replaced again; the other node never cordoned.
    final = env.node(new_a)
    assert not final.spec.unschedulable and final.status.allocatable["nvidia.com/gpu"] == "1"
    assert PILOT not in final.metadata.labels and final.metadata.labels[PLUGIN] == "true"
    assert env.cluster.doubles.custom.list_cluster_custom_object("resource.k8s.io", "v1", "resourceslices")["items"] \
        == []
    assert env.iks.count("POST", REPLACE) == 2
    assert not any(s.unschedulable for s in rec.of_node(new_b))
    # The last dra node left: the DRA driver, DeviceClass, smoke test and preflight go, after the rollback.
    removed = {"dra-driver", "device-class", f"smoke-{A}", f"{A}-smoke-verification", f"{A}-dra-preflight"}
    deleted = {name: i for i, (op, name, kind) in enumerate(events.steps) if op == "delete" and kind == "pre"}
    assert removed <= set(deleted), deleted
    assert min(deleted[n] for n in removed) > events.index(f"{A}-switch", "done")
    assert removed.isdisjoint(state)
    classes = env.cluster.doubles.custom.list_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses")["items"]
    assert [c["metadata"]["name"] for c in classes if c["spec"].get("extendedResourceName")] == []


def test_no_gpu_is_offered_on_both_paths_during_a_switch_or_a_rollback_with_a_long_running_pod(env):
    """Issue 9, point 5: a device-plugin pod holding B's GPU while B moves to DRA, then a DRA pod holding it while B
    moves back. At no recorded moment does the node offer its GPU through the device plugin (allocatable) while it
    has ResourceSlices, and the held GPU is offered on the other path only after its pod finished."""
    first, _ = env.up(PILOT_STAGES)
    new_b = new_name(first, B)
    env.core.create_namespace({"metadata": {"name": "ml"}})

    def running(name):
        return eventually(lambda: (p := env.core.read_namespaced_pod(name, "ml")).status.phase == "Running" and p,
                          f"pod ml/{name} running on {new_b}")

    def succeeded_rv(rec, name):
        done = [s.rv for s in rec.pod("ml", name) if s.phase == "Succeeded"]
        assert done, f"pod ml/{name} still held its GPU when `up` ended: {rec.pod('ml', name)}"
        return done[0]

    def assert_one_path_at_a_time(offers):
        both = [(rv, plugin, slices) for rv, plugin, slices in offers if plugin and slices]
        assert not both, f"node {new_b} offered its GPU on both paths at (rv, plugin GPUs, slices): {both}"

    # Forward: the real scheduler gives the pod B's GPU through the device plugin (no DRA claim).
    env.core.create_namespaced_pod("ml", training_pod(new_b, 12, "on-plugin"))
    assert running("on-plugin").status.extended_resource_claim_status is None
    with Recorder(env.cluster.kubeconfig) as rec:
        env.up({**PILOT_STAGES, B: "dra"})
    offers = rec.offers(new_b, "nvidia.com/gpu")
    assert offers[0][1:] == (1, 0) and offers[-1][1:] == (0, 1), offers  # from the plugin's GPU to one DRA slice
    assert_one_path_at_a_time(offers)
    published = next(rv for rv, _, slices in offers if slices)
    # The GPU the pod held reappears as a DRA device only once the pod is done (else two pods could get it).
    finished = succeeded_rv(rec, "on-plugin")
    assert finished < published, (finished, published)

    # Rollback: this time the pod holds the GPU through DRA (a claim the scheduler generated).
    env.core.create_namespaced_pod("ml", training_pod(new_b, 12, "on-dra"))
    assert running("on-dra").status.extended_resource_claim_status is not None
    with Recorder(env.cluster.kubeconfig) as rec:
        env.up(PILOT_STAGES)
    offers = rec.offers(new_b, "nvidia.com/gpu")
    assert offers[0][1:] == (0, 1) and offers[-1][1:] == (1, 0), offers
    assert_one_path_at_a_time(offers)
    plugin_back = next(rv for rv, plugin, _ in offers if plugin)
    finished = succeeded_rv(rec, "on-dra")
    assert finished < plugin_back, (finished, plugin_back)
