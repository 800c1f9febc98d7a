"""A throw-away copy of this project (Pulumi.yaml + a `local` stack file) with a file backend, run by the real CLI."""
import pathlib
import shutil

import yaml

from gpu_migration_local import tools
from gpu_migration_local.engine import Engine

REPO = pathlib.Path(__file__).resolve().parents[2]
CHARTS = REPO / "gpu_migration_local" / "charts"
# The real chart of the GPU Operator module tools/build pins (deployments/gpu-operator/Chart.yaml).
GPU_OPERATOR_CHART_VERSION = "v1.0.0-devel"


def local_config(cluster, iks, nodes: list[dict], kube_version: str = "1.37", **extra) -> dict:
    """Stack config for the local control plane and IKS emulator; `extra` keys (camelCase) override."""
    cfg = {
        "clusterName": iks.cluster_name,
        "kubeVersion": kube_version,
        "kubeconfig": str(cluster.kubeconfig),
        "ibmCloud": {"endpoint": iks.url, "iamEndpoint": iks.url, "allowCustomEndpoints": True},
        "nodes": nodes,
        "gpuOperator": {"chart": str(tools.gpu_operator_chart()), "version": GPU_OPERATOR_CHART_VERSION,
                        "namespace": "gpu-operator", "values": {}},
        "draDriver": {"chart": str(CHARTS / "nvidia-dra-driver-gpu"), "version": "25.8.1",
                      "namespace": "nvidia-dra-driver-gpu",
                      "values": {"nvidiaDriverRoot": "/run/nvidia/driver", "gpuResourcesEnabledOverride": True,
                                 "resources": {"gpus": {"enabled": True}, "computeDomains": {"enabled": False}}}},
        "extendedResourceName": "nvidia.com/gpu",
        "draDriverName": "gpu.nvidia.com",
        "smokeTest": {"image": "nvcr.io/nvidia/cuda:12.9.1-base-ubi9",
                      "command": ["sh", "-c", "nvidia-smi -L && sleep 2"]},
        "timeouts": {"masterUpdate": 60, "workerReplace": 60, "workerPool": 60, "operatorReady": 60,
                     "smokeTest": 60, "drain": 60, "evict": 60, "pollInterval": 0.2},
    }
    cfg.update(extra)
    return cfg


class Project:
    def __init__(self, tmp_path: pathlib.Path, api_key: str = "test-api-key") -> None:
        self.dir = tmp_path / "project"
        self.dir.mkdir()
        shutil.copy(REPO / "Pulumi.yaml", self.dir / "Pulumi.yaml")
        self.engine = Engine(self.dir, tmp_path / "backend", env={"IC_API_KEY": api_key})

    def write_stack(self, config: dict, stack: str = "local") -> pathlib.Path:
        path = self.dir / f"Pulumi.{stack}.yaml"
        path.write_text(yaml.safe_dump({"config": {f"gpu-migration:{k}": v for k, v in config.items()}},
                                       sort_keys=False))
        return path

    def stack(self, stack: str = "local", program=None):
        return self.engine.stack(stack, program)


# Read-only checks that run (as updates) on every up.
EVERY_UP_CHECKS = {"cluster-identity", "gpu-node-inventory", "operand-placement"}


SYMBOLS = {"create": "+", "delete": "-", "update": "~", "replace": "+-", "create-replacement": "+-",
           "delete-replaced": "+-", "remove-pending-replace": "-"}


def planned_changes(stack, **kwargs) -> dict[str, str]:
    """`pulumi preview` under the real engine: {resource name: + - ~ +-} for every step that is not `same`."""
    steps: dict[str, str] = {}

    def on_event(event) -> None:
        pre = event.resource_pre_event
        op = pre.metadata.op.value if pre is not None else "same"
        if op in SYMBOLS and not pre.metadata.type.startswith("pulumi:providers:"):
            name = pre.metadata.urn.rsplit("::", 1)[1]
            if op == "remove-pending-replace":  # a resource gone from the program, deleted before its dependency's
                steps[name] = "-"               # replacement: the CLI shows it as deleted
            elif steps.get(name) != "-":
                steps[name] = "+-" if steps.get(name, SYMBOLS[op]) != SYMBOLS[op] else SYMBOLS[op]

    stack.preview(on_event=on_event, **kwargs)
    return steps


def by_symbol(changes: dict[str, str]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for name, sym in changes.items():
        out.setdefault(sym, set()).add(name)
    return out


def meaningful(changes: dict[str, str]) -> dict[str, str]:
    """Changes other than the every-up checks."""
    return {k: v for k, v in changes.items() if k not in EVERY_UP_CHECKS}
