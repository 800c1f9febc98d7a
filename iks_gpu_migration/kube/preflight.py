"""DraPreflight: before a batch's smoke tests, DRA extended resources are served, one DeviceClass maps the name, and
driver slices exist exactly on the batch's dra nodes, never next to device-plugin GPUs."""
from typing import Optional, Sequence

import pulumi
from kubernetes import client
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from pulumi.dynamic import Resource

from .cluster import GPU_RESOURCE, RESOURCE_API, device_plugin_gpus, devices_per_node
from .provider import _Provider, _wait_until_no_problems


PROBE_CLASS = "gpu-migration-preflight-probe"


def stores_extended_resource_name(api: ApiClient, extended_resource: str) -> list[str]:
    """Proof that the API server stores DeviceClassSpec.extendedResourceName: a server-side dry-run create, read back.

    An API server with the DRAExtendedResource gate off accepts the object and drops the field (kubernetes
    pkg/registry/resource/deviceclass/strategy.go, dropDisabledDRAExtendedResourceFields); an OpenAPI schema listing
    the field proves nothing about the gate. Nothing is persisted (dryRun=All)."""
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": PROBE_CLASS},
            "spec": {"extendedResourceName": extended_resource}}
    try:
        created = client.ResourceV1Api(api).create_device_class(body, dry_run="All")
    except ApiException as e:
        if e.status == 404:
            return [f"API server does not serve {RESOURCE_API} DeviceClasses: DRA (resource.k8s.io/v1) is not served"]
        if e.status != 409:  # 409: a leftover probe exists; the read-back below cannot run, say so
            raise
        return [f"DeviceClass {PROBE_CLASS} exists (left from an earlier probe?); delete it and retry"]
    stored = created.spec.extended_resource_name if created.spec else None
    if stored != extended_resource:
        return [
            f"API server dropped DeviceClass spec.extendedResourceName on a dry-run create (sent "
            f"{extended_resource!r}, read back {stored!r}): DRA extended resources (feature gate DRAExtendedResource, "
            "GA in 1.37) are not enabled"
        ]
    return []


def device_class_conflicts(api: ApiClient, extended_resource: str, own_class: str) -> list[str]:
    """Another DeviceClass mapping the same extended resource: the one created later wins (KEP-5004), so which GPUs
    serve `extended_resource` would depend on creation order. Chart >= 25.12 installs gpu.nvidia.com mapping
    nvidia.com/gpu (NVIDIA/k8s-dra-driver-gpu templates/deviceclass-gpu.yaml)."""
    others = sorted(
        c.metadata.name for c in client.ResourceV1Api(api).list_device_class().items
        if c.spec and c.spec.extended_resource_name == extended_resource and c.metadata.name != own_class
    )
    return [f"DeviceClass {name} also maps extended resource {extended_resource} (the later-created class wins); "
            f"delete it, or let {own_class} be the only one" for name in others]


def preflight(
    api: ApiClient, driver: str, extended_resource: str, dra_nodes: list[str], all_nodes: list[str],
    device_plugin_resource: str = GPU_RESOURCE, device_class: Optional[str] = None, pilot_label: Optional[str] = None,
) -> list[str]:
    """The API server stores extendedResourceName, one DeviceClass maps it, driver slices exist exactly on the dra
    nodes, and no node offers GPUs on both paths.

    With `pilot_label` (`key=value`) the check covers one batch: `dra_nodes`/`all_nodes` are the batch's, and a node
    outside the batch may publish only if it carries the pilot label (a dra node of another batch; the DRA driver's
    kubelet plugin runs only there)."""
    problems = stores_extended_resource_name(api, extended_resource)
    if device_class:
        problems += device_class_conflicts(api, extended_resource, device_class)
    devices = devices_per_node(api, driver)
    nodes = {n.metadata.name: n for n in client.CoreV1Api(api).list_node().items}
    for name in all_nodes:
        if name not in nodes:
            problems.append(f"node {name}: not found in the cluster")
    for name in dra_nodes:
        if not devices.get(name):
            problems.append(f"node {name}: no ResourceSlice devices of driver {driver} (stage dra)")
    key, _, value = (pilot_label or "").partition("=")

    def may_publish(name: str) -> bool:
        if name in dra_nodes:
            return True
        if not pilot_label or name in all_nodes:
            return False
        return name in nodes and (nodes[name].metadata.labels or {}).get(key) == value

    for name, count in sorted(devices.items()):
        if count and not may_publish(name):
            problems.append(f"node {name}: publishes {count} DRA devices of driver {driver} but is not a dra node")
        offered = device_plugin_gpus(nodes[name], (extended_resource, device_plugin_resource, GPU_RESOURCE)) if name in nodes else {}
        if count and offered:
            problems.append(
                f"node {name}: GPUs offered twice: device plugin allocatable {offered} "
                f"and {count} DRA devices of driver {driver}"
            )
    return problems


class _DraPreflightProvider(_Provider):
    rerun_on = ("driver", "extended_resource", "dra_nodes", "all_nodes", "device_plugin_resource", "device_class",
                "pilot_label")

    def run(self, api, p):
        check = lambda: preflight(api, p["driver"], p["extended_resource"], p["dra_nodes"], p["all_nodes"],
                                              p.get("device_plugin_resource") or GPU_RESOURCE,
                                              p.get("device_class"), p.get("pilot_label"))
        _wait_until_no_problems(f"DRA preflight for driver {p['driver']}", check, p, 1800)
        return {"checked_nodes": sorted(p["dra_nodes"])}


class DraPreflight(Resource, module="gpu-migration", name="DraPreflight"):
    """Waits until DRA extended resources are served and driver slices exist exactly on the dra nodes."""

    checked_nodes: pulumi.Output[list[str]]

    def __init__(
        self,
        name: str,
        kubeconfig: pulumi.Input[Optional[str]],
        driver: pulumi.Input[str],
        extended_resource: pulumi.Input[str],
        dra_nodes: pulumi.Input[Sequence[pulumi.Input[str]]],
        all_nodes: pulumi.Input[Sequence[pulumi.Input[str]]],
        timeout: pulumi.Input[float],
        poll_interval: pulumi.Input[float],
        device_plugin_resource: pulumi.Input[Optional[str]] = None,  # also checked for double offering
        device_class: pulumi.Input[Optional[str]] = None,  # the one class that may map extended_resource
        pilot_label: Optional[str] = None,  # the nodes are one batch's (preflight)
        opts: Optional[pulumi.ResourceOptions] = None,
    ):
        props = dict(kubeconfig=kubeconfig, driver=driver, extended_resource=extended_resource, dra_nodes=dra_nodes,
                     all_nodes=all_nodes, device_plugin_resource=device_plugin_resource, device_class=device_class,
                     pilot_label=pilot_label, timeout=timeout, poll_interval=poll_interval, checked_nodes=None)
        super().__init__(_DraPreflightProvider(), name, props, opts)
