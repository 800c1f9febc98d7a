"""MasterVersion: the cluster master stepped up one minor version at a time, each step waited out (terraform-provider-ibm
waitForVpcClusterMasterAvailable: several Ready readings in a row)."""
from typing import Any, Optional

import pulumi
import pulumi.dynamic as dyn

from ..common.versions import minor_steps, version_at_least
from ..common.waiting import wait_for
from ..plan import iks_rules
from .api import MASTER_BUSY, IksApiError, IksClient
from .provider import ReplacementError, Streak, _IksProvider, _log, _public, major_minor
from .workers import is_deleting, worker_version


MAX_MASTER_REQUESTS = 3  # an update that keeps falling back to the old version needs a human

# (cluster, major.minor) of masters this provider process saw rest there on several readings in a row (MasterVersion,
# or the check before a replacement). The check before each later replacement then takes one resting reading: it
# guards against a master operation started since, which a single reading shows; the readings in a row are for a
# master that was just updated and may still flap (terraform waitForVpcClusterMasterAvailable). A reading that does
# not rest drops the entry, so the next check counts its readings in a row again.
RESTED: set[tuple[str, str]] = set()


def master_rests(info: dict) -> bool:
    """deployed + normal + Ready: no master operation runs (terraform waitForVpcClusterMasterAvailable)."""
    life = info.get("lifecycle") or {}
    return (life.get("masterState") == "deployed" and life.get("masterHealth") == "normal"
            and life.get("masterStatus") == "Ready")


def describe_master(info: dict) -> str:
    """The master as IKS reports it. IKS's own targetVersion (what an update under way goes to; the current version
    at rest) is named only when it differs, and as IKS's: it is not the program's target (kubeVersion)."""
    life, current, going = info.get("lifecycle") or {}, info.get("masterKubeVersion"), info.get("targetVersion")
    towards = f" (IKS targetVersion {going})" if going and going != current else ""
    return (f"master {current}{towards} "
            f"{life.get('masterState')}/{life.get('masterHealth')} ({life.get('masterStatus')})")


class MasterVersionProvider(_IksProvider):
    def create(self, props: dict[str, Any]) -> dyn.CreateResult:
        return dyn.CreateResult(props["cluster"], self._ensure(props))

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> dyn.UpdateResult:
        return dyn.UpdateResult(self._ensure(news))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dyn.DiffResult:
        replaces = ["cluster"] if olds.get("cluster") != news["cluster"] else []
        changed = bool(replaces) or olds.get("version") != news["version"]
        return dyn.DiffResult(changes=changed, replaces=replaces)

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        _log(f"master of cluster {props.get('cluster')}: nothing to delete (a master is never downgraded)")

    def _ensure(self, props: dict[str, Any]) -> dict[str, Any]:
        """Step the master up one minor version at a time to `version`'s major.minor (the master takes no fix pack),
        waiting for it to rest after each. Refused before the first step, with nothing updated: a master above the
        target (this runs before any worker is drained or replaced: components/migration.py orders every replacement
        after it), a version IKS does not offer, a step that would leave a worker pool more than two minors behind."""
        cluster, target = props["cluster"], iks_rules.master_version(props["version"])
        client = self.client(props)
        info = client.get_cluster(cluster)
        above = iks_rules.master_above_target(cluster, info.get("masterKubeVersion"), props["version"])
        if above:
            raise IksApiError(above)
        steps = minor_steps(info.get("masterKubeVersion"), target)
        offered = client.kube_versions() if steps else set()
        missing = [s for s in steps if ".".join(s.split(".")[:2]) not in offered]
        if missing:  # checked before the first step: a typo must not start irreversible updates
            raise IksApiError(
                f"kubeVersion {target}: master of cluster {cluster} is at {info.get('masterKubeVersion')} and IKS "
                f"offers no Kubernetes {', '.join(missing)} (offered: {', '.join(sorted(offered)) or 'none'}); "
                f"nothing was updated"
            )
        skew = iks_rules.skew_refusal(cluster, info.get("masterKubeVersion"), steps, pool_versions(client, cluster)) \
            if steps else None
        if skew:
            raise IksApiError(skew)
        for step in steps or [target]:
            info = self._update_to(client, cluster, step, props)
        RESTED.add((cluster, major_minor(info.get("masterKubeVersion") or target)))
        return {**_public(props), "actual_version": info.get("masterKubeVersion")}

    def _update_to(self, client: IksClient, cluster: str, target: str, props: dict[str, Any]) -> dict:
        """Wait until the master rests (deployed, normal, Ready on several readings in a row); if it rests below
        `target`, request the update (again: an update can fall back to the old version) and keep waiting.

        targetVersion is not read: it can be newer than masterKubeVersion at rest, after a failed update.
        A PUT refused with Ef9cc (another master operation just started) is waited out like a busy master."""
        timeout, interval = self.timing(props, 3600)
        streak, requests = Streak(self.readings(props)), []

        def poll() -> tuple[bool, dict, str]:
            now = client.get_cluster(cluster)
            state = describe_master(now)
            if not streak.see("master", master_rests(now)):
                return False, now, f"{state}; {streak.of('master')}"
            if version_at_least(now.get("masterKubeVersion"), target):
                return True, now, state
            if len(requests) >= MAX_MASTER_REQUESTS:
                raise IksApiError(
                    f"the update of the master of cluster {cluster} to {target} was requested {len(requests)} times "
                    f"and the master fell back to {now.get('masterKubeVersion')} each time ({state}); see "
                    f"`ibmcloud ks cluster get --cluster {cluster}` for the reason, fix it and re-run `pulumi up`"
                )
            _log(f"master of cluster {cluster} rests at {now.get('masterKubeVersion')}; requesting update to "
                 f"{target}" + (" again (the last update did not take)" if requests else ""))
            try:
                client.update_master(cluster, target)
            except IksApiError as e:
                if e.code != MASTER_BUSY:
                    raise
                streak.see("master", False)
                return False, now, f"IKS refused the update while another master operation runs: {e}"
            requests.append(target)
            streak.see("master", False)
            return False, now, f"update to {target} requested"

        return wait_for(f"master of cluster {cluster} at {target} (deployed, normal, Ready)", poll, timeout, interval)


def pool_versions(client: IksClient, cluster: str) -> dict[str, str]:
    """Every worker pool's lowest worker version (live workers; a new one's `actual` is empty until deployed)."""
    return iks_rules.lowest_by_pool(
        (str(w.get("poolName") or w.get("poolID")), worker_version(w) or (w.get("kubeVersion") or {}).get("desired"))
        for w in client.list_workers(cluster) if not is_deleting(w)
    )


def wait_master_at(client: IksClient, cluster: str, target: str, props: dict[str, Any]) -> None:
    """Gate before a worker is replaced (and drained): the master rests at the target's major.minor, not above it."""
    timeout, interval = _IksProvider.timing(props, 5400)
    key = (cluster, major_minor(target))
    streak = Streak(1 if key in RESTED else _IksProvider.readings(props))

    def poll() -> tuple[bool, None, str]:
        nonlocal streak
        info = client.get_cluster(cluster)
        if not master_rests(info) and streak.needed == 1:
            RESTED.discard(key)
            streak = Streak(_IksProvider.readings(props))
        above = iks_rules.master_above_target(cluster, info.get("masterKubeVersion"), target)
        if above and master_rests(info):
            raise ReplacementError(above)
        if master_rests(info) and not version_at_least(info.get("masterKubeVersion"), major_minor(target)):
            raise ReplacementError(
                f"the master of cluster {cluster} is at {info.get('masterKubeVersion')}, below kubeVersion {target}: "
                f"a worker replaced now would come up at the master's version. Nothing was replaced; the master "
                f"version resource must finish first (re-run `pulumi up`)"
            )
        return streak.see("master", master_rests(info)), None, f"{describe_master(info)}; {streak.of('master')}"

    wait_for(f"master of cluster {cluster} to rest before a worker replacement", poll, timeout, interval)
    RESTED.add(key)


class MasterVersion(dyn.Resource, module="gpu-migration", name="MasterVersion"):
    """The cluster master at `version` or newer; workers must depend on this before they are replaced."""

    cluster: pulumi.Output[str]
    version: pulumi.Output[str]
    actual_version: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        cluster: pulumi.Input[str],
        version: pulumi.Input[str],
        api: pulumi.Input[dict],
        timeout: pulumi.Input[float] = 3600,
        poll_interval: pulumi.Input[float] = 15,
        opts: Optional[pulumi.ResourceOptions] = None,
    ) -> None:
        props = {"cluster": cluster, "version": version, "api": api, "timeout": timeout,
                 "poll_interval": poll_interval, "actual_version": None}
        super().__init__(MasterVersionProvider(), name, props, opts)
