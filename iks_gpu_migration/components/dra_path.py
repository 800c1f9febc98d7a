"""DraPath: what the DRA path needs once any node is `dra`: the DRA driver's Helm release, the DeviceClass that backs
the extended resource with whole GPUs of that driver, the smoke tests' namespace, and per dra node a preflight before
its smoke tests. Removed (after all updates) once no node is `dra`.
"""
from typing import TYPE_CHECKING, Optional

import pulumi
import pulumi_kubernetes as k8s

from ..config import ConfigError, MigrationConfig
from ..kube.preflight import DraPreflight
from ..state_compat import WAS_AT_ROOT
from . import charts, smoke_pod

if TYPE_CHECKING:
    from .gpu_node import Context, GpuNode


def device_class_name(extended_resource_name: str) -> str:
    """example.com/gpu -> example.com-gpu (a DNS subdomain)."""
    return extended_resource_name.lower().replace("/", "-").replace("_", "-")


def device_selectors(driver: str, extra: list[str]) -> list[dict]:
    """Whole GPUs only: MIG devices (type "mig") and, from 25.12, VFIO devices (type "vfio") share the driver name
    (NVIDIA/k8s-dra-driver-gpu cmd/gpu-kubelet-plugin/deviceinfo.go; the chart's templates/deviceclass-gpu.yaml
    selects the same way)."""
    expressions = [f'device.driver == "{driver}" && device.attributes["{driver}"].type == "gpu"', *extra]
    return [{"cel": {"expression": e}} for e in expressions]


def own_class_needed(extended_resource_name: str, driver: str, extra: list[str],
                     chart_maps: Optional[str]) -> bool:
    """False when the DRA chart's own DeviceClass already maps the extended resource with the same selector.

    Two DeviceClasses mapping one extended resource: the one created later wins (KEP-5004; kubernetes
    pkg/scheduler/framework/plugins/dynamicresources/extendeddynamicresources.go), so ours would silently stop or
    start applying with the next chart upgrade. Chart >= 25.12 installs gpu.nvidia.com mapping nvidia.com/gpu.
    """
    if chart_maps != extended_resource_name:
        return True
    if driver == charts.CHART_CLASS and not extra:
        return False  # the chart's class selects device.driver == gpu.nvidia.com && type == gpu: exactly ours
    raise ConfigError(
        "invalid stack config:\n"
        f"  gpu-migration:extendedResourceName: {extended_resource_name!r} is already mapped by the DRA chart's "
        f"DeviceClass {charts.CHART_CLASS} (chart >= 25.12), which selects every {charts.CHART_CLASS} GPU; with draDriverName "
        f"{driver!r} or deviceSelectors set, a second class for the same name would race it (the later one wins). "
        "Use another extendedResourceName, or drop deviceSelectors and use draDriverName gpu.nvidia.com"
    )


def device_class(
    extended_resource_name: str, driver: str, extra_selectors: list[str], opts: Optional[pulumi.ResourceOptions] = None
) -> k8s.resource.v1.DeviceClass:
    return k8s.resource.v1.DeviceClass(
        "device-class",
        metadata=k8s.meta.v1.ObjectMetaArgs(name=device_class_name(extended_resource_name)),
        spec=k8s.resource.v1.DeviceClassSpecArgs(
            extended_resource_name=extended_resource_name,
            selectors=device_selectors(driver, extra_selectors),
        ),
        opts=opts,
    )


def own_class_for(cfg: MigrationConfig) -> bool:
    """Whether the program declares its own DeviceClass; the DRA driver's values are checked here, before anything
    is declared, so a bad value fails `pulumi preview`."""
    values = charts.dra_values(cfg.dra_driver, cfg.pilot_label_pair, cfg.tolerations)
    return own_class_needed(cfg.extended_resource_name, cfg.dra_driver_name, cfg.device_selectors,
                            charts.chart_class_maps(cfg.dra_driver, values))


class DraPath(pulumi.ComponentResource):
    """The DRA driver and DeviceClass need the master at the target version: resource.k8s.io/v1
    DeviceClass.spec.extendedResourceName is dropped by an older API server."""

    def __init__(self, cfg: MigrationConfig, ctx: "Context", master: pulumi.Resource, own_class: bool):
        super().__init__("gpu-migration:index:DraPath", "dra-path")
        self.cfg, self.ctx, self.own_class = cfg, ctx, own_class
        after_master = pulumi.ResourceOptions(parent=self, provider=ctx.k8s_provider, depends_on=[master],
                                              aliases=WAS_AT_ROOT)
        self.driver = charts.dra_driver_release(
            cfg.dra_driver, cfg.pilot_label_pair, tolerations=cfg.tolerations, timeout=cfg.timeouts.helm,
            opts=pulumi.ResourceOptions.merge(after_master, pulumi.ResourceOptions(provider=ctx.chart_provider)))
        self.device_class = device_class(cfg.extended_resource_name, cfg.dra_driver_name, cfg.device_selectors,
                                         opts=after_master) if own_class else None
        # After the master like the rest of the DRA path: so, like every change, after the cluster identity and the
        # GPU node inventory.
        self.namespace = smoke_pod.smoke_namespace(cfg.smoke_test, opts=pulumi.ResourceOptions(
            parent=self, provider=ctx.k8s_provider, depends_on=[master], aliases=WAS_AT_ROOT))
        self.preflights: list[DraPreflight] = []
        self.register_outputs({})

    def verify_batch(self, index: int, members: list["GpuNode"]) -> None:
        """A node's turn (`members`: the node), if dra: its preflight, then its smoke test, whose verification
        uncordons it before its slot frees. Per node, not one preflight over every node: that one would wait for
        later nodes' switches while they wait for a slot."""
        cfg, t = self.cfg, self.cfg.timeouts
        dra_members = [n for n in members if n.node.stage == "dra"]
        if not dra_members:
            return
        preflight = DraPreflight(
            f"{members[0].node.ident}-dra-preflight",
            kubeconfig=cfg.kubeconfig,
            driver=cfg.dra_driver_name,
            extended_resource=cfg.extended_resource_name,
            dra_nodes=[n.hostname for n in dra_members],
            all_nodes=[n.hostname for n in members],
            device_plugin_resource=cfg.device_plugin_resource,
            device_class=device_class_name(cfg.extended_resource_name) if self.own_class else charts.CHART_CLASS,
            pilot_label=cfg.pilot_label,  # other dra nodes may publish (kube/preflight.py)
            timeout=t.operator_ready,
            poll_interval=t.poll_interval,
            opts=pulumi.ResourceOptions(
                parent=self, aliases=WAS_AT_ROOT,
                depends_on=[self.driver, *filter(None, [self.device_class]), *(n.switch for n in dra_members)]),
        )
        self.preflights.append(preflight)
        for gpu_node in dra_members:
            gpu_node.declare_smoke_test(cfg, self.ctx, [preflight, self.namespace])
