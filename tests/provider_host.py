"""Runs one RollbackVerification create the way Pulumi's dynamic provider host does, for the interruption test.

Mirrors pulumi/dynamic/__main__.py (pulumi 3.272) main(): gRPC calls run in a ThreadPoolExecutor(max_workers=4)
worker while the main thread sits in Event().wait(); on SIGINT (what the engine sends a plugin on cancellation:
pulumi sdk/go/common/resource/plugin/plugin.go, kill -> cmdutil.InterruptChildren) the main thread's
KeyboardInterrupt stops the server and main() returns, after which the interpreter waits for the worker.

    python tests/provider_host.py KUBECONFIG [NODE NAMESPACE]  (prints "started" once the check runs)
"""
import faulthandler
import signal
import sys
from concurrent import futures
from pathlib import Path
from threading import Event
from iks_gpu_migration.kube.rollback import _RollbackVerificationProvider

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))




def create(kubeconfig: str, node: str = "n1", namespace: str = "gpu-pilot") -> None:
    _RollbackVerificationProvider().create({
        "kubeconfig": kubeconfig, "node": node, "rolling_back": True, "extended_resource": "example.com/gpu",
        "image": "cuda", "namespace": namespace, "timeout": 600, "poll_interval": 30})


def main() -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks for the stacks if the host hangs
    # Python leaves SIGINT ignored when it starts with it ignored (a background job of a non-interactive shell, as
    # some CI runners start the tests); the engine's plugins get the usual KeyboardInterrupt handler.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    pool = futures.ThreadPoolExecutor(max_workers=4)
    pool.submit(create, *sys.argv[1:4])
    print("started", flush=True)
    try:
        Event().wait()
    except KeyboardInterrupt:
        pass  # the real host calls server.stop(0) here


main()
