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
import json
import re
import threading
import time
from typing import Any, Callable, Optional
from urllib.parse import parse_qs, unquote, urlparse

import jwt

from iks_gpu_migration.common.versions import version_key
from gpu_migration_local.http_server import LocalServer

_JWT_KEY = "iks-emulator-signing-key-not-a-secret-000"


class Error(Exception):
    """An IKS error body ({code, description, incidentID}); IAM ones use IAM's {errorCode, errorMessage}."""

    def __init__(self, status: int, description: str, code: str = "E0000", iam: bool = False) -> None:
        super().__init__(description)
        self.status = status
        self.body = ({"errorCode": code, "errorMessage": description} if iam
                     else {"code": code, "description": description, "incidentID": "emulator"})


class IksEmulator:
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

    # IAM --------------------------------------------------------------------------------------------------------
    def _token(self, form: dict[str, str]) -> dict:
        if form.get("grant_type") != "urn:ibm:params:oauth:grant-type:apikey":
            raise Error(400, "grant_type is invalid", "BXNIM0103E", iam=True)
        if form.get("apikey") not in self.keys:
            raise Error(400, "Provided API key could not be found.", "BXNIM0415E", iam=True)
        now = int(time.time())
        token = jwt.encode({"iat": now, "exp": now + 3600, "jti": str(next(self._ids))}, _JWT_KEY, algorithm="HS256")
        self.tokens[token] = True
        self.token_roles[token] = self.keys[form["apikey"]]
        return {"access_token": token, "refresh_token": "not-supported", "token_type": "Bearer",
                "expires_in": 3600, "expiration": now + 3600, "scope": "ibm openid"}

    # IKS routes -------------------------------------------------------------------------------------------------
    def _check_cluster(self, name: Optional[str]) -> None:
        if name not in (self.cluster["name"], self.cluster["id"]):
            raise Error(404, "The specified cluster could not be found. If applicable, make sure that you target "
                             "the correct account and resource group.", "G0004")

    def _worker(self, worker_id: Optional[str], live: bool = False) -> dict:
        """A deleted worker still answers 200 with actualState deleted (iks-api.md, getWorker)."""
        worker = self.workers.get(worker_id or "")
        if worker is None or (live and worker["lifecycle"]["actualState"] == "deleted"):
            raise Error(404, f"The specified worker node could not be found: {worker_id}", "E0011")
        return worker

    def _operate(self, role: str, method: str, path: str, action: str) -> None:
        """containers-kubernetes.cluster.operate: Operator (or Administrator), never Viewer (module docstring)."""
        if role != "Operator":
            self.refused.append((method, path))
            raise Error(403, f"You are not authorized to {action} cluster {self.cluster['name']}. To complete this "
                             f"action, you must have the Operator platform access role for Kubernetes Service "
                             f"(containers-kubernetes) on the cluster.", "A0801")

    def route(self, method: str, path: str, q: dict[str, str], body: dict,
              role: str = "Operator") -> tuple[int, Any]:
        if (method, path) == ("GET", "/v2/vpc/getCluster"):
            self._check_cluster(q.get("cluster"))
            return 200, self.cluster
        if (method, path) == ("GET", "/v1/versions"):
            offered = [dict(zip(("major", "minor", "patch"), map(int, v.split("_")[0].split("."))))
                       for v in self.versions.values()]
            return 200, {"kubernetes": offered, "openshift": []}
        if method == "PUT" and path.startswith("/v1/clusters/") and path.count("/") == 3:
            self._check_cluster(unquote(path.rsplit("/", 1)[1]))
            self._operate(role, method, path, "update the master of")
            return self._update_master(body)
        if (method, path) == ("GET", "/v2/vpc/getWorkers"):
            self._check_cluster(q.get("cluster"))
            pool = self._pool(q["pool"]) if q.get("pool") else None
            if q.get("pool") and pool is None:
                raise Error(404, "The specified worker pool could not be found.", "E0052")
            show_deleted = q.get("showDeleted") == "true"
            return 200, self._listed([w for w in self.workers.values()
                                      if (show_deleted or w["lifecycle"]["actualState"] != "deleted")
                                      and (pool is None or w["poolID"] == pool["id"])])
        if (method, path) == ("GET", "/v2/vpc/getWorker"):
            self._check_cluster(q.get("cluster"))
            return 200, self._listed([self._worker(q.get("worker"))])[0]
        if (method, path) == ("POST", "/v2/vpc/replaceWorker"):
            self._check_cluster(body.get("cluster"))
            self._operate(role, method, path, "replace worker nodes of")
            return self._replace(body)
        if (method, path) == ("POST", "/v2/vpc/createWorkerPool"):
            self._check_cluster(body.get("cluster"))
            self._operate(role, method, path, "create worker pools in")
            return self._create_pool(body)
        if (method, path) == ("GET", "/v2/vpc/getWorkerPool"):
            self._check_cluster(q.get("cluster"))
            pool = self._pool(q.get("workerpool"))  # deleted pools stay readable (#3595)
            if pool is None:
                raise Error(404, "The specified worker pool could not be found.", "E0052")
            return 200, pool
        if method == "DELETE" and path.startswith("/v1/clusters/") and "/workerpools/" in path:
            parts = path.split("/")  # ["", "v1", "clusters", cluster, "workerpools", pool]
            self._check_cluster(unquote(parts[3]))
            self._operate(role, method, path, "remove worker pools from")
            return self._remove_pool(unquote(parts[5]))
        raise Error(404, f"no route {method} {path}", "E0404")

    def _listed(self, workers: list[dict]) -> list[dict]:
        for w in workers:
            self.first_listed.setdefault(w["id"], len(self.requests) - 1)
        return workers

    def _update_master(self, body: dict) -> tuple[int, None]:
        self.master_requests.append(dict(body))
        if body.get("action") != "update":
            raise Error(400, "action must be update", "E0001")
        if self.refuse_master_update:
            raise Error(*self.refuse_master_update, "E3411")
        if not re.fullmatch(r"\d+\.\d+", str(body.get("version", ""))):  # major.minor only (module docstring)
            raise Error(400, f"The Kubernetes version {body.get('version')} is not valid: specify major.minor.", "E2a33")
        full = self.versions.get(body["version"])
        if full is None:
            raise Error(400, f"The Kubernetes version {body.get('version')} is not valid.", "E2a33")
        life = self.cluster["lifecycle"]
        if self.busy_on_update:
            self.busy_on_update -= 1
            self.busy_master(self.steps, "Certificate authority rotation in progress.")
        if life["masterStatus"] != "Ready" or life["masterState"] != "deployed":
            # Any master operation in progress (masterStatus not Ready) refuses the PUT with 400 Ef9cc (iks-api.md,
            # from terraform-provider-ibm's issue threads listed there)
            raise Error(400, "The master must be in the deployed state and its status Ready to start this "
                             f"operation; current status: {life['masterStatus']}", "Ef9cc")
        current, wanted = (version_key(v)[1] for v in (self.cluster["masterKubeVersion"], full))
        if wanted > current + 1:  # IKS: one minor version at a time
            raise Error(400, f"The master can be updated only one minor version at a time, not to {full}.", "E2a37")
        behind = sorted({w["poolName"] for w in self.workers.values() if w["lifecycle"]["desiredState"] != "deleted"
                         and wanted - version_key(w["kubeVersion"]["actual"] or w["kubeVersion"]["desired"])[1] > 2})
        if behind and not body.get("force"):  # n-2 (update.md); --force-update overrides
            raise Error(400, f"The master cannot be updated to {body['version']}: worker nodes of worker pool(s) "
                             f"{', '.join(behind)} would be more than two minor versions behind. Update the worker "
                             f"nodes first or force the update.", "E2a38")
        self.cluster["targetVersion"] = full
        life.update(masterState="updating", masterStatus="Version update in progress.", masterHealth="warning")
        fails, self.fail_master_update = self.fail_master_update, False

        def done() -> None:
            if fails:  # falls back to deployed at the old version; targetVersion stays newer (cluster-states-reference)
                life.update(masterState="deployed", masterStatus="Ready", masterHealth="normal")
                return
            self.cluster["masterKubeVersion"] = full
            life.update(masterState="deployed", masterStatus="Ready", masterHealth="normal")
        self._after(self.steps, done)
        return 204, None

    def _replace(self, body: dict) -> tuple[int, None]:
        self.replaced.append(body.get("workerID"))
        self.replace_log.append((len(self.requests) - 1, body.get("workerID")))
        worker = self._worker(body.get("workerID"), live=True)
        if worker["id"] in self.refuse_replace:
            status, description = self.refuse_replace[worker["id"]]
            raise Error(status, description, "E3917")
        if worker["lifecycle"]["desiredState"] == "deleted" or worker["id"] in self._replacing:
            raise Error(409, f"The worker node {worker['id']} is already being deleted or replaced.", "E3918")
        version = (self.worker_version_for(self.cluster["masterKubeVersion"]) if body.get("update")
                   else worker["kubeVersion"]["actual"])

        def start() -> None:
            self._replacing.discard(worker["id"])
            self._delete_worker(worker, "worker_replace")
            pool = self._pool(worker["poolID"])
            zone = next((z for z in pool["zones"] if z["id"] == worker["location"]), {})
            # The pool's automatic rebalancing provisions the new worker (auto-rebalance-off); not in an autoscaled pool.
            if self.rebalance and zone.get("autobalanceEnabled", True) and not pool.get("autoscaleEnabled"):
                self._replacing_now = worker["id"]  # whose replacement this is (provision_seconds_for)
                self._new_worker(pool, worker["location"], version, "provisioning", None)
                self._replacing_now = ""
        if self.replace_lag:
            self._replacing.add(worker["id"])
            self._after(self.replace_lag, start)
        else:
            start()
        return 204, None

    def _create_pool(self, body: dict) -> tuple[int, dict]:
        if self._pool(body.get("name"), live=True) is not None:  # a deleted pool's name is free again
            raise Error(409, f"A worker pool named {body.get('name')} already exists.", "E0095")
        pool = self.add_pool(body["name"], body["zones"][0]["id"], body.get("flavor", ""), body.get("workerCount", 1))
        pool["vpcID"] = body.get("vpcID")
        pool["lifecycle"]["actualState"] = "provisioning"
        for zone in body["zones"]:
            for _ in range(body.get("workerCount", 1)):
                self._new_worker(pool, zone["id"], self.worker_version_for(self.cluster["masterKubeVersion"]),
                                 "provisioning", None)
        self._after(self.steps, lambda: pool["lifecycle"].update(actualState="active"))
        return 201, {"workerPoolID": pool["id"]}

    def _remove_pool(self, id_or_name: str) -> tuple[int, None]:
        pool = self._pool(id_or_name, live=True)
        if pool is None:
            raise Error(404, "The specified worker pool could not be found.", "E0052")
        pool["lifecycle"].update(actualState="deleting", desiredState="deleted")
        for worker in self.workers.values():
            if worker["poolID"] == pool["id"] and worker["lifecycle"]["desiredState"] != "deleted":
                self._delete_worker(worker, "pool_delete")
        # The removed pool stays readable: lifecycle deleted, zones [] (terraform-provider-ibm #3595).
        self._after(self.steps + 1, lambda: pool.update(zones=[], workerCount=0, lifecycle={
            "actualState": "deleted", "desiredState": "deleted"}))
        return 204, None

    # HTTP -------------------------------------------------------------------------------------------------------
    def _handle(self, method: str, raw_path: str, headers, raw_body: bytes) -> tuple[int, Any]:
        url = urlparse(raw_path)
        with self.lock:
            self.requests.append((method, url.path))
            for fault in self._faults:
                if fault[0] > 0 and fault[2] in url.path:
                    fault[0] -= 1
                    return fault[1], {"code": "E0500", "description": "Service temporarily unavailable (injected)"}
            after = next((a for a in self._answer_after if a[0] > 0 and a[2] in url.path), None)
            if after is not None:
                after[0] -= 1
            if url.path in self._expire_on:
                self._expire_on.remove(url.path)
                self.expire_tokens()
            try:
                if (method, url.path) == ("POST", "/identity/token"):
                    form = {k: v[0] for k, v in parse_qs(raw_body.decode()).items()}
                    return 200, self._token(form)
                token = (headers.get("Authorization") or "").removeprefix("Bearer ")
                if not self.tokens.get(token):
                    raise Error(401, "The IAM token that was specified in the request is expired or invalid.",
                                "E0015")
                self.tick()
                body = json.loads(raw_body) if raw_body else {}
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                result = self.route(method, url.path, query, body, self.token_roles.get(token, "Operator"))
                if after is not None:  # carried out, but the client sees an error (it will retry)
                    return after[1], {"code": "E0500", "description": "Gateway timeout (injected after the change)"}
                return result
            except Error as e:
                return e.status, e.body
