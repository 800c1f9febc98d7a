"""A fleet `pulumi up` under mocks, for batch timelines (tests/test_fleet_rollout.py) and benchmarks/fleet.py.

The program runs as declared (plan, gates, batches sequenced by rollout.py). Worker replacements run the real
WorkerReplacementProvider against the IKS emulator (each new worker deploys `replace_seconds` after the request) and
gates the real CapacityGate provider against the real API server (tests/envtest.py: the test's `kube`, or one started
for the run); everything else answers at once. The IKS emulator is linked to the API server as a VPC cluster is: a
worker being deleted leaves the cluster as a node, a deployed one joins it (named by its IP, prefixed with the test's
prefix as node names are cluster-wide there; NodeReady, labelled as a GPU node). Every change of GPU capacity goes to
a timeline.

Registrations block in the asyncio default executor, as they do in the Python language host, which sizes it
`--parallel` x 4 (pulumi/pulumi sdk/python/cmd/pulumi-language-python-exec `_set_default_executor`). `host_workers`
bounds concurrent provider operations (the SDK's provider host has 4, pulumi/dynamic/__main__.py, which the program
lifts: sdk_workarounds.widen_provider_host); None means unbounded, as the program runs.

Each worker is alone in its pool unless `shared_pool`: then all are in one pool and zone, and the replacements of a
batch tell their new workers apart by claiming them (NewWorkerClaims).
"""
import copy
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from harness import RecordingMocks, Registered, run_program, stack_config, unwrap
from pulumi.runtime.sync_await import _ensure_event_loop

from iks_gpu_migration.kube import capacity_gate, finished
from tests.emulators.iks import IksEmulator
from tests.envtest import EnvTest, Kube
from iks_gpu_migration.iks.replacement import WorkerReplacementProvider

GPU_LABELS = {"nvidia.com/gpu.present": "true"}
GATE = "pulumi-python:dynamic/gpu-migration:CapacityGate"
REPLACEMENT = "pulumi-python:dynamic/gpu-migration:WorkerReplacement"
SWITCH = "pulumi-python:dynamic/gpu-migration:NodePathSwitch"


@dataclass
class Change:
    at: float  # seconds since the run started
    event: str  # "left", "joined", "gate opened", "replace requested"
    node: str
    unavailable: int  # configured GPU nodes minus Ready GPU nodes, right after the change


@dataclass
class Timeline:
    fleet: int
    started: float = field(default_factory=time.monotonic)
    changes: list[Change] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, event: str, node: str, unavailable: int) -> None:
        with self.lock:
            self.changes.append(Change(time.monotonic() - self.started, event, node, unavailable))

    def max_unavailable(self) -> int:
        return max((c.unavailable for c in self.changes), default=0)


class FleetIks(IksEmulator):
    def __init__(self, kube: Kube, timeline: Timeline, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kube, self.timeline = kube, timeline
        self.nodes_lock = threading.Lock()  # a node change and the count after it, together

    def unavailable(self) -> int:
        ready = [n for n in self.kube.core.list_node(label_selector=",".join(f"{k}={v}" for k, v in GPU_LABELS.items())
                                                     ).items if n.metadata.name.startswith(self.kube.prefix)]
        return self.timeline.fleet - len(ready)

    def _new_worker(self, *args: Any, **kwargs: Any) -> dict:
        worker = super()._new_worker(*args, **kwargs)
        interface = worker["networkInterfaces"][0]
        interface["ipAddress"] = self.kube.name(interface["ipAddress"])  # its node's name on the shared API server
        return worker

    def _deploy(self, worker: dict) -> None:
        was = worker["lifecycle"]["actualState"]
        super()._deploy(worker)
        if was != "deployed" and worker["lifecycle"]["actualState"] == "deployed":
            name = worker["networkInterfaces"][0]["ipAddress"]
            with self.nodes_lock:
                self.kube.add_node(name, labels=GPU_LABELS)
                self.timeline.add("joined", name, self.unavailable())

    def _delete_worker(self, worker: dict, reason: str) -> None:
        super()._delete_worker(worker, reason)
        name = worker["networkInterfaces"][0]["ipAddress"]
        with self.nodes_lock:
            if self.kube.node_or_none(name) is not None:
                self.kube.delete_node(name)
                self.timeline.add("left", name, self.unavailable())


class FleetMocks(RecordingMocks):
    def __init__(self, iks: FleetIks, kubeconfig: str, host_workers: Optional[int], fail: frozenset = frozenset()):
        super().__init__()
        self.iks, self.kubeconfig, self.fail = iks, kubeconfig, fail
        self.host = threading.Semaphore(host_workers) if host_workers else None
        self.outputs: dict[str, dict] = {}
        self.inflight = 0
        self.idle = threading.Condition()

    def wait_idle(self, timeout: float) -> None:
        """As the engine does after a failed step: in-flight operations run to their end (pulumi/pulumi
        pkg/resource/deploy/step_executor.go cancelDueToError stops new steps, WaitForCompletion waits for workers)."""
        with self.idle:
            self.idle.wait_for(lambda: self.inflight == 0, timeout)

    def new_resource(self, args):
        if args.typ == SWITCH and args.inputs.get("target") != "dra":  # played here: as its last step does
            finished.record(str(args.inputs.get("node") or ""), str(args.inputs.get("config_name") or ""))
        if args.typ not in (GATE, REPLACEMENT):
            return super().new_resource(args)
        self.registered.append(Registered(args.typ, args.name, dict(args.inputs)))
        props = {k: v for k, v in unwrap(dict(args.inputs)).items() if k != "__provider"}
        with self.idle:
            self.inflight += 1
        if self.host:
            self.host.acquire()
        try:
            if args.typ == GATE:
                outs = capacity_gate._CapacityGateProvider().create({**props, "kubeconfig": self.kubeconfig}).outs
                self.iks.timeline.add("gate opened", args.name, self.iks.unavailable())
            else:
                if props["node_name"] in self.fail:
                    self.iks.refuse_replace[props["worker_id"]] = (409, "injected: replacement refused")
                self.iks.timeline.add("replace requested", props["node_name"], self.iks.unavailable())
                outs = WorkerReplacementProvider().create({**props, "api": self.iks.api()}).outs
            self.outputs[args.name] = outs
        finally:
            if self.host:
                self.host.release()
            with self.idle:
                self.inflight -= 1
                self.idle.notify_all()
        return f"{args.name}-id", outs


@dataclass
class FleetRun:
    timeline: Timeline
    wall: float
    error: Optional[BaseException]
    mocks: FleetMocks
    iks: FleetIks
    kube: Kube


def fleet_up(n: int, max_unavailable: str, replace_seconds: float, tmp_dir, host_workers: Optional[int] = None,
             poll_interval: float = 0.02, fail: frozenset = frozenset(), cordoned: tuple = (),
             capacity_timeout: float = 60, setup: Optional[Callable[[Kube], None]] = None,
             shared_pool: bool = False, kube: Optional[Kube] = None) -> FleetRun:
    """`pulumi up` of n device-plugin nodes (already at the target master version) under budget max_unavailable;
    `setup(kube)` may arrange the cluster further (e.g. changes triggered while gates poll). `kube`: the test's
    view of the session's API server (tests/conftest.py); without it an API server is started for this run. The
    run's nodes are deleted when it ends."""
    env = None
    if kube is None:
        env = EnvTest().start()
        kube = Kube(env, env.next_prefix())
    timeline = Timeline(fleet=n)
    iks = FleetIks(kube, timeline, cluster="gpu-pilot", master_version="1.37.0_1501", api_key="test-api-key").start()
    iks.provision_seconds = replace_seconds
    try:
        nodes = []
        for i in range(n):
            worker = iks.add_worker(pool_name="gpu" if shared_pool else f"gpu-{i}", version="1.36.1_1530")
            name = worker["networkInterfaces"][0]["ipAddress"]
            kube.add_node(name, labels=GPU_LABELS)
            nodes.append({"name": name, "workerId": worker["id"], "stage": "device-plugin"})
        for name in cordoned:  # unavailable for reasons of their own
            kube.cordon(name)
        if setup:
            setup(kube)
        raw = copy.deepcopy(stack_config("pilot"))
        raw.update(nodes=nodes, maxUnavailable=max_unavailable, kubeconfig=kube.kubeconfig,
                   ibmCloud={"endpoint": iks.url, "iamEndpoint": iks.url, "allowCustomEndpoints": True},
                   timeouts={"workerReplace": 60 + 10 * replace_seconds, "capacityGate": capacity_timeout,
                             "pollInterval": poll_interval})
        mocks = FleetMocks(iks, raw["kubeconfig"], host_workers, fail)
        _ensure_event_loop().set_default_executor(ThreadPoolExecutor(max_workers=4 * (n + 8)))
        error = None
        timeline.started = started = time.monotonic()
        try:
            run_program(raw, secrets={"ibmApiKey": "test-api-key"}, mocks=mocks)
        except Exception as e:  # noqa: BLE001 - the caller judges it
            error = e
        mocks.wait_idle(timeout=60 + 10 * replace_seconds)
        return FleetRun(timeline, time.monotonic() - started, error, mocks, iks, kube)
    finally:
        iks.stop()
        for node in kube.core.list_node().items:  # the next run (or test) starts without this run's nodes
            if node.metadata.name.startswith(kube.prefix):
                kube.delete_node(node.metadata.name)
        if env is not None:
            env.stop()
