"""Issue 20 point 5: one budget shared by every stack over a cluster's GPU nodes (gpu-migration:sharedBudget).

The decisions are pure (plan/shared_budget.py); the claims' Lease, its optimistic concurrency, the gates that claim
and the release against the real API server (tests/envtest.py)."""
import pytest

from iks_gpu_migration.cli import budget as budget_cli
from iks_gpu_migration.config import ConfigError, parse
from iks_gpu_migration.kube import shared_budget
from iks_gpu_migration.kube.capacity_gate import _CapacityGateProvider
from iks_gpu_migration.kube.provider import CheckFailed
from iks_gpu_migration.kube.shared_budget import BudgetLease, _SharedBudgetReleaseProvider
from iks_gpu_migration.plan import shared_budget as decide
from harness import stack_config

A, B = "org/gpu/pool-a", "org/gpu/pool-b"
GPU = {"nvidia.com/gpu.present": "true"}


# --- decisions (pure) -------------------------------------------------------------------------------------------


def claim(index: int, *nodes: str) -> decide.Claim:
    return decide.Claim(index, nodes, "2026-12-04T00:00:00+00:00")


def test_a_batch_goes_out_when_the_other_stacks_leave_room():
    admitted = decide.admission({B: claim(1, "b1")}, 3, A, 2, ("a1", "a2"), "now", "fleet")
    assert admitted.open and admitted.claims == {B: claim(1, "b1"), A: decide.Claim(2, ("a1", "a2"), "now")}


def test_a_batch_waits_naming_the_stacks_that_hold_the_room_and_drops_its_own_previous_claim():
    claims = {B: claim(3, "b1", "b2"), A: claim(1, "a1", "a2")}
    held = decide.admission(claims, 3, A, 2, ("a3", "a4"), "now", "fleet")
    assert not held.open and held.claims == {B: claim(3, "b1", "b2")}  # batch 1 of A is done: its room goes
    assert held.state == ("shared budget 'fleet': 2 of 3 node(s) out by other stacks (org/gpu/pool-b: batch 3, 2 "
                          "node(s) since 2026-12-04T00:00:00+00:00), this batch needs 2")


def test_the_stacks_own_claim_never_counts_against_it_and_a_resumed_gate_keeps_its_time():
    mine = claim(2, "a1", "a2")
    again = decide.admission({A: mine}, 2, A, 2, ("a1", "a2"), "later", "fleet")
    assert again.open and again.claims == {A: mine}


def test_stacks_must_agree_on_the_limit_while_others_hold_claims():
    assert decide.check_limit(4, 6, {A: claim(1, "a1")}, A, "fleet") == 6  # only its own claim: the new value holds
    with pytest.raises(decide.SharedBudgetError) as e:
        decide.check_limit(4, 6, {B: claim(1, "b1")}, A, "fleet")
    assert "sharedBudget.maxUnavailable is 6, but the shared budget 'fleet' records 4" in str(e.value)
    assert "org/gpu/pool-b: batch 1" in str(e.value)


def test_unreadable_claims_are_an_error_never_an_empty_budget():
    with pytest.raises(decide.SharedBudgetError, match="unreadable"):
        decide.parse_claims('{"a": {"nodes": 3}}')
    assert decide.parse_claims(decide.dump_claims({A: claim(1, "a1")})) == {A: claim(1, "a1")}


def test_config_refuses_a_batch_larger_than_the_shared_budget():
    raw = {**stack_config("pilot"), "maxUnavailable": 3, "sharedBudget": {"name": "fleet", "maxUnavailable": 2}}
    raw["nodes"] = [{"name": f"10.0.0.{i}", "workerId": f"w{i}", "stage": "device-plugin"} for i in range(1, 5)]
    with pytest.raises(ConfigError) as e:
        parse(raw)
    assert "sharedBudget.maxUnavailable" in str(e.value) and "smaller than this stack's batches of 3" in str(e.value)
    with pytest.raises(ConfigError, match="not a DNS label"):
        parse({**raw, "sharedBudget": {"name": "Fleet_1", "maxUnavailable": 3}})
    assert parse({**raw, "sharedBudget": {"name": "fleet", "maxUnavailable": 3}}).shared_budget.namespace == \
        "gpu-migration"


# --- the Lease against the real API server ----------------------------------------------------------------------


def kube_api(kube):
    from kubernetes import config
    return config.new_client_from_config(config_file=kube.kubeconfig)


def settings(kube, holder: str, limit: int = 3) -> dict:
    return {"name": "fleet", "namespace": kube.ns("budget"), "max_unavailable": limit, "holder": holder}


def read(kube) -> decide.Claims:
    with kube_api(kube) as api:
        return BudgetLease(api, kube.ns("budget"), "fleet").read()[1]


def test_a_stack_that_read_before_another_wrote_is_refused_and_decides_again(kube, monkeypatch):
    """A reads the Lease with room for its batch; B claims that room before A writes: the API server refuses A's
    write (resourceVersion) and A, reading again, waits instead of overcommitting."""
    with kube_api(kube) as api:
        shared_budget.try_admit(api, settings(kube, B), 1, ["b0"], True)
        lease = BudgetLease(api, kube.ns("budget"), "fleet")
        real_read, raced = BudgetLease.read, []

        def read_then_b_claims(self):
            seen = real_read(self)
            if not raced:
                raced.append(True)
                b_lease, b_claims, _ = real_read(self)  # B's gate, in another process, writes in between
                lease._write(b_lease, B, {B: claim(1, "b0", "b1", "b2")}, 3)
            return seen

        monkeypatch.setattr(BudgetLease, "read", read_then_b_claims)
        writes = kube.record(monkeypatch)
        admitted = shared_budget.try_admit(api, settings(kube, A), 1, ["a1", "a2"], True)
    assert not admitted.open and "3 of 3 node(s) out by other stacks" in admitted.state
    assert [r[0] for r in writes].count("PUT") == 2  # B's write, A's refused one; A then had nothing to write
    assert read(kube) == {B: claim(1, "b0", "b1", "b2")}


def test_gates_of_two_stacks_share_the_budget_and_the_release_lets_the_other_in(kube):
    for i in range(1, 7):
        kube.add_node(kube.name(f"n{i}"), labels=GPU)
    n = [kube.name(f"n{i}") for i in range(1, 7)]

    def gate(holder, batch, timeout=5.0):
        props = {"kubeconfig": kube.kubeconfig, "index": 1, "batch": batch, "stages": dict.fromkeys(batch, "dra"),
                 "after": [], "selector": "nvidia.com/gpu.present=true", "min_available": 1, "soak_seconds": 0,
                 "timeout": timeout, "poll_interval": 0.05, "shared": settings(kube, holder)}
        return _CapacityGateProvider().create(props).outs

    assert gate(A, n[:2])["opened"].startswith("4 GPU nodes available")
    with pytest.raises(CheckFailed) as e:
        gate(B, n[2:4], timeout=0.3)  # 2 of 3 out by A, B's batch needs 2
    text = str(e.value)
    assert "2 of 3 node(s) out by other stacks (org/gpu/pool-a: batch 1, 2 node(s) since" in text
    assert "batch 1 was not started, none of its nodes was changed" in text
    assert "--name fleet --release <stack>" in text and read(kube).keys() == {A}
    release = {"kubeconfig": kube.kubeconfig, "shared": settings(kube, A), "plan": "p1", "after": n[:2]}
    _SharedBudgetReleaseProvider().create(release)
    assert gate(B, n[2:4])["opened"] and read(kube) == {B: decide.Claim(1, tuple(n[2:4]), read(kube)[B].since)}
    _SharedBudgetReleaseProvider().delete("id", {**release, "shared": settings(kube, B)})  # a destroyed stack
    assert read(kube) == {}


def test_a_missing_namespace_is_named(kube):
    with kube_api(kube) as api, pytest.raises(CheckFailed) as e:
        shared_budget.try_admit(api, {**settings(kube, A), "namespace": kube.name("absent")}, 1, ["a1"], True)
    assert f"namespace {kube.name('absent')!r} does not exist" in str(e.value)


def test_the_cli_lists_the_claims_and_drops_one_only_when_asked(kube, capsys, monkeypatch):
    with kube_api(kube) as api:
        shared_budget.try_admit(api, settings(kube, A), 2, ["a1", "a2"], True)
        shared_budget.try_admit(api, settings(kube, B), 1, ["b1"], True)
    args = ["--name", "fleet", "--namespace", kube.ns("budget"), "--kubeconfig", str(kube.kubeconfig)]
    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    assert budget_cli.main([*args, "--release", A]) == 1 and read(kube).keys() == {A, B}
    out = capsys.readouterr().out
    assert "shared budget 'fleet'" in out and "3 of 3 node(s) out" in out and f"{A}: batch 2, 2 node(s)" in out
    assert budget_cli.main([*args, "--release", "org/gpu/none", "--yes"]) == 1
    assert "holds no claim" in capsys.readouterr().err
    assert budget_cli.main([*args, "--release", A, "--yes"]) == 0 and read(kube).keys() == {B}


def test_an_identity_without_the_leases_role_is_stopped_up_front_and_at_the_lease(kube):
    """The preflight of every `up` names the missing Role rules in the budget's namespace; a request refused anyway
    (the Role removed mid-run) names the Role too."""
    from kubernetes import config

    from iks_gpu_migration.kube import permissions
    from iks_gpu_migration.kube.refusals import PermissionDenied
    from tests.test_permissions import role
    ns = kube.ns("budget")
    with config.new_client_from_config(kube.identity("no-leases", role("gpu-migration")["rules"])) as api:
        permissions.require(api)  # the ClusterRole alone is enough without a shared budget
        with pytest.raises(PermissionDenied) as stopped:
            permissions.require(api, ns)
        with pytest.raises(PermissionDenied) as refused:
            shared_budget.try_admit(api, settings(kube, A), 1, ["a1"], True)
    assert stopped.value.args[0].count("\n  - ") == 3
    assert f'- cannot update resource "leases" in API group "coordination.k8s.io" in the namespace "{ns}"' in \
        str(stopped.value)
    assert "the Role gpu-migration-shared-budget of the same file" in str(stopped.value)
    assert f"Lease {ns}/gpu-migration-budget-fleet (HTTP 403)" in str(refused.value)
    assert "cannot get resource \"leases\"" in str(refused.value)
    assert f"Role gpu-migration-shared-budget of iks_gpu_migration/rbac/gpu-migration.yaml, in namespace {ns}" in \
        str(refused.value)
