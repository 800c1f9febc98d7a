"""The stack config's fleet keys (config/model.py holds the rest): the temporary GPU pool (surge capacity), the IKS
worker-pool rules every replacement passes, and the budget several stacks share."""
from typing import Any, Literal

from pydantic import Field, field_validator

from .base import NAMESPACE, Model
from .grammar import DNS_SUBDOMAIN, MAX_TIMEOUT, check_namespace


class TempGpuPool(Model):
    enabled: bool = False
    name: str = "gpu-migration-temp"
    flavor: str = ""
    zone: str = ""
    vpc_id: str = ""
    subnet_id: str = ""
    size_per_zone: int = Field(default=1, ge=1)


class WorkerPoolRules(Model):
    """IKS worker pools whose workers are replaced although the pool breaks a rule (plan/iks_rules.py): names or IDs
    as `ibmcloud ks worker-pool ls` prints them."""
    # Automatic rebalancing off: IKS creates no replacement worker (auto-rebalance-off.md); you add it yourself.
    allow_rebalancing_off: list[str] = []
    # Managed by the cluster autoscaler (autoscaleEnabled, or enabled in kube-system/iks-ca-configmap).
    allow_autoscaling: list[str] = []
    # Which replacement proves a pool and zone can bring a worker back before others there go (iks/pool_rules.py):
    # the run's first (once) or the first of each round of `slots` nodes in list order (everyBatch: a stock-out later
    # in the run costs one node, not the pool and zone's replacements then in flight; each round waits one more
    # replacement time per pool and zone).
    canary: Literal["once", "everyBatch"] = "once"

    @field_validator("allow_rebalancing_off", "allow_autoscaling")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        blank = [i for i, name in enumerate(v) if not name.strip()]
        if blank:
            raise ValueError(f"entry {blank[0]} is empty: list worker pool names, e.g. [gpu-pool]")
        return v

    def props(self) -> dict[str, Any]:
        """The WorkerReplacement input `pool_rules`: what differs from the defaults ({} when nothing does)."""
        lists = {k: list(v) for k, v in (("allow_rebalancing_off", self.allow_rebalancing_off),
                                         ("allow_autoscaling", self.allow_autoscaling)) if v}
        return {**lists, **({"canary": self.canary} if self.canary != "once" else {})}


class SharedBudget(Model):
    """A capacity budget shared by every stack that migrates GPU nodes of the cluster (plan/shared_budget.py): their
    batches together never have more than `maxUnavailable` nodes out. Every such stack sets the same `name` and
    `maxUnavailable`; the claims live in the Lease gpu-migration-budget-<name> of `namespace`."""
    name: str
    max_unavailable: int = Field(ge=1)
    namespace: str = NAMESPACE  # rbac/gpu-migration.yaml creates it and grants the Lease there
    # Seconds a stack's claim holds without a renewal (its `up` renews it every third of this while it runs).
    claim_ttl: float = Field(default=600, ge=30, le=MAX_TIMEOUT)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if len(v) > 40 or not DNS_SUBDOMAIN.match(v) or "." in v:
            raise ValueError(f"shared budget name {v!r} is not a DNS label of <= 40 chars (lowercase alphanumerics "
                             f"and '-'), e.g. gpu-fleet")
        return v

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, v: str) -> str:
        return check_namespace(v)
