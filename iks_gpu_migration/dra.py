"""The DeviceClass that backs the extended resource with DRA devices of the configured driver."""
from typing import Optional

import pulumi
import pulumi_kubernetes as k8s


def device_class_name(extended_resource_name: str) -> str:
    """example.com/gpu -> example.com-gpu (a DNS subdomain)."""
    return extended_resource_name.lower().replace("/", "-").replace("_", "-")


def device_selectors(driver: str, extra: list[str]) -> list[dict]:
    expressions = [f'device.driver == "{driver}"', *extra]
    return [{"cel": {"expression": e}} for e in expressions]


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
