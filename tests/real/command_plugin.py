"""A stand-in for the pulumi-command provider plugin (`pulumi-resource-command`), for the real engine.

The plugin itself is not served by the Go module proxy (github.com/pulumi/pulumi-command/provider: 403), so
tools/build can't build it. This one runs `local.Command` as pulumi-command v1.2.1 does
(provider/pkg/provider/local/commandOutputs.go `run`, commandController.go): nothing in preview; on create and on
update (without an `update` command) it runs `<interpreter, default /bin/sh -c> <create>` in the plugin's working
directory with `os.Environ()` of the plugin plus `environment`, fails with the command's output on a non-zero exit, and
returns the inputs with `stdout` and `stderr` (trailing newline trimmed) as outputs. What the engine does with them
(secret outputs, the state file, the environment it gives the plugin) is the real engine's.

`install(pulumi, pulumi_home, version)` registers this file as the plugin at `version` in `pulumi_home`.
"""
import json
import os
import pathlib
import shlex
import stat
import subprocess
import sys
import tempfile
from concurrent import futures
from threading import Event

PLUGIN_TYPE = "command:local:Command"


def _run(inputs: dict) -> dict:
    command = inputs.get("update") or inputs["create"]
    args = [*(inputs.get("interpreter") or ["/bin/sh", "-c"]), command]
    env = {**os.environ, **(inputs.get("environment") or {})}
    done = subprocess.run(args, env=env, cwd=inputs.get("dir") or os.getcwd(), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"exit status {done.returncode}: running {command!r}:\n{done.stdout}{done.stderr}")
    return {**inputs, "stdout": done.stdout.removesuffix("\n"), "stderr": done.stderr.removesuffix("\n")}


def serve() -> None:
    import grpc
    from google.protobuf import empty_pb2, json_format, struct_pb2
    from pulumi.runtime.proto import plugin_pb2, provider_pb2, provider_pb2_grpc

    def props(struct) -> dict:
        return json_format.MessageToDict(struct)

    def struct(values: dict):
        out = struct_pb2.Struct()
        out.update(values)
        return out

    class Servicer(provider_pb2_grpc.ResourceProviderServicer):
        def GetPluginInfo(self, request, context):  # noqa: N802 - gRPC method names
            return plugin_pb2.PluginInfo(version=os.environ.get("STAND_IN_VERSION", "0.0.0"))

        def Configure(self, request, context):  # noqa: N802
            return provider_pb2.ConfigureResponse(acceptSecrets=False, supportsPreview=True)

        def Check(self, request, context):  # noqa: N802
            return provider_pb2.CheckResponse(inputs=request.news)

        def Diff(self, request, context):  # noqa: N802
            olds, news = props(request.olds), props(request.news)
            changed = [k for k, v in news.items() if olds.get(k) != v]
            return provider_pb2.DiffResponse(
                changes=provider_pb2.DiffResponse.DIFF_SOME if changed else provider_pb2.DiffResponse.DIFF_NONE,
                diffs=changed)

        def Create(self, request, context):  # noqa: N802
            inputs = props(request.properties)
            try:
                outputs = inputs if request.preview else _run(inputs)
            except RuntimeError as e:
                context.abort(grpc.StatusCode.UNKNOWN, str(e))
            return provider_pb2.CreateResponse(id="hook-" + os.urandom(4).hex(), properties=struct(outputs))

        def Update(self, request, context):  # noqa: N802
            inputs = props(request.news)
            try:
                outputs = {**props(request.olds), **inputs} if request.preview else _run(inputs)
            except RuntimeError as e:
                context.abort(grpc.StatusCode.UNKNOWN, str(e))
            return provider_pb2.UpdateResponse(properties=struct(outputs))

        def Read(self, request, context):  # noqa: N802
            return provider_pb2.ReadResponse(id=request.id, properties=request.properties, inputs=request.inputs)

        def Delete(self, request, context):  # noqa: N802
            return empty_pb2.Empty()

        def Cancel(self, request, context):  # noqa: N802
            return empty_pb2.Empty()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    provider_pb2_grpc.add_ResourceProviderServicer_to_server(Servicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)  # the engine reads the port from the first line
    Event().wait()


def install(pulumi: str, pulumi_home: pathlib.Path, version: str, env: dict) -> None:
    """Register this file (run by this interpreter) as resource plugin `command` at `version`."""
    with tempfile.TemporaryDirectory() as tmp:
        launcher = pathlib.Path(tmp) / "pulumi-resource-command"
        launcher.write_text(f"#!/bin/sh\nSTAND_IN_VERSION={shlex.quote(version)} exec {shlex.quote(sys.executable)} "
                            f"{shlex.quote(__file__)} \"$@\"\n")
        launcher.chmod(launcher.stat().st_mode | stat.S_IXUSR)
        subprocess.run([pulumi, "plugin", "install", "resource", "command", version, "--file", str(launcher)],
                       env={**env, "PULUMI_HOME": str(pulumi_home)}, check=True, stdout=subprocess.DEVNULL)


def plugin_version() -> str:
    """The pulumi-command plugin version the installed pulumi_command package requests."""
    import pulumi_command
    return json.loads((pathlib.Path(pulumi_command.__file__).parent / "pulumi-plugin.json").read_text())["version"]


if __name__ == "__main__":
    serve()
