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
from iks_gpu_migration.plan import NodeView
from iks_gpu_migration.plan import shared_budget as decide
from iks_gpu_migration.plan.fleet_count import Fleet, Member
from harness import stack_config

A, B, C = "org/gpu/pool-a", "org/gpu/pool-b", "org/gpu/pool-c"
NOW = "2026-12-04T01:00:00+00:00"
GPU = {"nvidia.com/gpu.present": "true"}


# --- decisions (pure) -------------------------------------------------------------------------------------------


def claim(index: int, *nodes: str) -> decide.Claim:
    return decide.Claim(index, nodes, "2026-12-04T00:00:00+00:00")


def test_a_batch_goes_out_when_the_other_stacks_leave_room():
    admitted = decide.admission({B: claim(1, "b1")}, 3, A, 2, ("a1", "a2"), NOW, "fleet")
    assert admitted.open and admitted.claims == {B: claim(1, "b1"), A: decide.Claim(2, ("a1", "a2"), NOW, NOW)}


def test_a_batch_waits_naming_the_stacks_that_hold_the_room_and_drops_its_own_previous_claim():
    claims = {B: claim(3, "b1", "b2"), A: claim(1, "a1", "a2")}
    held = decide.admission(claims, 3, A, 2, ("a3", "a4"), NOW, "fleet")
    assert not held.open and held.claims == {B: claim(3, "b1", "b2")}  # batch 1 of A is done: its room goes
    assert held.state == ("shared budget 'fleet': 4 of 3 node(s) out with this batch of 2; claims of other stacks: "
                          "org/gpu/pool-b: batch 3, 2 node(s) since 2026-12-04T00:00:00+00:00")


def test_the_stacks_own_claim_never_counts_against_it_and_a_resumed_gate_keeps_its_time():
    mine = claim(2, "a1", "a2")
    again = decide.admission({A: mine, "organization/gpu/pool-a": claim(1, "a0")}, 2, A, 2, ("a1", "a2"), NOW,
                             "fleet", aliases=frozenset({"organization/gpu/pool-a"}))
    assert again.open and again.claims == {A: decide.Claim(2, ("a1", "a2"), mine.since, NOW)}  # renewed, same since


def view(name: str, pool: str, ready: bool = True, cordoned: bool = False, entry: str = "") -> NodeView:
    return NodeView(name, {**GPU, "ibm-cloud.kubernetes.io/worker-pool-name": pool}, cordoned, ready, entry)


def fleet(views, **members) -> Fleet:
    return Fleet(tuple(views), "nvidia.com/gpu.present=true",
                 {f"org/gpu/{k}": Member(tuple(p.split("+")), n) for k, (p, n) in members.items()})


def test_the_fleets_real_unavailability_counts_whoever_caused_it():
    """Issue 36, point 5: out is what the cluster shows, per stack its configured nodes minus its pools' available
    GPU nodes, so a node cordoned, NotReady, gone or replaced and joining counts, whoever did it; plus what other
    stacks claimed and not yet took out, plus unavailable GPU nodes of pools no stack holds."""
    views = [view("a1", "gpu-a"), view("a2", "gpu-a"), view("a3", "gpu-a"),
             view("b1", "gpu-b", cordoned=True),  # drained by stack b (alive or dead: whichever)
             # b2's worker was deleted by its replacement: no node at all
             view("b3-new", "gpu-b", ready=False),  # b3's replacement joining under a new name
             view("b4", "gpu-b"), view("x1", "spare", ready=False)]  # a pool no stack holds
    f = fleet(views, **{"pool-a": ("gpu-a", 3), "pool-b": ("gpu-b", 4)})
    held = decide.admission({B: claim(1, "b1", "b2", "b3", "b4")}, 6, A, 1, ("a1", "a2"), NOW, "fleet", f)
    # a1, a2 (the batch) + b1, b2, b3 (out) + b4 (claimed, not out yet) + x1 = 7 > 6
    assert not held.open, held.state
    assert held.state.startswith("shared budget 'fleet': 7 of 6 node(s) out with this batch of 2 (org/gpu/pool-a: "
                                 "2 of its 3 node(s); org/gpu/pool-b: 3 of its 4 node(s); claimed by other stacks, "
                                 "not out yet: b4; unavailable in pools of no stack: x1)"), held.state
    assert decide.admission({B: claim(1, "b1", "b2", "b3", "b4")}, 7, A, 1, ("a1", "a2"), NOW, "fleet", f).open
    # A claim that expired no longer counts what it did not take out (b4), but what is out still counts.
    expired = decide.admission({B: claim(1, "b1", "b2", "b3", "b4")}, 6, A, 1, ("a1", "a2"), NOW, "fleet", f,
                               ttl=60)
    assert expired.open and expired.expired.keys() == {B}, expired.state
    # 800 of 900 GPU nodes of the other stacks NotReady: a batch of 10 under a shared limit of 100 waits.
    big = [view(f"n{i}", "gpu-b", ready=i >= 800) for i in range(900)] + [view(f"a{i}", "gpu-a") for i in range(100)]
    f = fleet(big, **{"pool-a": ("gpu-a", 100), "pool-b": ("gpu-b", 900)})
    assert not decide.admission({}, 100, A, 1, tuple(f"a{i}" for i in range(10)), NOW, "fleet", f).open


def test_a_claim_not_renewed_within_its_ttl_no_longer_counts_and_is_dropped():
    stale = decide.Claim(1, ("b1", "b2", "b3"), "2026-12-04T00:00:00+00:00", "2026-12-04T00:05:00+00:00")
    fresh = decide.Claim(1, ("c1",), "2026-12-04T00:00:00+00:00", "2026-12-04T00:09:30+00:00")
    now = "2026-12-04T00:10:00+00:00"
    admitted = decide.admission({B: stale, C: fresh}, 3, A, 1, ("a1", "a2"), now, "fleet", ttl=120)
    assert admitted.open and admitted.expired == {B: stale}
    assert set(admitted.claims) == {A, C}  # the expired claim is dropped with this write
    held = decide.admission({B: stale, C: fresh}, 3, A, 1, ("a1", "a2"), now, "fleet", ttl=600)
    assert not held.open and not held.expired  # within its ttl it still holds its room
    assert decide.renewed({B: stale}, B, now)[B].renewed == now and decide.renewed({B: stale}, A, now) == {B: stale}


def test_members_round_trip_and_replace_a_stacks_older_names():
    members = {B: Member(("gpu-b",), 4), "organization/gpu/pool-a": Member(("gpu-a",), 2)}
    assert decide.parse_members(decide.dump_members(members)) == members
    mine = decide.with_member(members, A, Member(("gpu-a",), 3), frozenset({"organization/gpu/pool-a"}))
    assert mine == {B: Member(("gpu-b",), 4), A: Member(("gpu-a",), 3)}
    with pytest.raises(decide.SharedBudgetError, match="stacks are unreadable"):
        decide.parse_members('{"a": {"pools": 3}}')


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
        real_read, raced = BudgetLease.read_all, []

        def read_then_b_claims(self):
            seen = real_read(self)
            if not raced:
                raced.append(True)
                b_lease, b_claims, _, _ = real_read(self)  # B's gate, in another process, writes in between
                lease._write(b_lease, B, {B: claim(1, "b0", "b1", "b2")}, 3)
            return seen

        monkeypatch.setattr(BudgetLease, "read_all", read_then_b_claims)
        writes = kube.record(monkeypatch)
        admitted = shared_budget.try_admit(api, settings(kube, A), 1, ["a1", "a2"], True)
    assert not admitted.open and "5 of 3 node(s) out with this batch of 2" in admitted.state
    assert [r[0] for r in writes].count("PUT") == 2  # B's write, A's refused one; A then had nothing to write
    assert read(kube) == {B: claim(1, "b0", "b1", "b2")}


def test_gates_of_two_stacks_share_the_budget_and_the_release_lets_the_other_in(kube):
    for i in range(1, 7):
        kube.add_node(kube.name(f"n{i}"), labels=GPU)
    n = [kube.name(f"n{i}") for i in range(1, 7)]

    def gate(holder, batch, timeout=5.0):  # batch[0]'s turn, the rest of `batch` in flight beside it
        props = {"kubeconfig": kube.kubeconfig, "index": 1, "batch": batch[:1], "stages": {batch[0]: "dra"},
                 "slot": {"peers": batch[1:], "freed_by": ""},
                 "after": [], "selector": "nvidia.com/gpu.present=true", "min_available": 1, "soak_seconds": 0,
                 "timeout": timeout, "poll_interval": 0.05, "shared": settings(kube, holder)}
        return _CapacityGateProvider().create(props).outs

    assert gate(A, n[:2])["opened"].startswith("4 GPU nodes available")
    with pytest.raises(CheckFailed) as e:
        gate(B, n[2:4], timeout=0.3)  # 2 of 3 out by A, B's batch needs 2
    text = str(e.value)
    assert "shared budget 'fleet': 4 of 3 node(s) out with this batch of 2 (claimed by other stacks, not out yet: " \
        f"{n[0]}, {n[1]}); claims of other stacks: org/gpu/pool-a: batch 1, 2 node(s) since" in text, text
    assert f"node {n[2]} was not started, nothing of it was changed" in text
    assert "--name fleet --release <stack>" in text and read(kube).keys() == {A}
    release = {"kubeconfig": kube.kubeconfig, "shared": settings(kube, A), "plan": "p1", "after": n[:2]}
    _SharedBudgetReleaseProvider().create(release)
    assert gate(B, n[2:4])["opened"] and read(kube) == {B: decide.Claim(1, tuple(n[2:4]), read(kube)[B].since,
                                                                      read(kube)[B].renewed)}
    _SharedBudgetReleaseProvider().delete("id", {**release, "shared": settings(kube, B)})  # a destroyed stack
    assert read(kube) == {}


def test_a_drain_keeps_the_stacks_other_nodes_in_its_claim():
    """With slots a stack's claim is the nodes it has in flight: a gate writes its node and its peers; a drain
    re-checking (merge) adds its nodes to the claim instead of dropping the nodes that started after its gate."""
    now = "2026-12-08T10:00:00+00:00"
    claims = {A: decide.Claim(3, ("a1", "a2", "a3"), now, now)}
    drain = decide.admission(claims, 5, A, 1, ("a1",), now, "fleet", merge=True)
    assert drain.open and drain.claims[A].nodes == ("a1", "a2", "a3") and drain.claims[A].index == 3
    resumed = decide.admission({}, 5, A, 1, ("a1", "a0"), now, "fleet", merge=True)  # its claim was dropped
    assert resumed.claims[A].nodes == ("a1", "a0")
    gate = decide.admission(claims, 5, A, 4, ("a4", "a2", "a3"), now, "fleet")  # a1 done: it leaves the claim
    assert gate.claims[A].nodes == ("a4", "a2", "a3")


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
    assert "shared budget 'fleet'" in out and "3 of 3 node(s) claimed" in out and f"{A}: batch 2, 2 node(s)" in out
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


def drain_settings(kube, holder: str, batch: list[str], limit: int = 3, **shared) -> dict:
    return {"kubeconfig": str(kube.kubeconfig),
            "budget": {"index": 1, "batch": batch, "selector": "nvidia.com/gpu.present=true", "min_available": 1,
                       "timeout": 0.5, "poll_interval": 0.05,
                       "shared": {**settings(kube, holder, limit), "pools": [kube.name("pool")], "nodes": 4, **shared}}}


def test_a_drain_claims_its_batch_again_after_the_claim_was_dropped_and_counts_the_fleet_as_it_is(kube):
    """A stack resumed after `cli.budget --release` (or whose claim expired) claims its batch again before its next
    drain; and a drain waits, naming them, when GPU nodes of the fleet went down since its gate, whoever's."""
    from iks_gpu_migration.kube.drain_budget import BudgetExceeded, hold_for_budget
    n = [kube.name(f"n{i}") for i in range(1, 7)]
    for name in n[:4]:  # this stack's pool: 4 nodes
        kube.add_node(name, labels={**GPU, "ibm-cloud.kubernetes.io/worker-pool-name": kube.name("pool")})
    for name in n[4:]:  # another stack's
        kube.add_node(name, labels={**GPU, "ibm-cloud.kubernetes.io/worker-pool-name": kube.name("other")})
    hold_for_budget(n[0], drain_settings(kube, A, n[:2]))
    assert read(kube)[A].nodes == tuple(n[:2])  # no claim before: the drain took it
    with kube_api(kube) as api:
        shared_budget.release(api, settings(kube, A))
    hold_for_budget(n[1], drain_settings(kube, A, n[:2]))
    assert read(kube)[A].nodes == tuple(n[:2])  # dropped by hand: claimed again before the next drain
    kube.cordon(n[4])
    kube.cordon(n[5])  # two GPU nodes of another stack (or nobody's) go down: 2 + the batch's 2 > 3
    with pytest.raises(BudgetExceeded) as e:
        hold_for_budget(n[1], drain_settings(kube, A, n[:2]))
    assert "4 of 3 node(s) out with this batch of 2" in str(e.value)
    assert f"unavailable in pools of no stack: {n[4]}, {n[5]}" in str(e.value)
    assert "--release <stack>" in str(e.value)


def test_an_expired_claim_warns_naming_its_stack_and_a_live_one_is_renewed(kube, monkeypatch):
    from iks_gpu_migration.kube import shared_budget as module
    warnings: list[str] = []
    kept: list[tuple[str, str]] = []
    monkeypatch.setattr(module.pulumi.log, "warn", lambda text, *a, **k: warnings.append(text))
    monkeypatch.setattr(module.HEARTBEATS, "keep", lambda shared, kubeconfig: kept.append((shared["holder"],
                                                                                          kubeconfig)))
    shared = {**settings(kube, A), "claim_ttl": 30}
    with kube_api(kube) as api:
        lease = BudgetLease(api, kube.ns("budget"), "fleet")
        old = decide.Claim(1, ("b1", "b2", "b3"), "2026-12-01T00:00:00+00:00")
        lease.change(B, lambda claims, limit: (None, {B: old}, 3))
        admitted = shared_budget.try_admit(api, shared, 1, ["a1"], True, kubeconfig=str(kube.kubeconfig))
    assert admitted.open and admitted.expired == {B: old} and read(kube).keys() == {A}
    assert len(warnings) == 1 and "the claim of stack org/gpu/pool-b" in warnings[0] and "expired after 30s" in \
        warnings[0]
    assert kept == [(A, str(kube.kubeconfig))]  # the claim taken is kept alive by this process
    assert not shared_budget.renew({**settings(kube, C), "claim_ttl": 30}, str(kube.kubeconfig))  # holds none
    assert read(kube).keys() == {A}


def test_the_heartbeat_renews_a_claim_until_it_is_released(kube):
    import time
    shared = {**settings(kube, A), "claim_ttl": 0.3}  # renewed every 0.1 s
    with kube_api(kube) as api:
        lease = BudgetLease(api, kube.ns("budget"), "fleet")
        lease.change(A, lambda claims, limit: (None, {A: decide.Claim(1, ("a1",), "2026-12-01T00:00:00+00:00")}, 3))
        beats = shared_budget.Heartbeats()
        beats.keep(shared, str(kube.kubeconfig))
        beats.keep(shared, str(kube.kubeconfig))  # one heartbeat per claim, however often it is claimed
        deadline = time.monotonic() + 10
        while read(kube)[A].renewed == "" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert read(kube)[A].renewed > "2026-12-01", read(kube)
        assert len(beats._running) == 1
        shared_budget.release(api, shared)
        while beats._running and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not beats._running  # no claim left: the heartbeat ended (it never writes one back)
    assert read(kube) == {}


def test_a_stack_of_every_pool_takes_the_pools_no_other_stack_names_and_always_counts_its_batch():
    """A stack without workerPools (a member of every pool) must not count the other stacks' available nodes as its
    own, which would hide its batch: it takes the pools nobody names, and its batch counts as out in any case."""
    views = [view(f"a{i}", "gpu-a") for i in range(10)] + [view(f"b{i}", "gpu-b") for i in range(90)]
    f = Fleet(tuple(views), "nvidia.com/gpu.present=true",
              {A: Member((), 10), B: Member(("gpu-b",), 90)})
    held = decide.admission({}, 2, A, 1, ("a0", "a1", "a2"), NOW, "fleet", f)
    assert not held.open and held.state.startswith("shared budget 'fleet': 3 of 2 node(s) out"), held.state
    # Even when its member's pools would show enough available nodes, the batch counts.
    extra = views + [view(f"spare{i}", "spare") for i in range(5)]
    f = Fleet(tuple(extra), "nvidia.com/gpu.present=true", {A: Member((), 10), B: Member(("gpu-b",), 90)})
    assert not decide.admission({}, 2, A, 1, ("a0", "a1", "a2"), NOW, "fleet", f).open
