"""Reading IKS worker JSON (getWorkers / getWorker): states, versions, node names."""
from typing import Optional

from ..config.grammar import node_name_problems
from .api import IksApiError


def worker_version(worker: dict) -> str:
    return (worker.get("kubeVersion") or {}).get("actual") or ""


def is_deleted(worker: dict) -> bool:
    return (worker.get("lifecycle") or {}).get("actualState") == "deleted"


def is_failed(worker: dict) -> bool:
    """provision_failed, deploy_failed, reloading_failed, ... (ibm-cloud-docs worker-node-state-reference)."""
    return str((worker.get("lifecycle") or {}).get("actualState") or "").endswith("_failed")


def failure_message(worker: dict) -> str:
    life, health = worker.get("lifecycle") or {}, worker.get("health") or {}
    return life.get("message") or health.get("message") or "no message from IKS"


def is_deleting(worker: dict) -> bool:
    """Being deleted (e.g. replaced) or already deleted."""
    life = worker.get("lifecycle") or {}
    return life.get("actualState") in ("deleting", "deleted") or life.get("desiredState") == "deleted"


def is_deployed(worker: dict) -> bool:
    life = worker.get("lifecycle") or {}
    return life.get("actualState") == "deployed" and not life.get("pendingOperation")


def is_ready(worker: dict) -> bool:
    """deployed and health normal, its status "Ready" (the Kubernetes node is Ready); as terraform-provider-ibm,
    health state normal is the signal, and a status saying "Not Ready" vetoes it."""
    health = worker.get("health") or {}
    return (is_deployed(worker) and health.get("state") == "normal"
            and "not ready" not in (health.get("message") or "").lower())


def describe_worker(worker: dict) -> str:
    life, health = worker.get("lifecycle") or {}, worker.get("health") or {}
    state = f"{life.get('actualState') or '?'}/{health.get('state') or '?'}"
    message = health.get("message") or life.get("message")
    return f"worker {worker.get('id')} {state}" + (f" ({message})" if message else "") + \
        f", version {worker_version(worker) or '-'}"


def primary_ip(worker: dict) -> Optional[str]:
    """On VPC the Kubernetes node name is the worker's primary private IP. It goes into field and label selectors
    (spec.nodeName=..., kubernetes.io/hostname=...) and object names, so it must pass the grammar configured names
    pass (config/grammar.py); anything else stops here, before it is used or recorded."""
    nics = worker.get("networkInterfaces") or []
    primary = next((n for n in nics if n.get("primary")), nics[0] if nics else None)
    ip = (primary or {}).get("ipAddress") or None
    problems = node_name_problems(ip) if ip is not None else []
    if problems:
        raise IksApiError(f"IKS reports worker {worker.get('id')} with primary IP {str(ip)[:80]!r} (its Kubernetes "
                          f"node name), which {'; '.join(problems)}: it is not used. Check the worker (`ibmcloud ks "
                          f"worker get --worker {worker.get('id')}`) and the ibmCloud.endpoint the answer came from")
    return ip
