"""The IKS emulator's HTTP side (gpu_migration_local/iks_emulator.py holds its state and the worker state machine):
IAM tokens, the IKS v2 routes a replacement, a master update and a temporary pool use, and the HTTP handler. A mixin
of IksEmulator: every method works on the emulator's own state (workers, pools, faults). Behaviour of the real
service and its sources: iks_emulator.py's module docstring and /work/shared/reference/iks-api.md.
"""
import json
import re
import time
from typing import Any, Optional
from urllib.parse import parse_qs, unquote, urlparse

import jwt

from iks_gpu_migration.common.versions import version_key

_JWT_KEY = "iks-emulator-signing-key-not-a-secret-000"


class Error(Exception):
    """An IKS error body ({code, description, incidentID}); IAM ones use IAM's {errorCode, errorMessage}."""

    def __init__(self, status: int, description: str, code: str = "E0000", iam: bool = False) -> None:
        super().__init__(description)
        self.status = status
        self.body = ({"errorCode": code, "errorMessage": description} if iam
                     else {"code": code, "description": description, "incidentID": "emulator"})



class IksRoutes:
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
