"""The DeviceClass that backs the extended resource with whole GPUs of the configured DRA driver."""
from typing import Optional

import pulumi
import pulumi_kubernetes as k8s

from .config import ConfigError


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
    from .charts import CHART_CLASS  # noqa: PLC0415 (charts imports config only; keep the cycle out)
    if driver == CHART_CLASS and not extra:
        return False  # the chart's class selects device.driver == gpu.nvidia.com && type == gpu: exactly ours
    raise ConfigError(
        "invalid stack config:\n"
        f"  gpu-migration:extendedResourceName: {extended_resource_name!r} is already mapped by the DRA chart's "
        f"DeviceClass {CHART_CLASS} (chart >= 25.12), which selects every {CHART_CLASS} GPU; with draDriverName "
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
