"""A local IKS (VPC) + IAM API emulator: real HTTP on 127.0.0.1, state machines advanced per API request.

Serves what iks_gpu_migration/iks/api.py calls, plus POST /identity/token. Every authenticated IKS request is one
"tick": provisioning workers, deleting workers, updating masters and deleting pools each finish after `steps`
ticks (default 2), so tests with poll intervals of ~0.01 s run in milliseconds.

Fault injection:
  fail_next(n, status=503, path=...)  n responses of `status` (then normal service)
  expire_tokens()                     every token issued so far answers 401 (as if expired/revoked)
  expire_tokens_on(path)              the same, once, when the next request for `path` arrives
  stick(worker_id) / stick_new_workers  a worker (or every new one) stays in provisioning forever
  refuse_replace[worker_id] = (status, description)  replaceWorker answers that error and changes nothing
  replace_lag = n                     an accepted replace shows (old deleting, new provisioning) only n ticks later
  fail_new_workers = (state, message)  new workers end in e.g. provision_failed with that message (a GPU flavor out
                                      of stock in the zone); with fail_new_workers_in = {(pool name, zone)} only there
  flap_new_workers = n                new workers' health goes normal/critical/normal... for n ticks once deployed
  rebalance = False                   a replace deletes the old worker and creates none, whatever the pool says
  set_autobalance(pool, zone, False)  the pool's automatic rebalancing off in a zone (autobalanceEnabled: false)
  autoscale(pool)                     the cluster autoscaler manages the pool (autoscaleEnabled: true)
  fail_master_update = True           the next master update falls back to deployed at the old version
  busy_master(ticks)                  masterStatus is not Ready for `ticks` ticks (e.g. a CA rotation)
  answer_after_done(n, status, path)  n requests are carried out, then answered with `status` (a lost response)
  provision_seconds = T               new workers deploy T seconds (wall clock) after they were created instead of
                                      after `steps` ticks: the replacement time of benchmarks. Applied at the next
                                      request or the next pass of iks_nodes.IksNodeSync (run_due), so the Node
                                      registers at T as a kubelet would, whether or not anyone polls IKS then
  provision_seconds_for[old ID] = T   the replacement of that worker takes T instead (a slow node)

Behaviour of the real service modelled here, with its source (see /work/shared/reference/iks-api.md):
- worker fix packs: new workers get the master's major.minor with the newest *worker* fix pack, which may differ
  from the master's build either way (ibm-cloud-docs/containers update.md#vpc_worker_node, "Worker nodes can run
  later patch versions than the master") -> `worker_versions`.
- deleted workers and pools stay readable: getWorker / getWorkers?showDeleted=true return them with
  actualState/health `deleted`; getWorkerPool answers 200 with lifecycle deleted and zones [] (terraform-provider-ibm
  resource_ibm_container_vpc_worker_pool.go delete wait and issue #3595; resource_ibm_container_vpc_worker.go).
- master: `updating` while updating, may fail back to `deployed` at the old version with targetVersion left newer;
  a PUT while masterStatus is not Ready is refused with 400 Ef9cc (terraform-provider-ibm
  resource_ibm_container_vpc_cluster.go waitForVpcClusterMasterAvailable; ibm-cloud-docs cluster-states-reference).
- 404 G0004 for an unknown cluster (bluemix-go containerv2 clusters.go error bodies; IBM docs).
- with automatic rebalancing off a replace creates no new worker (ibm-cloud-docs auto-rebalance-off: "A replacement
  worker node is not created if the worker pool does not have automatic rebalancing enabled"); the pool shows it as
  `autobalanceEnabled` per zone, autoscaling as `autoscaleEnabled` (container-services-go-sdk GetWorkerPoolResponse).
- an autoscaled pool is not rebalanced by IKS ("you can't resize or rebalance your worker pools" once the autoscaler
  manages them, ibm-cloud-docs cluster-scaling-install-addon-enable): modelled as a replace that creates no worker
  (what the autoscaler would do later is not modelled).
- the master takes major.minor only ({"action": "update", "version": "1.36"}, iks-api.md; IKS picks the patch): a
  version with a patch or fix pack is refused here (the real answer to one is not documented).
- IAM platform roles on containers-kubernetes: every API key maps to a role (`keys`, `grant`; the default key is an
  Operator). Reads (cluster.read) need Viewer; master update, replaceWorker, createWorkerPool and worker pool delete
  (cluster.operate) need Operator (ibm-cloud-docs/containers api-at-iam.md, iam-platform-access-roles.md). A Viewer's
  operate call is refused with 403 in IKS's error shape, {incidentID, code, description}, as IKS refuses an action the
  caller's IAM role lacks (terraform-provider-ibm issue #6816: 403, code A0656, "You are not authorized to ... you
  must have the Operator role ..."); the code and wording for these four calls are the emulator's own (IBM publishes
  neither), and nothing is changed.
- n-2: workers may be at most two minor versions behind the master; without `force` (`ibmcloud ks cluster master
  update --force-update`) an update leaving a worker further behind is refused (ibm-cloud-docs update.md,
  cs_versions.md; the error code and wording here are the emulator's own, the real ones are not public).

Request log for ordering assertions: `requests` (every request, in order); `replace_log` [(request index, worker)];
`created_at` {worker: request index at which it was created}; `deployed_at` {worker: request index at which it
reached deployed and Ready}; `first_listed` {worker: index of the first
getWorkers/getWorker answer that showed it}.
"""
import itertools
import threading
import time
from typing import Any, Callable, Optional

from gpu_migration_local.http_server import LocalServer
from gpu_migration_local.iks_routes import Error, IksRoutes  # noqa: F401 - Error: iks_emulator.Error


class IksEmulator(IksRoutes):
    """The emulator's state, seeding, faults and worker state machine; its HTTP side: IksRoutes (iks_routes.py)."""

    def __init__(self, cluster: str = "gpu-cluster", master_version: str = "1.35.4_1540",
                 api_key: str = "test-api-key", steps: int = 2, port: int = 0) -> None:
        self.cluster_name, self.api_key, self.steps = cluster, api_key, steps
        self.versions = {"1.35": "1.35.4_1540", "1.36": "1.36.1_1530", "1.37": "1.37.0_1501"}
        # The newest worker fix pack per major.minor: one newer, one older than the master's (either direction).
        self.worker_versions = {"1.35": "1.35.4_1541", "1.36": "1.36.1_1531", "1.37": "1.37.0_1499"}
        self.cluster = {
            "id": f"{cluster}-id", "name": cluster, "masterKubeVersion": master_version,
            "targetVersion": master_version, "state": "normal", "provider": "vpc-gen2", "type": "kubernetes",
            "lifecycle": {"masterStatus": "Ready", "masterState": "deployed", "masterHealth": "normal"},
        }
        self.workers: dict[str, dict] = {}
        self.pools: dict[str, dict] = {}  # by pool ID
        self.lock = threading.RLock()
        self.requests: list[tuple[str, str]] = []  # (method, path) of every request, IAM included
        self.replaced: list[str] = []  # workerID of every replaceWorker request, in order (refused ones too)
        self.master_requests: list[dict] = []  # body of every master update request, in order
        self.replace_log: list[tuple[int, str]] = []  # (request index, workerID) of every replaceWorker request
        self.created_at: dict[str, int] = {}  # worker ID -> index of the request during which it was created
        self.first_listed: dict[str, int] = {}  # worker ID -> index of the first answer that showed it
        self.deployed_at: dict[str, int] = {}  # worker ID -> index of the request during which it deployed
        self.tokens: dict[str, bool] = {}  # token -> still valid
        self.keys: dict[str, str] = {api_key: "Operator"}  # API key -> IAM platform role on this cluster
        self.token_roles: dict[str, str] = {}  # token -> the role of the key it was issued for
        self.refused: list[tuple[str, str]] = []  # (method, path) of every call refused for the caller's role
        self.refuse_replace: dict[str, tuple[int, str]] = {}
        self.refuse_master_update: Optional[tuple[int, str]] = None
        self.stuck: set[str] = set()
        self.stick_new_workers = False
        self.replace_lag = 0
        self.fail_new_workers: Optional[tuple[str, str]] = None
        self.fail_new_workers_in: Optional[set[tuple[str, str]]] = None  # (pool name, zone); None: every pool
        self.flap_new_workers = 0
        self.flapping: set[str] = set()  # workers whose health still flaps
        self.rebalance = True
        self.fail_master_update = False
        self.busy_on_update = 0  # the next n PUTs meet a master operation that just started (-> 400 Ef9cc)
        self._answer_after: list[list[Any]] = []  # [remaining, status, path-substring]
        self.provision_seconds: Optional[float] = None
        self.provision_seconds_for: dict[str, float] = {}  # old worker ID -> its replacement's provisioning time
        self._timed: list[list[Any]] = []  # [monotonic deadline, callback]
        self._replacing: set[str] = set()  # accepted replaces not visible yet (replace_lag)
        self._replacing_now = ""
        self._faults: list[list[Any]] = []  # [remaining, status, path-substring]
        self._expire_on: list[str] = []
        self._pending: list[list[Any]] = []  # [ticks left, callback]
        self._ids = itertools.count(1)
        # The new worker's primary IP (its node name) from its ID counter; fleets of hundreds of workers (benchmarks)
        # give one that never repeats.
        self.ip_of: Callable[[int], str] = lambda n: f"10.240.0.{n % 250 + 2}"
        self.server = LocalServer(self._handle, methods=("GET", "POST", "PUT", "DELETE"), poll_interval=0.01,
                                  port=port)

    # Lifecycle --------------------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> "IksEmulator":
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()

    def api(self, api_key: Optional[str] = "test-api-key") -> dict[str, Any]:
        """The providers' `api` input for this emulator (fast SDK retries)."""
        return {"endpoint": self.url, "iam_endpoint": self.url, "api_key": api_key,
                "max_retries": 4, "retry_interval": 0.01}

    # Seeding and faults -----------------------------------------------------------------------------------------
    def add_pool(self, name: str, zone: str = "us-south-1", flavor: str = "gx3.16x80.l4", size: int = 0) -> dict:
        with self.lock:
            pool = {"id": f"{name}-{next(self._ids):04x}", "poolName": name, "flavor": flavor, "vpcID": "vpc-1",
                    "workerCount": size, "autoscaleEnabled": False,
                    "zones": [{"id": zone, "workerCount": size, "subnets": [], "autobalanceEnabled": True}],
                    "lifecycle": {"actualState": "active", "desiredState": "active"}}
            self.pools[pool["id"]] = pool
            return pool

    def add_worker(self, pool_name: str = "gpu", zone: str = "us-south-1", version: str = "1.35.4_1540",
                   state: str = "deployed", worker_id: Optional[str] = None, grow: bool = True) -> dict:
        """A worker in pool `pool_name` (created if missing); `grow`: the zone's size grows by one."""
        with self.lock:
            pool = self._pool(pool_name, live=True) or self.add_pool(pool_name, zone)
            zone_entry = next((z for z in pool["zones"] if z["id"] == zone), None)
            if zone_entry is None:  # a pool spans zones (`ibmcloud ks zone add vpc-gen2`)
                zone_entry = {"id": zone, "workerCount": 0, "subnets": [], "autobalanceEnabled": True}
                pool["zones"].append(zone_entry)
            zone_entry["workerCount"] += int(grow)
            pool["workerCount"] = zone_entry["workerCount"]
            worker = self._new_worker(pool, zone, version, state, worker_id)
            return worker

    def set_autobalance(self, pool_name: str, zone: str = "us-south-1", enabled: bool = False) -> None:
        """Automatic rebalancing of a pool in a zone (auto-rebalance-off.md; `worker-pool rebalance` turns it on)."""
        with self.lock:
            pool = self._pool(pool_name, live=True)
            next(z for z in pool["zones"] if z["id"] == zone)["autobalanceEnabled"] = enabled

    def autoscale(self, pool_name: str, enabled: bool = True) -> None:
        with self.lock:
            self._pool(pool_name, live=True)["autoscaleEnabled"] = enabled

    def answer_after_done(self, n: int, status: int = 503, path: str = "") -> None:
        with self.lock:
            self._answer_after.append([n, status, path])

    def busy_master(self, ticks: int, status: str = "VPN server configuration update in progress.") -> None:
        """masterStatus not Ready while another master operation runs (cluster-states-reference)."""
        with self.lock:
            self.cluster["lifecycle"]["masterStatus"] = status
            self._after(ticks, lambda: self.cluster["lifecycle"].update(masterStatus="Ready"))

    def worker_version_for(self, master_version: str) -> str:
        """A replaced/new worker: the master's major.minor with the newest worker fix pack (update.md#vpc_worker_node)."""
        minor = ".".join(master_version.split("_")[0].split(".")[:2])
        return self.worker_versions.get(minor, master_version)

    def fail_next(self, n: int, status: int = 503, path: str = "") -> None:
        with self.lock:
            self._faults.append([n, status, path])

    def expire_tokens(self) -> None:
        with self.lock:
            self.tokens = {t: False for t in self.tokens}

    def expire_tokens_on(self, path: str) -> None:
        with self.lock:
            self._expire_on.append(path)

    def stick(self, worker_id: str) -> None:
        with self.lock:
            self.stuck.add(worker_id)

    def grant(self, api_key: str, role: str) -> None:
        """`api_key` is valid and holds `role` ("Viewer" or "Operator") on the cluster."""
        if role not in ("Viewer", "Operator"):
            raise ValueError(f"role {role!r}: the emulator knows Viewer and Operator")
        with self.lock:
            self.keys[api_key] = role

    def count(self, method: str, path: str) -> int:
        return sum(1 for m, p in self.requests if m == method and p == path)

    # State machine ----------------------------------------------------------------------------------------------
    def _pool(self, id_or_name: Optional[str], live: bool = False) -> Optional[dict]:
        """By ID, else by name preferring a live pool (a deleted pool keeps its name readable, #3595)."""
        by_id = self.pools.get(id_or_name or "")
        if by_id is not None:
            return None if live and by_id["lifecycle"]["actualState"] == "deleted" else by_id
        named = [p for p in self.pools.values() if p["poolName"] == id_or_name]
        alive = [p for p in named if p["lifecycle"]["actualState"] != "deleted"]
        return (alive or ([] if live else named) or [None])[-1]

    def _after(self, ticks: int, callback) -> None:
        self._pending.append([ticks, callback])

    def run_due(self) -> None:
        """Carry out the wall-clock transitions whose time has come (provision_seconds)."""
        with self.lock:
            now = time.monotonic()
            for entry in [e for e in self._timed if e[0] <= now]:
                self._timed.remove(entry)
                entry[1]()

    def tick(self) -> None:
        """Advance every pending transition by one step (every authenticated request does this)."""
        with self.lock:
            self.run_due()
            for entry in list(self._pending):
                entry[0] -= 1
                if entry[0] <= 0:
                    self._pending.remove(entry)
                    entry[1]()

    def _new_worker(self, pool: dict, zone: str, version: str, state: str, worker_id: Optional[str]) -> dict:
        n = next(self._ids)
        worker = {
            "id": worker_id or f"kube-{self.cluster['id']}-{pool['poolName']}-{n:08x}",
            "flavor": pool["flavor"], "location": zone, "poolID": pool["id"], "poolName": pool["poolName"],
            "kubeVersion": {"actual": version if state == "deployed" else "", "desired": version, "target": version},
            "lifecycle": {"desiredState": "deployed", "actualState": state, "message": "", "pendingOperation": "",
                          "reasonForDelete": ""},
            "health": {"state": "normal" if state == "deployed" else "pending",
                       "message": "Ready" if state == "deployed" else ""},
            "networkInterfaces": [{"cidr": "10.240.0.0/24", "ipAddress": self.ip_of(n), "primary": True,
                                   "subnetID": "subnet-1"}],
        }
        self.workers[worker["id"]] = worker
        self.created_at[worker["id"]] = len(self.requests) - 1
        if state == "provisioning":
            if self.stick_new_workers:
                self.stuck.add(worker["id"])
            seconds = self.provision_seconds_for.get(self._replacing_now, self.provision_seconds)
            if seconds is not None:
                self._timed.append([time.monotonic() + seconds, lambda: self._deploy(worker)])
            else:
                self._after(self.steps, lambda: self._deploy(worker))
        return worker

    def _deploy(self, worker: dict) -> None:
        if worker["id"] in self.stuck:
            self._after(1, lambda: self._deploy(worker))  # keeps reporting provisioning
            return
        if worker["lifecycle"]["desiredState"] != "deployed":
            return
        worker["kubeVersion"]["actual"] = worker["kubeVersion"]["desired"]
        where = (worker["poolName"], worker["location"])
        if self.fail_new_workers and (self.fail_new_workers_in is None or where in self.fail_new_workers_in):
            # worker-node-state-reference: provision_failed / deploy_failed
            state, message = self.fail_new_workers
            worker["lifecycle"].update(actualState=state, message=message)
            worker["health"].update(state="critical", message=message)
            return
        worker["kubeVersion"]["actual"] = worker["kubeVersion"]["desired"]
        worker["lifecycle"].update(actualState="deployed", message="")
        worker["health"].update(state="normal", message="Ready")
        self.deployed_at[worker["id"]] = len(self.requests) - 1
        if self.flap_new_workers:  # a fresh node's Ready condition can flap (terraform waits 3 normal readings)
            self._flap(worker, self.flap_new_workers)

    def _flap(self, worker: dict, left: int) -> None:
        self.flapping.add(worker["id"])
        if left <= 0 or worker["lifecycle"]["desiredState"] != "deployed":
            worker["health"].update(state="normal", message="Ready")
            self.flapping.discard(worker["id"])
            return
        bad = left % 2 == 1
        worker["health"].update(state="critical" if bad else "normal", message="Not Ready" if bad else "Ready")
        self._after(1, lambda: self._flap(worker, left - 1))

    def _delete_worker(self, worker: dict, reason: str) -> None:
        worker["lifecycle"].update(desiredState="deleted", actualState="deleting", reasonForDelete=reason,
                                   pendingOperation="deleting")
        worker["health"].update(state="normal", message="Deleting")

        def done() -> None:  # deleted workers keep answering, health `deleted` (worker-node-state-reference)
            worker["lifecycle"].update(actualState="deleted", pendingOperation="")
            worker["health"].update(state="deleted", message="Deleted")
        self._after(self.steps, done)

