"""Recovery after a killed `pulumi up` (SIGKILL, a lost terminal, a crashed machine).

A killed update leaves "pending creates" in the state: resources whose create had started. The next `up` only warns
and creates them again, so a Helm release the killed run had installed fails with Helm's "cannot re-use a name that is
still in use". This command adopts what exists (Kubernetes objects and Helm releases, whose IDs follow from their
inputs: they go into the state with that ID and a refresh reads them) and drops the rest (this program's dynamic
resources, whose create resumes from the real state of the worker or node). A Helm install killed half-way stays
`pending-install` (Helm's release record, a Secret `sh.helm.release.v1.<name>.v<n>` labelled
`status=pending-install`; helm/helm pkg/storage/driver/secrets.go) and blocks every later install of that name: its
record is removed, so the next `up` installs the release again and Helm adopts the objects it had already made
(they carry its meta.helm.sh/release-name annotations; helm/helm pkg/action/validate.go). Run it only when
the killed `pulumi up` is really gone: it first removes that update's stack lock (`pulumi cancel`).

    python -m iks_gpu_migration.cli.recover --stack pilot [--pulumi PATH]
    pulumi up --stack pilot
"""
from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
from typing import Any, Optional
from urllib.parse import unquote, urlparse

_K8S = "kubernetes:"


def provider_id(resource: dict[str, Any]) -> Optional[str]:
    """The ID pulumi-kubernetes gives what this pending create would have made, or None (nothing to import):
    `<namespace>/<name>` for namespaced objects and Helm releases, `<name>` for cluster-scoped objects
    (pulumi/pulumi-kubernetes provider/pkg/provider/provider.go: Create returns the object's fully qualified name)."""
    typ, inputs = resource.get("type", ""), resource.get("inputs") or {}
    if not typ.startswith(_K8S):
        return None
    if typ == "kubernetes:helm.sh/v3:Release":
        name, namespace = inputs.get("name"), inputs.get("namespace") or "default"
        return f"{namespace}/{name}" if name else None
    if typ.endswith("Patch"):
        return None  # a patch owns fields of an object it did not create: the next `up` applies it again
    meta = inputs.get("metadata") or {}
    name = meta.get("name")
    if not name:
        return None
    return f"{meta['namespace']}/{name}" if meta.get("namespace") else name


def pending_creates(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    return [op["resource"] for op in deployment.get("pending_operations") or [] if op.get("type") == "creating"]


def adopt_pending(deployment: dict[str, Any], ids: dict[str, str]) -> dict[str, Any]:
    """The deployment with the pending creates {urn: id} moved into its resources and every other pending operation
    dropped (`pulumi stack import` drops them anyway, pkg/cmd/pulumi/stack/io.go; a refresh would drop all but the
    creates). An adopted resource gets its ID and no outputs, so the refresh that follows reads it the way an import
    does (pulumi-kubernetes provider/pkg/provider/provider.go and helm_release.go: Read with an empty old state takes
    the object from its ID). Appended last, it follows everything it depends on, as the state's order requires.

    Pulumi's own `refresh --import-pending-creates` can't do this: it rewrites the operation to `importing`, and the
    3.274 engine keeps only pending *creates* from the base snapshot (pkg/backend/snapshot.go, `Snap`), so the
    resource is dropped, never imported, and the next `up` installs the Helm release again ("cannot re-use a name
    that is still in use")."""
    resources = list(deployment.get("resources") or [])
    resources += [{**r, "id": ids[r["urn"]], "outputs": {}} for r in pending_creates(deployment) if r["urn"] in ids]
    return {**deployment, "resources": resources, "pending_operations": []}


class Cli:
    """The `pulumi` CLI for one stack, run in the project's directory (`cwd`: the CLI reads Pulumi.yaml there and
    writes the stack's settings file, Pulumi.<stack>.yaml, beside it)."""

    def __init__(self, pulumi: str, stack: str, env: Optional[dict] = None, cwd: Optional[str] = None) -> None:
        self.pulumi, self.stack, self.env, self.cwd = pulumi, stack, env, cwd

    def run(self, *args: str, stdin: Optional[str] = None) -> subprocess.CompletedProcess:
        return subprocess.run([self.pulumi, *args, "--stack", self.stack, "--non-interactive"], input=stdin,
                              capture_output=True, text=True, env=self.env, cwd=self.cwd)


def import_state(cli: Cli, deployment: dict[str, Any]) -> tuple[bool, str]:
    """`pulumi stack import` of `deployment` (the state edit Pulumi documents for pending operations; read from
    stdin, pkg/cmd/pulumi/stack/stack_import.go); False and why if the CLI refused it."""
    done = cli.run("stack", "import", stdin=json.dumps({"version": 3, "deployment": deployment}))
    return done.returncode == 0, (done.stdout + done.stderr).strip()[-1500:]


def release_stuck_installs(kubeconfig: Optional[str], namespace: str, name: str, out=print) -> bool:
    """Delete the `pending-install` records of release `name`, left by a killed install; True if there were any."""
    from kubernetes import client, config as kconfig  # noqa: PLC0415 - only this path needs the cluster
    api = client.CoreV1Api(kconfig.new_client_from_config(kubeconfig))
    selector = f"owner=helm,name={name},status=pending-install"
    for secret in api.list_namespaced_secret(namespace, label_selector=selector).items:
        api.delete_namespaced_secret(secret.metadata.name, namespace)
        out(f"removed Helm record {namespace}/{secret.metadata.name} of the install of {name} that was killed "
            f"(pending-install); the next `up` installs {name} again")
    return not api.list_namespaced_secret(namespace, label_selector=f"owner=helm,name={name}").items


def repair_file_backend(cli: Cli, out=print) -> None:
    """Remove an unreadable sidecar `<stack>.json*.attrs` of a file backend's checkpoint. gocloud.dev's fileblob (the
    file backend's storage) writes that sidecar (os.Create, then its JSON) before it renames the new checkpoint into
    place (blob/fileblob/fileblob.go writerWithSidecar.Close, attrs.go setAttrs): a kill in between leaves it empty,
    the checkpoint beside it whole, and every command fails with "failed to load checkpoint: EOF" (attrs.go getAttrs
    decodes it). A missing sidecar reads as default attributes (getAttrs), so removing it is safe."""
    who = subprocess.run([cli.pulumi, "whoami", "--json", "--non-interactive"], capture_output=True, text=True,
                         env=cli.env, cwd=cli.cwd)
    try:
        url = json.loads(who.stdout).get("url") or ""
    except ValueError:
        return
    if not url.startswith("file://"):
        return
    stacks = pathlib.Path(unquote(urlparse(url).path)) / ".pulumi" / "stacks"
    for attrs in sorted(stacks.glob(f"*/{cli.stack.rsplit('/', 1)[-1]}.json*.attrs")):
        try:
            json.loads(attrs.read_text())
        except ValueError:
            attrs.unlink()
            out(f"removed {attrs}: the kill cut its write short (empty or partial), so the stack could not be read")


def recover(stack: str, pulumi: str = "pulumi", env: Optional[dict] = None, out=print,
            kubeconfig: Optional[str] = None, cwd: Optional[str] = None) -> int:
    cli = Cli(pulumi, stack, env, cwd)
    repair_file_backend(cli, out)
    # The killed CLI could not release its lock; with no update running, `pulumi cancel` removes it (a no-op else).
    cli.run("cancel", "--yes")
    exported = cli.run("stack", "export")
    if exported.returncode != 0:
        out(f"error: pulumi stack export --stack {stack} failed: {exported.stderr.strip()}")
        return 1
    deployment = json.loads(exported.stdout).get("deployment") or {}
    pending = pending_creates(deployment)
    if not pending:
        out(f"stack {stack}: no pending creates; run `pulumi up --stack {stack}`")
        return 0
    ids: dict[str, str] = {}
    for r in pending:
        rid = provider_id(r)
        if not rid:
            out(f"cleared {r['urn']}: its step resumes from the real state on the next `up`")
            continue
        if r.get("type") == "kubernetes:helm.sh/v3:Release":
            namespace, name = rid.split("/", 1)
            if release_stuck_installs(kubeconfig, namespace, name, out):
                continue  # no release left to import: the next `up` installs it
        ids[r["urn"]] = rid
    ok, why = import_state(cli, adopt_pending(deployment, ids))
    if not ok:
        out(f"error: pulumi stack import --stack {stack} refused the resolved state; nothing changed:\n{why}")
        return 1
    for urn, rid in ids.items():
        out(f"adopted {urn} as {rid}; the refresh reads it (gone: the next `up` creates it)")
    # The refresh reads every adopted resource from the cluster (one that was never made is dropped) and the rest of
    # the stack from reality, as after any interruption.
    refreshed = cli.run("refresh", "--yes", "--skip-preview")
    if refreshed.returncode != 0:
        out(f"error: pulumi refresh --stack {stack} failed:\n{refreshed.stdout[-2000:]}{refreshed.stderr[-2000:]}")
        return 1
    out(f"stack {stack}: pending creates resolved; run `pulumi up --stack {stack}` to continue")
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m iks_gpu_migration.cli.recover", description=__doc__.split("\n")[0])
    parser.add_argument("--stack", required=True)
    parser.add_argument("--pulumi", default="pulumi", help="the pulumi CLI (default: from PATH)")
    parser.add_argument("--kubeconfig", help="the cluster's kubeconfig (default: KUBECONFIG / ~/.kube/config)")
    args = parser.parse_args(argv)
    return recover(args.stack, args.pulumi, kubeconfig=args.kubeconfig)


if __name__ == "__main__":
    sys.exit(main())
