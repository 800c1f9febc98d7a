"""The real tools (Pulumi CLI, Kubernetes provider, control plane), built by tools/build into a cache keyed by their pins.

`engine_env()` is the environment every real-engine run uses: the built CLI first on PATH, a PULUMI_HOME inside the
tool cache with the Kubernetes provider registered under the version pulumi_kubernetes requests, and no automatic
plugin downloads, so a missing plugin fails at once instead of trying the network.
"""
from __future__ import annotations

import functools
import json
import os
import pathlib
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


@functools.cache
def bin_dir() -> pathlib.Path:
    """Builds what is missing (minutes when cold, instant when cached) and returns the bin directory."""
    done = subprocess.run([str(BUILD)], stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"tools/build failed with exit code {done.returncode} (its log is on stderr above)")
    path = pathlib.Path(done.stdout.strip().splitlines()[-1])
    missing = [t for t in ("pulumi", "pulumi-resource-kubernetes", "kube-apiserver", "kube-scheduler",
                           "kube-controller-manager", "etcd", "kwok") if not (path / t).exists()]
    if missing:
        raise RuntimeError(f"tools/build finished but {path} lacks {', '.join(missing)}")
    return path


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


def versions_line() -> str:
    """`pulumi <version>, kubernetes <version>` of the tools in use, for the CI summary line."""
    b = bin_dir()
    pulumi_v = subprocess.run([str(b / "pulumi"), "version"], capture_output=True, text=True).stdout.strip()
    kube_v = subprocess.run([str(b / "kube-apiserver"), "--version"], capture_output=True, text=True).stdout.strip()
    return f"pulumi {pulumi_v}, kubernetes {kube_v.split()[-1] if kube_v else '?'}"
