"""The real tools (Pulumi CLI, Kubernetes provider, control plane, kubelet and its runtime), built by tools/build into a
cache keyed per tool by its pins and recipe.

`engine_env()` is the environment every real-engine run uses: the built CLI first on PATH, a PULUMI_HOME inside the
tool cache with the Kubernetes provider registered under the version pulumi_kubernetes requests, and no automatic
plugin downloads, so a missing plugin fails at once instead of trying the network.
"""
from __future__ import annotations

import functools
import json
import os
import pathlib
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
BUILD = REPO / "tools" / "build"


def _versions() -> dict[str, str]:
    out = {}
    for line in (REPO / "tools" / "versions").read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


# What a cold tools/build fills, measured from empty caches (GB; 2026-12-04, with the GPU Operator): Go's module
# cache, Go's build cache, the tools cache.
BUILD_NEEDS_GB = {"GOMODCACHE": 4.0, "GOCACHE": 11.0, "tools": 1.0}


class ToolsError(RuntimeError):
    """The tools can't be built here; the message says what is missing."""


def _existing(path: pathlib.Path) -> pathlib.Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def disk_shortfall(places: dict[str, pathlib.Path], free_gb=lambda p: shutil.disk_usage(p).free / 1e9) -> list[str]:
    """Filesystems with less room than a cold build fills there (BUILD_NEEDS_GB, summed per filesystem). Pure but
    for `free_gb`."""
    by_device: dict[int, tuple[float, list[str], pathlib.Path]] = {}
    for what, path in places.items():
        where = _existing(path)
        need, names, _ = by_device.get(where.stat().st_dev, (0.0, [], where))
        by_device[where.stat().st_dev] = (need + BUILD_NEEDS_GB[what], [*names, f"{what} ({path})"], where)
    return [f"{free_gb(where):.1f} GB free on the filesystem of {', '.join(names)}; a first build fills about "
            f"{need:.0f} GB there" for need, names, where in by_device.values() if free_gb(where) < need]


def _check_before_cold_build(bin_path: pathlib.Path) -> None:
    """Before a build from empty caches: Go on PATH and room on disk, each missing one named (tools/build checks Go
    too, but only once it runs; the disk only fills minutes later). Not when some tool was built in this cache
    before (a Pulumi CLI of any key, or the one-key layout of before per-tool keys): a new or changed tool then
    builds alone from Go's filled caches."""
    root = bin_path.parent.parent
    if (bin_path / "pulumi").exists() or any(root.glob("by-tool/pulumi-*/out/bin/pulumi")) \
            or any(root.glob("*/bin/pulumi")):
        return
    go = shutil.which("go")
    if go is None:
        raise ToolsError("Go is not on PATH: tools/build compiles the Pulumi CLI, the Kubernetes provider and control "
                         "plane, etcd, kwok and the NVIDIA GPU Operator from Go modules (Go 1.24 or newer; https://go.dev/dl/)")
    env = subprocess.run([go, "env", "GOMODCACHE", "GOCACHE"], capture_output=True, text=True).stdout.split()
    places = {"tools": bin_path.parent.parent}
    if len(env) == 2:
        places.update(GOMODCACHE=pathlib.Path(env[0]), GOCACHE=pathlib.Path(env[1]))
    short = disk_shortfall(places)
    if short:
        raise ToolsError("not enough disk for the first tools/build: " + "; ".join(short) + " (README, Prerequisites)")


@functools.cache
def bin_dir() -> pathlib.Path:
    """Builds what is missing (minutes when cold, instant when cached) and returns the bin directory."""
    printed = subprocess.run([str(BUILD), "--print"], stdout=subprocess.PIPE, text=True)
    if printed.returncode == 0 and printed.stdout.strip():
        _check_before_cold_build(pathlib.Path(printed.stdout.strip()))
    done = subprocess.run([str(BUILD)], stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"tools/build failed with exit code {done.returncode} (its log is on stderr above)")
    path = pathlib.Path(done.stdout.strip().splitlines()[-1])
    missing = [t for t in ("pulumi", "pulumi-resource-kubernetes", "kube-apiserver", "kube-scheduler",
                           "kube-controller-manager", "etcd", "kwok", "../gpu-operator/root/usr/bin/gpu-operator",
                           "../gpu-operator/chart/Chart.yaml", "kubelet", "containerd", "ctr",
                           "containerd-shim-runc-v2", "runc", "../cni/bin/bridge", "../gpu-stand-ins/dra-plugin")
               if not (path / t).exists()]
    if missing:
        raise RuntimeError(f"tools/build finished but {path} lacks {', '.join(missing)}")
    return path


def gpu_operator_root() -> pathlib.Path:
    """The GPU Operator image's filesystem (/usr/bin/gpu-operator, /opt/gpu-operator/...), built from its module."""
    return bin_dir().parent / "gpu-operator" / "root"


def gpu_operator_chart() -> pathlib.Path:
    """The GPU Operator's Helm chart from the same module (deployments/gpu-operator)."""
    return bin_dir().parent / "gpu-operator" / "chart"


def gpu_stand_ins() -> pathlib.Path:
    """pause, gpu-workload, device-plugin and dra-plugin, built from gpu_migration_local/nodes/stand_ins."""
    return bin_dir().parent / "gpu-stand-ins"


def plugin_version() -> str:
    """The Kubernetes provider version the installed pulumi_kubernetes package asks the engine for."""
    import pulumi_kubernetes
    meta = pathlib.Path(pulumi_kubernetes.__file__).parent / "pulumi-plugin.json"
    return json.loads(meta.read_text())["version"]


@functools.cache
def engine_env() -> dict[str, str]:
    b = bin_dir()
    pulumi_home = b.parent / "pulumi-home"
    env = {
        **os.environ,
        # The venv's python first: the dynamic-provider host runs `python3 -m pulumi.dynamic`. The tool dir stays off
        # PATH: the CLI finds its bundled launcher beside itself, and plugins only where `plugin install` put them.
        "PATH": os.pathsep.join([str(pathlib.Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "PULUMI_HOME": str(pulumi_home),
        # The dynamic-provider host imports the providers by module name: from this checkout, not from wherever the
        # venv's editable install points (another worktree would run other provider code than the program).
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])),
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
        # Plugins come from PULUMI_HOME, registered at the version the SDK requests, not from beside the CLI.
        "PULUMI_IGNORE_AMBIENT_PLUGINS": "true",
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_AUTOMATION_API_SKIP_VERSION_CHECK": "true",
    }
    want = plugin_version()
    if want != _versions()["PULUMI_KUBERNETES_PLUGIN_VERSION"]:
        raise RuntimeError(f"pulumi_kubernetes requests plugin {want} but tools/versions registers "
                           f"{_versions()['PULUMI_KUBERNETES_PLUGIN_VERSION']}: update PULUMI_KUBERNETES_PLUGIN_VERSION")
    plugin_dir = pulumi_home / "plugins" / f"resource-kubernetes-v{want}"
    if not (plugin_dir / "pulumi-resource-kubernetes").exists():
        subprocess.run([str(b / "pulumi"), "plugin", "install", "resource", "kubernetes", want,
                        "--file", str(b / "pulumi-resource-kubernetes")], env=env, check=True,
                       stdout=subprocess.DEVNULL)
    return env


def kubelet_version() -> str:
    out = subprocess.run([str(bin_dir() / "kubelet"), "--version"], capture_output=True, text=True).stdout.strip()
    return out.split()[-1] if out else "?"


def versions_line() -> str:
    """`pulumi <version>, kubernetes <version>` of the tools in use, for the CI summary line."""
    b = bin_dir()
    pulumi_v = subprocess.run([str(b / "pulumi"), "version"], capture_output=True, text=True).stdout.strip()
    kube_v = subprocess.run([str(b / "kube-apiserver"), "--version"], capture_output=True, text=True).stdout.strip()
    return (f"pulumi {pulumi_v}, kubernetes {kube_v.split()[-1] if kube_v else '?'}, "
            f"gpu-operator {_versions()['GPU_OPERATOR_MODULE']}")
