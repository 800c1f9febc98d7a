"""The local demo: builds or finds the tools, starts the control plane, the IKS emulator and the GPU doubles, and runs
the whole migration with the real `pulumi up` on the `local` stack (Pulumi.local.yaml). The cluster stays up for
inspection until Ctrl-C. Every run starts afresh: the IKS emulator lives in this process, so an earlier run's cluster
and stack state could not match it.

    venv/bin/python -m gpu_migration_local [up|preview] [--stack local]
"""
from __future__ import annotations

import argparse
import itertools
import pathlib
import shutil
import signal
import sys
import threading

import yaml

from . import tools
from .control_plane import write_private
from .engine import Engine, printer
from .env import LocalCluster
from .iks_emulator import IksEmulator
from .iks_nodes import IksNodeSync

REPO = pathlib.Path(__file__).resolve().parents[1]
STATE = REPO / ".local"  # git-ignored: cluster data, kubeconfig, file backend


def _stack_file(stack: str) -> dict:
    path = REPO / f"Pulumi.{stack}.yaml"
    if not path.exists():
        sys.exit(f"no stack file {path.name}: the local demo runs a stack whose endpoints point at 127.0.0.1")
    return yaml.safe_load(path.read_text())["config"]


def seed(iks: IksEmulator, config: dict) -> None:
    """The cluster of the stack file as it is before the migration: master and GPU workers at 1.35."""
    for node in config["gpu-migration:nodes"]:
        worker = iks.add_worker(pool_name="gpu", version="1.35.4_1540", worker_id=node["workerId"])
        worker["networkInterfaces"][0]["ipAddress"] = node["name"]
    # New workers get 10.240.0.(n % 250 + 2) from this counter, shared with IAM tokens: from 1020 that is .22 upwards
    # for 230 draws, never a configured name (.11-.13); from 1000 the ninth draw was .11 (tests/real/local_iks.py).
    iks._ids = itertools.count(1020)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpu_migration_local", description=__doc__.split("\n")[0])
    parser.add_argument("command", nargs="?", default="up", choices=["up", "preview"])
    parser.add_argument("--stack", default="local")
    parser.add_argument("--exit", action="store_true", help="stop the cluster when the run ends (no inspection)")
    args = parser.parse_args(argv)
    config = _stack_file(args.stack)
    endpoint = config["gpu-migration:ibmCloud"]["endpoint"]
    port = int(endpoint.rsplit(":", 1)[1].split("/")[0])

    print("building or finding the tools (tools/build; minutes when cold)...", flush=True)
    bin_dir = tools.bin_dir()
    print(f"tools: {tools.versions_line()} in {bin_dir}", flush=True)
    for stale in (STATE / "cluster", STATE / "backend"):  # an earlier run's; see the module docstring
        if stale.exists():
            print(f"removing {stale} of an earlier run (a fresh IKS emulator starts with every run)", flush=True)
            shutil.rmtree(stale)
    STATE.mkdir(exist_ok=True)
    STATE.chmod(0o700)  # the cluster's credentials and the kubeconfig live below it
    cluster = LocalCluster(workdir=STATE / "cluster", keep_workdir=True)
    (STATE / "cluster").mkdir(parents=True, exist_ok=True)
    iks = IksEmulator(cluster=config["gpu-migration:clusterName"], port=port)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with cluster:
        iks.start()
        sync = IksNodeSync(iks, cluster.api_client).start()
        try:
            seed(iks, config)
            (REPO / config["gpu-migration:kubeconfig"]).parent.mkdir(parents=True, exist_ok=True)
            write_private(REPO / config["gpu-migration:kubeconfig"], cluster.kubeconfig.read_text())
            engine = Engine(REPO, STATE / "backend", env={"IC_API_KEY": iks.api_key})
            stack = engine.stack(args.stack)
            print(f"running pulumi {args.command} --stack {args.stack} ...", flush=True)
            if args.command == "preview":
                stack.preview(on_output=printer())
            else:
                stack.up(on_output=printer())
            code = 0
        except Exception as e:  # noqa: BLE001 - the engine already printed the details
            print(f"\n{args.command} failed: {e}", file=sys.stderr)
            code = 1
        if not args.exit:
            kubeconfig = REPO / config["gpu-migration:kubeconfig"]
            print(f"\nThe local cluster is up for inspection:\n  export KUBECONFIG={kubeconfig}\n"
                  f"  kubectl get nodes -L nvidia.com/gpu.deploy.device-plugin\n"
                  f"  {bin_dir / 'pulumi'} stack history --stack {args.stack}   "
                  f"(PULUMI_BACKEND_URL={(STATE / 'backend').as_uri()}, PULUMI_CONFIG_PASSPHRASE=local-passphrase)\n"
                  "Press Ctrl-C to stop it (everything runs in this process).", flush=True)
            stop.wait()
        sync.stop()
        iks.stop()
    return code


if __name__ == "__main__":
    sys.exit(main())
