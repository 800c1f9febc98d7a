"""Who holds a shared budget (gpu-migration:sharedBudget), and dropping a stopped stack's claim by hand.

    python -m iks_gpu_migration.cli.budget --name gpu-fleet [--namespace gpu-migration] [--kubeconfig PATH]
    python -m iks_gpu_migration.cli.budget --name gpu-fleet --release org/project/stack [--yes]

A claim is dropped by its stack's next `up` (when the batch it has out is done) or `pulumi destroy`, and expires by
itself when its stack's `up` stopped renewing it (sharedBudget.claimTtl). By hand only when that stack's `up` is not
running: its nodes that are still out count anyway (every unavailable GPU node does). Every failure is one line on
stderr; exit code 1.
"""
import argparse
import sys
from typing import Optional

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from ..config.model import NAMESPACE
from ..kube.clients import new_client
from ..kube.provider import CheckFailed, _short
from ..kube.shared_budget import BudgetLease, release
from ..plan import shared_budget as decide


def show(lease: BudgetLease) -> str:
    found, claims, limit, members = lease.read_all()
    where = f"Lease {lease.namespace}/{lease.lease_name}"
    if found is None:
        return f"shared budget {lease.name!r}: no claims ({where} does not exist yet)"
    lines = [f"shared budget {lease.name!r} ({where}): {decide.held(claims)} of {limit} node(s) claimed"]
    for holder, claim in sorted(claims.items()):
        lines.append(f"  {claim.describe(holder)}, last renewed {claim.heartbeat}: {', '.join(claim.nodes)}")
    for holder, member in sorted(members.items()):
        pools = ", ".join(member.pools) or "every pool"
        lines.append(f"  stack {holder}: {member.nodes} GPU node(s) in {pools}")
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m iks_gpu_migration.cli.budget", description=__doc__.split("\n")[0])
    parser.add_argument("--name", required=True, help="gpu-migration:sharedBudget.name")
    parser.add_argument("--namespace", default=NAMESPACE, help="gpu-migration:sharedBudget.namespace")
    parser.add_argument("--kubeconfig", help="default: KUBECONFIG / ~/.kube/config")
    parser.add_argument("--release", metavar="STACK", help="drop this stack's claim (org/project/stack, as listed)")
    parser.add_argument("--yes", action="store_true", help="do not ask before dropping the claim")
    args = parser.parse_args(argv)
    try:
        with new_client(args.kubeconfig) as api:
            lease = BudgetLease(api, args.namespace, args.name)
            print(show(lease))
            if args.release:
                return _release(api, lease, args)
    except (ApiException, CheckFailed, decide.SharedBudgetError, config.ConfigException) as e:
        print(f"error: {_short(e) if isinstance(e, ApiException) else e}", file=sys.stderr)
        return 1
    except HTTPError as e:  # no answer (every request is bounded: kube/clients.py), or none in time
        print(f"error: no answer from the API server: {getattr(e, 'reason', None) or e}", file=sys.stderr)
        return 1
    return 0


def _release(api: client.ApiClient, lease: BudgetLease, args: argparse.Namespace) -> int:
    _, claims, limit = lease.read()
    if args.release not in claims:
        held = ", ".join(sorted(claims)) or "none"
        print(f"error: stack {args.release!r} holds no claim in shared budget {args.name!r} (holders: {held})",
              file=sys.stderr)
        return 1
    claim = claims[args.release]
    if not args.yes:
        answer = input(f"drop {claim.describe(args.release)} ({', '.join(claim.nodes)})? Only if that stack's `up` is "
                       f"not running and these nodes are back in service [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing changed")
            return 1
    release(api, {"name": args.name, "namespace": args.namespace, "holder": args.release,
                  "max_unavailable": limit or 1})
    print(f"dropped the claim of {args.release}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
