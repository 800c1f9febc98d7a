"""Recovery after a killed `pulumi up` (SIGKILL, a lost terminal, a crashed machine): `python -m
iks_gpu_migration.cli.recover --stack S` (a dry run), then with `--yes`; docs/recovery.md.

A killed update leaves "pending creates" in the state: resources whose create had started. The next `up` only warns
and creates them again, so a Helm release the killed run had installed fails with Helm's "cannot re-use a name that is
still in use". recover adopts what the killed run made (Kubernetes objects that pulumi-kubernetes applied, Helm
releases first deployed after the killed update started: into the state under their IDs, then a refresh reads them),
removes the record of a Helm install the kill cut short (`pending-install`, which blocks every later install of that
name; Helm adopts the objects it had made, helm/helm pkg/action/validate.go) and drops the rest (this program's
dynamic resources resume from the real state of the worker or node).

It refuses what could hurt: another project's stack (stack.py), a stack an update still holds (holders.py: lock files
and live processes), objects it can't show this stack made (adopt.py, unless --force); and it backs the state up
before changing it (backup.py).

Modules: adopt.py (pure: what each pending create becomes), holders.py (pure: lock and process verdicts, whether to
cancel), stack.py (project and stack checks, the CLI), backend.py (backend kind, lock files, checkpoint sidecars),
processes.py (/proc), cluster.py (managedFields, Helm records), backup.py, command.py (the command).
"""
from .adopt import adopt_pending, never_read, pending_creates, provider_id
from .command import main, recover
from .stack import Cli, RecoverError

__all__ = ["Cli", "RecoverError", "adopt_pending", "main", "never_read", "pending_creates", "provider_id", "recover"]
