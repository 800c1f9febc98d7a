"""The base of the IKS dynamic resources (master version, worker replacement, temporary GPU pool).

Providers are pickled by dill into the state (by module and class; see state_compat.py), so they hold no clients:
each operation builds its own IksClient.
The API key comes from the `api` input (a Pulumi secret), else the stack config gpu-migration:ibmApiKey (seen by the
provider's `configure`, which is what `delete` relies on: outputs never hold the key), else IC_API_KEY.
"""
import json
from typing import Any, Optional

import pulumi
import pulumi.dynamic as dyn

from ..common.versions import version_key
from ..common.waiting import optional_float
from .api import API_KEY_CONFIG, IksClient

# terraform-provider-ibm waits for three healthy readings in a row (masterStatus Ready, worker health normal)
# before it calls a master or worker "done": health flaps while a fresh node settles.
STABLE_READINGS = 3


class ReplacementError(RuntimeError):
    """The worker's state does not let us tell what to do without a human (e.g. its replacement is ambiguous)."""


def _log(message: str) -> None:
    pulumi.log.info(message)


def _public(props: dict[str, Any]) -> dict[str, Any]:
    """Inputs as they may appear in outputs: without the API key or the serialized provider."""
    out = {k: v for k, v in props.items() if not k.startswith("__")}
    out["api"] = {k: v for k, v in (props.get("api") or {}).items() if k != "api_key"}
    return out


NODES_CONFIG = "gpu-migration:nodes"


def config_entries(raw: Any) -> dict[str, str]:
    """Config entry name -> configured worker ID, from gpu-migration:nodes as the engine passes it to a dynamic
    provider (the stack's whole config, each value as its text: JSON for a list). The program validated the list
    before any resource ran (config/loading.py), so malformed entries are only skipped here."""
    try:
        nodes = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        return {}
    return {str(n["name"]): str(n["workerId"]) for n in nodes or [] if isinstance(n, dict)
            and n.get("name") and n.get("workerId")} if isinstance(nodes, list) else {}


class _IksProvider(dyn.ResourceProvider):
    # Pickled by module and class, holding nothing (state_compat.py; the API key comes with `api` or `configure`): no
    # secret to hide. The SDK still makes it one if it captured a secret (pulumi/dynamic/dynamic.py).
    serialize_as_secret_always = False

    def configure(self, req: dyn.ConfigureRequest) -> None:
        """The engine gives a dynamic provider the stack's whole config (pulumi/pulumi pkg/resource/deploy/target.go
        GetPackageConfig; pulumi/dynamic/__main__.py get_provider calls this once per process)."""
        self._stack_api_key = req.config.get(API_KEY_CONFIG)
        self._entries = config_entries(req.config.get(NODES_CONFIG))

    def entries(self, props: dict[str, Any]) -> dict[str, str]:
        """Every config entry (name -> configured worker ID): an `entries` input where one is given (a provider used
        on its own), else the stack config's."""
        return dict(props.get("entries") or getattr(self, "_entries", None) or {})

    def client(self, props: dict[str, Any]) -> IksClient:
        return IksClient.from_api(props.get("api") or {}, getattr(self, "_stack_api_key", None))

    @staticmethod
    def timing(props: dict[str, Any], default_timeout: float) -> tuple[float, float]:
        return optional_float(props.get("timeout"), default_timeout), optional_float(props.get("poll_interval"), 15)

    @staticmethod
    def readings(props: dict[str, Any]) -> int:
        return int(optional_float(props.get("stable_readings"), STABLE_READINGS))


class Streak:
    """Counts consecutive good readings per key; a bad reading starts the count again (health flapping)."""

    def __init__(self, needed: int) -> None:
        self.needed, self.counts = max(1, needed), {}

    def see(self, key: str, good: bool) -> bool:
        self.counts[key] = self.counts.get(key, 0) + 1 if good else 0
        return self.counts[key] >= self.needed

    def of(self, key: str) -> str:
        return f"{self.counts.get(key, 0)}/{self.needed} good readings in a row"


def major_minor(version: Optional[str]) -> str:
    return ".".join(str(n) for n in version_key(version)[:2])


def same_minor(actual: Optional[str], target: str) -> bool:
    """A worker IKS created at `target` runs its major.minor with the newest worker fix pack (either direction)."""
    return bool(version_key(actual)) and version_key(actual)[:2] == version_key(target)[:2]


# 1. Master version ---------------------------------------------------------------------------------------------


# 2. Worker replacement -----------------------------------------------------------------------------------------


# 3. Temporary GPU worker pool ----------------------------------------------------------------------------------


