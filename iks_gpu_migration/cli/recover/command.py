"""`recover`: read everything, decide (adopt.py, holders.py), show the plan; with --yes, back up the state and act."""
from __future__ import annotations

import argparse
import contextlib
import getpass
import os
import pathlib
import socket
import sys
from datetime import datetime, timezone
from typing import Any, Callable, Iterator, Optional

from . import backup
from .adopt import (HELM_RELEASE, Step, adopt_pending, decide_object, decide_release, never_read, pending_creates,
                    provider_id, with_force)
from .backend import broken_sidecars, file_root, kind, parse_time, read_locks
from .cluster import Cluster
from .holders import CancelDecision, Holder, check_bucket_locks, decide_cancel, judge_lock, project_processes
from .processes import process_table, read_proc
from .stack import PROJECT, Cli, RecoverError, foreign_urns, project_dir, stack_name

Out = Callable[[str], None]


def stack_kubeconfigs(cli: Cli, project: pathlib.Path, flag: Optional[str]) -> tuple[Optional[str], Optional[str]]:
    """The stack's kubeconfigs, for its objects and for its Helm releases: `gpu-migration:kubeconfig` and
    `gpu-migration:chartKubeconfig` (default: the first; the releases' own identity, which alone may read their
    records, rbac/gpu-migration-charts.yaml), relative to the project directory as the program reads them. The refresh
    reads the cluster through the stack's providers, so recover reads that cluster too. Without `kubeconfig`,
    --kubeconfig or the ambient KUBECONFIG / ~/.kube/config, as the program's default provider does."""
    configured = cli.config(f"{PROJECT}:kubeconfig")
    # `~` as the program's own kubeconfig validator and the Kubernetes client expand it
    path = str((project / os.path.expanduser(configured)).resolve()) if configured else None
    if path and flag and pathlib.Path(flag).resolve() != pathlib.Path(path):
        raise RecoverError(f"--kubeconfig {flag} is not the stack's {PROJECT}:kubeconfig ({configured}): the "
                           f"refresh reads the stack's cluster, so recover reads that one too; drop --kubeconfig")
    cluster = path or flag
    charts = cli.config(f"{PROJECT}:chartKubeconfig")
    return cluster, str((project / os.path.expanduser(charts)).resolve()) if charts else cluster


class Recovery:
    def __init__(self, stack: str, cli: Cli, project: pathlib.Path, out: Out, kubeconfig: Optional[str],
                 yes: bool, force: bool) -> None:
        self.stack, self.cli, self.project, self.out = stack, cli, project, out
        self.name, self.kubeconfig_flag, self.yes, self.force = stack_name(stack), kubeconfig, yes, force
        self._clusters: dict[Optional[str], Cluster] = {}

    def cluster(self, kubeconfig: Optional[str]) -> Cluster:
        if kubeconfig not in self._clusters:
            self._clusters[kubeconfig] = Cluster(kubeconfig)
        return self._clusters[kubeconfig]

    def run(self) -> int:
        url = self.cli.backend_url()
        self.backend, self.root = kind(url), file_root(url) if url.startswith("file://") else None
        if self.root is not None and not self.repair_sidecars():
            return 0
        self.export_text, self.document = self.cli.export()
        deployment = self.document.get("deployment") or {}
        foreign = foreign_urns(deployment, self.name)
        if foreign:
            raise RecoverError(f"the state of stack {self.stack} holds URNs of another project or stack ("
                               f"{', '.join(foreign[:3])}{' ...' if len(foreign) > 3 else ''}); recover works on "
                               f"urn:pulumi:{self.name}::{PROJECT}::... only and changed nothing")
        self.kubeconfig, self.chart_kubeconfig = stack_kubeconfigs(self.cli, self.project, self.kubeconfig_flag)
        return self.resolve(deployment)

    def repair_sidecars(self) -> bool:
        """False (stop) in a dry run that found a sidecar to remove: the stack can't be read before."""
        for attrs in broken_sidecars(self.root, self.name):
            if not self.yes:
                self.out(f"would remove {attrs}: the kill cut its write short (empty or partial), so the stack can't "
                         f"be read (a missing one reads as default attributes; `rm {attrs}` does the same). The rest "
                         f"of the plan shows once it is gone (`--yes` removes it). dry run: nothing changed")
                return False
            attrs.unlink()
            self.out(f"removed {attrs}: the kill cut its write short (empty or partial), so the stack could not be "
                     f"read")
        return True

    # --- the plan ---------------------------------------------------------------------------------------------

    def holders(self, now: datetime) -> list[Holder]:
        if self.root is None:
            return []
        host, user = socket.gethostname(), getpass.getuser()  # the username pulumi writes (lock.go: user.Current)
        return [judge_lock(lock, host, read_proc(lock.pid) if lock.pid else None, now, user)
                for lock in read_locks(self.root, self.name)]

    def killed_start(self, holders: list[Holder], in_progress: Optional[str]) -> tuple[Optional[datetime], str]:
        """When the killed update started: its lock file's timestamp (its CLI writes it when it takes the stack,
        pkg/backend/diy/lock.go, by the clock of the machine whose provider plugin ran Helm and stamped the release),
        or the start Pulumi Cloud reports. Nothing else dates it: a pending operation carries no time (the engine sets
        `created` once the provider's Create returned, pkg/resource/deploy/step.go), and a DIY backend records an
        update in its history only when it ends (pkg/backend/diy/backend.go apply, addToHistory)."""
        if any(h.state == "live" for h in holders):
            return None, "an update that runs holds the stack"
        stamps = [h.lock.timestamp for h in holders if h.lock.timestamp]
        if stamps:
            return max(stamps), "from its lock file"
        if in_progress:
            return parse_time(in_progress), "the start of the update Pulumi Cloud reports in progress"
        if self.backend == "file":
            return None, "the stack has no lock file left: was `pulumi cancel` run already?"
        return None, "this backend's lock files are not read here"

    def decide(self, deployment: dict[str, Any]) -> tuple[CancelDecision, list[Step], tuple]:
        now = datetime.now(timezone.utc)
        holders = self.holders(now)
        in_progress = None
        if self.backend == "cloud":
            in_progress = self.cli.update_in_progress_since()
        procs = project_processes(process_table(), str(self.project), self.name, os.getpid())
        pending = bool(deployment.get("pending_operations"))
        cancel = decide_cancel(self.backend, holders, procs, in_progress, self.name, pending)
        start, source = self.killed_start(holders, in_progress)
        steps = [self.decide_create(r, start, source) for r in pending_creates(deployment)]
        return cancel, steps, (start, source)

    def decide_create(self, resource: dict[str, Any], start: Optional[datetime], source: str) -> Step:
        rid = provider_id(resource)
        if rid is None:
            return decide_object(resource, None, start, source)
        namespace, _, name = rid.rpartition("/")
        if resource["type"] == HELM_RELEASE:
            with self.kube_errors(f"reading the Helm records of {rid}", self.chart_kubeconfig, "nothing changed"):
                records = self.cluster(self.chart_kubeconfig).helm_records(namespace, name)
            return decide_release(resource, records, start, source)
        with self.kube_errors(f"reading {rid}", self.kubeconfig, "nothing changed"):
            fields = self.cluster(self.kubeconfig).managed_fields(resource, namespace or None, name)
        return decide_object(resource, fields, start, source)

    @contextlib.contextmanager
    def kube_errors(self, what: str, kubeconfig: Optional[str], state: str) -> Iterator[None]:
        """A failed cluster call as one RecoverError naming the kubeconfig (the client raises many kinds)."""
        try:
            yield
        except RecoverError:
            raise
        except Exception as e:  # noqa: BLE001 - ApiException, urllib3 errors, ConfigException, ...
            source = kubeconfig or "KUBECONFIG / ~/.kube/config"
            raise RecoverError(f"{what} from the cluster of {source} failed ({' '.join(str(e).split())[:300]}); "
                               f"{state}") from None

    def show(self, deployment: dict[str, Any], cancel: CancelDecision, steps: list[Step], start: tuple,
             unread: list[str]) -> None:
        ops = deployment.get("pending_operations") or []
        when = f"started {start[0].isoformat(timespec='seconds')}, {start[1]}" if start[0] else start[1]
        head = f"{len(ops)} pending operation(s) of an update that did not finish ({when})" if ops else \
            "no pending operations"
        self.out(f"stack {self.stack} ({self.project}): {head}")
        self.out(f"  - {cancel.why}" + (f" [needs --force: {cancel.needs_force}]" if cancel.needs_force else ""))
        for s in steps:
            if s.action == "adopt":
                text = f"adopt {s.urn} as {s.id}: {s.why}"
            elif s.action == "remove-records":
                text = (f"remove Helm record(s) {', '.join(f'{s.namespace}/{r}' for r in s.records)} of {s.urn}: "
                        f"{s.why}; the next `up` installs it again (Helm adopts the objects it had made)")
            else:
                text = f"clear {s.urn}: {s.why}"
            self.out(f"  - {'needs --force: ' if s.forced else ''}{text}")
        for op in ops:
            if op.get("type") != "creating":
                self.out(f"  - drop pending {op.get('type')} of {op['resource']['urn']}: the next `up` reads it anew")
        if unread:
            self.out(f"  - refresh {len(unread)} adopted resource(s) never read from the cluster (the refresh after "
                     f"recover's import did not finish), which `pulumi up` would diff against nothing: "
                     f"{', '.join(unread)}")

    # --- doing ------------------------------------------------------------------------------------------------

    def resolve(self, deployment: dict[str, Any]) -> int:
        cancel, steps, start = self.decide(deployment)
        unread = never_read(deployment)
        pending = bool(deployment.get("pending_operations"))
        if not (pending or unread or cancel.cancel):
            if self.backend == "diy":  # a bucket's lock files are not read (decide_cancel): don't claim "no lock"
                self.out(f"stack {self.stack}: no pending operations; recover doesn't read the bucket's lock files, "
                         f"so if `pulumi up --stack {self.stack}` says the stack is locked, "
                         f"{check_bucket_locks(self.name)}, then run `pulumi cancel --stack {self.stack}`")
                return 0
            self.out(f"stack {self.stack}: no pending operations and no lock to remove; run `pulumi up --stack "
                     f"{self.stack}`")
            return 0
        self.show(deployment, cancel, steps, start, unread)
        taken, refused = with_force(steps, self.force)
        if cancel.blockers:
            self.out("stopped, nothing changed: " + "\n  ".join(cancel.blockers))
            return 1
        if (refused or cancel.needs_force) and not self.force:
            what = [s.urn for s in refused] + (["`pulumi cancel`"] if cancel.needs_force else [])
            self.out(f"stopped, nothing changed: {len(what)} item(s) above need --force ({', '.join(what)}); check "
                     f"what each says, then run again with --force to accept them")
            return 1
        if not self.yes:
            last = backup.latest(self.project, self.name)
            undo = f"; the state from before recover's last run: {backup.restore_command(self.stack, last)}" \
                if unread and last else ""
            self.out(f"dry run: nothing changed. Run again with --yes to do the above (recover first writes a backup "
                     f"of the state){undo}.")
            return 0
        if pending or unread:
            self.write_backup()
        done: list[str] = []
        try:
            self.act(deployment, cancel, taken, done)
        except RecoverError as e:
            if done:
                raise RecoverError(f"{e}\nDone before that: {'; '.join(done)}. Run recover again: it plans from what "
                                   f"is left (the state from before: {self.restore})") from None
            raise
        if not (pending or unread):
            self.out(f"stack {self.stack}: lock removed; run `pulumi up --stack {self.stack}` to continue")
            return 0
        return self.refresh("pending operations resolved" if pending else "adopted resources read")

    def act(self, deployment: dict[str, Any], cancel: CancelDecision, taken: list[Step], done: list[str]) -> None:
        """Remove the killed installs' records, cancel, import; `done` says what happened, should a later step fail."""
        for s in taken:
            if s.action == "remove-records":
                with self.kube_errors(f"removing the Helm records of {s.urn}", self.chart_kubeconfig,
                                      "the state is unchanged"):
                    self.cluster(self.chart_kubeconfig).remove_records(s.namespace, s.records)
                done.append(f"removed Helm record(s) {', '.join(s.records)} of {s.urn}")
                self.out(done[-1])
        if cancel.cancel:
            run = self.cli.run("cancel", "--yes")
            if run.returncode != 0:
                raise RecoverError(f"pulumi cancel --stack {self.stack} failed; the state is unchanged: "
                                   f"{(run.stdout + run.stderr).strip()[-1500:]}")
            done.append("cancelled the killed update (`pulumi cancel`)")
            self.out(done[-1])
        if deployment.get("pending_operations"):
            self.cli.import_state({**self.document, "deployment": adopt_pending(deployment, taken)})
            for s in taken:
                if s.action == "adopt":
                    self.out(f"adopted {s.urn} as {s.id}" + (f" (field manager {s.field_manager})"
                                                             if s.field_manager else ""))

    def write_backup(self) -> None:
        path = backup.write(self.project, self.name, self.export_text)
        self.restore = backup.restore_command(self.stack, path)
        self.out(f"backup of the state before this change: {path}\n  restore it (in {self.project}) with: "
                 f"{self.restore}")

    def refresh(self, what: str) -> int:
        """Read every adopted resource from the cluster (one gone is dropped, the next `up` creates it) and the rest
        of the stack from reality, as after any interruption."""
        done = self.cli.run("refresh", "--yes", "--skip-preview")
        if done.returncode != 0:
            self.out(f"error: pulumi refresh --stack {self.stack} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
                     f"\nThe state holds the adopted resources without what the cluster has (no outputs): fix the "
                     f"cause and run recover --yes again, which redoes the refresh; or put the state back with: "
                     f"{self.restore}")
            return 1
        self.out(f"stack {self.stack}: {what}; run `pulumi up --stack {self.stack}` to continue")
        return 0


def recover(stack: str, pulumi: str = "pulumi", env: Optional[dict] = None, out: Out = print,
            kubeconfig: Optional[str] = None, cwd: Optional[str] = None, yes: bool = False,
            force: bool = False) -> int:
    """Resolve what a killed `pulumi up` left in `stack` of the project in `cwd` (default: the working directory).
    A dry run unless `yes`; 0 when done (or, in a dry run, when --yes would do the plan shown), 1 when stopped."""
    try:
        project = project_dir(pathlib.Path(cwd or os.getcwd()))
        recovery = Recovery(stack, Cli(pulumi, stack, env, str(project)), project, out, kubeconfig, yes, force)
        return recovery.run()
    except RecoverError as e:
        out(f"error: {e}")
        return 1


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m iks_gpu_migration.cli.recover",
                                     description="Resolve what a killed `pulumi up` left in a stack (dry run unless "
                                                 "--yes). docs/recovery.md has the details.")
    parser.add_argument("--stack", required=True)
    parser.add_argument("--yes", action="store_true", help="act (default: show what would be done, change nothing)")
    parser.add_argument("--force", action="store_true",
                        help="also do what the dry run marks `needs --force` (objects this stack can't be shown to "
                             "have made; a cancel whose lock holder can't be checked)")
    parser.add_argument("--project-dir", "--cwd", dest="project_dir",
                        help="the project directory (Pulumi.yaml of gpu-migration; default: the working directory)")
    parser.add_argument("--pulumi", default="pulumi", help="the pulumi CLI (default: from PATH)")
    parser.add_argument("--kubeconfig", help="the cluster's kubeconfig when the stack sets no gpu-migration:kubeconfig "
                                             "(default: KUBECONFIG / ~/.kube/config)")
    args = parser.parse_args(argv)
    return recover(args.stack, args.pulumi, kubeconfig=args.kubeconfig, cwd=args.project_dir, yes=args.yes,
                   force=args.force)


if __name__ == "__main__":
    sys.exit(main())
