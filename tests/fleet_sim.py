"""A seeded simulation of a fleet migration, driving the program's own decisions (issue 36, point 6).

As Cluster API's rollout tests do (machinedeployment_rollout_rollingupdate_test.go: seeded random order, the budget
checked after every step, a log to read back), but across several stacks sharing one budget, with random replacement
times (some three times as long), GPU flavors that run out of stock in a pool and zone, and kills of a stack's `up`
that a later `up` resumes. What decides is the program's code, not a model of it: the plan (plan.make_plan), which
node starts when (plan/slots.py Slots: a slot per node), the gate and the re-check before each drain
(plan.gate_decision, plan.drain_decision), the shared budget's admission over the fleet as the cluster shows it
(plan/shared_budget.py, plan/fleet_count.py) and the canary per pool and zone (iks/pool_rules.py Canaries, its
non-blocking `turn`). What acts is simulated: IKS (a replace deletes the old worker; the new one joins after the
replacement time, or fails when its pool and zone is out of stock) and the engine (a node's steps run once Slots
lets it start; a failed node stops the nodes not yet started).

After every event the invariants hold or the run fails with its seed and its log: the fleet never has more GPU nodes
out than the shared budget, no stack more than its own nor more nodes in flight than its slots, no worker is replaced
twice, a stock-out costs a process one node per pool and zone before that pool and zone proved itself in it, and
every run ends converged or stopped with a failure named.
"""
import datetime
import heapq
import itertools
import random
from dataclasses import dataclass, field
from typing import Callable, Optional

from iks_gpu_migration import plan
from iks_gpu_migration.iks.pool_rules import Canaries
from iks_gpu_migration.iks.provider import ReplacementError
from iks_gpu_migration.plan import shared_budget as decide
from iks_gpu_migration.plan.fleet_count import Fleet, Member
from iks_gpu_migration.plan.slots import Slots, Start

GPU = {"ibm-cloud.kubernetes.io/gpu-enabled": "true"}
SELECTOR = "ibm-cloud.kubernetes.io/gpu-enabled=true"
EPOCH = datetime.datetime(2026, 12, 1, tzinfo=datetime.timezone.utc)
POLL = 15.0  # seconds between a waiting gate's or drain's readings (pollInterval's default)
WAIT_TIMEOUT = 3000.0  # a gate's or a drain re-check's wait (timeouts.capacityGate), then the stack stops


@dataclass
class Entry:
    """A configured GPU node: its worker's state as IKS and the cluster show it."""
    name: str
    stack: str
    pool: str
    zone: str
    stage: str = "device-plugin"
    # old, broken (NotReady before the run), cordoned, gone (replace requested), new (joined), failed (provision_failed)
    state: str = "old"
    requested: int = 0  # replaceWorker calls for this entry
    requested_by: int = -1  # the process (`up`) that requested it
    unproven: bool = False  # its pool and zone had not proved itself in that process when it was requested
    waiting_since: Optional[float] = None  # its drain's re-check has waited since

    def view(self) -> Optional[plan.NodeView]:
        labels = {**GPU, plan.gates.IKS_POOL_LABEL: self.pool}
        if self.state in ("old", "cordoned", "broken"):
            return plan.NodeView(self.name, labels, self.state == "cordoned", self.state != "broken")
        if self.state == "new":
            return plan.NodeView(f"{self.name}-new", labels, False, True, self.name)
        return None  # gone: deleted, its replacement not joined (or failed)

    @property
    def out(self) -> bool:
        return self.state != "old" and self.state != "new"


@dataclass
class Stack:
    name: str
    entries: list[Entry]
    max_unavailable: int
    every_batch: bool = False
    process: int = 0  # which `up` (a kill ends one, a resume starts the next)
    canaries: Canaries = field(default_factory=Canaries)
    gated: set = field(default_factory=set)  # nodes whose gate opened (recorded in state)
    gate_since: dict = field(default_factory=dict)  # node -> its gate has waited since
    admitted: dict = field(default_factory=dict)  # node -> the node and its peers, as its gate admitted them
    running: dict = field(default_factory=dict)  # entry name -> its step: gate, drain, turn, wait
    done: set = field(default_factory=set)
    failed: dict = field(default_factory=dict)  # entry name -> why
    alive: bool = True

    def __post_init__(self) -> None:
        self.plan = plan.make_plan(self.entries, self.max_unavailable)
        self.by_name = {e.name: e for e in self.entries}
        self.new_process()

    def new_process(self) -> None:
        """A new `up`: the program's slots start over (nodes already done end at once: their steps are recorded);
        nodes an earlier `up` left out (cordoned, or their worker being replaced) first, as the inventory's
        `resume_first` orders them (components/slots.py resume_order)."""
        held = frozenset(e.name for e in self.entries if e.state in ("cordoned", "gone", "failed", "broken"))
        self.slots = Slots([t.node for t in self.plan.batches], self.plan.slots, resumed=held)

    @property
    def holder(self) -> str:
        return f"org/gpu/{self.name}#sim"

    @property
    def finished(self) -> bool:
        return self.converged or (bool(self.failed) and not self.running)

    @property
    def converged(self) -> bool:
        return len(self.done) == len(self.plan.batches)


class Simulation:
    def __init__(self, seed: int, stacks: int = 2, per_stack: int = 8, zones: int = 2, limit: int = 4,
                 kills: int = 1, stock_outs: int = 1, ttl: float = 600, every_batch: bool = False) -> None:
        self.rng = random.Random(seed)
        self.seed, self.limit, self.ttl = seed, limit, ttl
        self.now, self.events, self.seq = 0.0, [], itertools.count()
        self.log: list[str] = []
        self._views: Optional[tuple[tuple[str, ...], list[plan.NodeView]]] = None
        self.claims: decide.Claims = {}
        self.stock: dict[tuple[str, str], int] = {}
        self.lost: dict[tuple[int, str, str, str], int] = {}  # (process, stack, pool, zone) -> workers lost
        self.stacks = [self._stack(i, per_stack, zones, every_batch) for i in range(stacks)]
        pools = sorted({(e.pool, e.zone) for s in self.stacks for e in s.entries})
        for key in self.rng.sample(pools, min(stock_outs, len(pools))):
            self.stock[key] = self.rng.randint(0, 3)  # this many more workers, then provision_failed
        for s in self.stacks:
            self.at(self.rng.uniform(0, 30), lambda s=s: self.begin(s))
        for _ in range(kills):
            self.at(self.rng.uniform(50, 1500), self.kill)

    def _stack(self, i: int, n: int, zones: int, every_batch: bool) -> Stack:
        name = f"pool-{chr(97 + i)}"
        entries = [Entry(f"{name}-{j}", name, f"gpu-{chr(97 + i)}", f"z{self.rng.randrange(zones)}") for j in range(n)]
        return Stack(name, entries, self.rng.randint(1, min(self.limit, 4)), every_batch)

    # The event loop ------------------------------------------------------------------------------------------------
    def at(self, delay: float, action: Callable[[], None]) -> None:
        heapq.heappush(self.events, (self.now + delay, next(self.seq), action))

    def say(self, text: str) -> None:
        self.log.append(f"{self.now:8.1f} {text}")

    def stamp(self) -> str:
        return (EPOCH + datetime.timedelta(seconds=self.now)).isoformat()

    def run(self, horizon: float = 200_000) -> None:
        while self.events:
            self.now, _, action = heapq.heappop(self.events)
            if self.now > horizon:
                raise AssertionError(self.trace("did not end within the horizon"))
            action()
            self.heartbeat()
            self.check()
        unfinished = [s.name for s in self.stacks if not s.finished or s.running]
        if unfinished:
            raise AssertionError(self.trace(f"no event left, yet {unfinished} neither converged nor stopped"))

    def heartbeat(self) -> None:
        """A running `up` renews its claim every third of the ttl (kube/shared_budget.py Heartbeats)."""
        for s in self.stacks:
            claim = self.claims.get(s.holder)
            if s.alive and not s.finished and claim and decide.age(claim.heartbeat, self.stamp()) > self.ttl / 3:
                self.claims = decide.renewed(self.claims, s.holder, self.stamp())

    def trace(self, what: str) -> str:
        return f"seed {self.seed}: {what}\n" + "\n".join(self.log[-80:])

    # Invariants ----------------------------------------------------------------------------------------------------
    def check(self) -> None:
        entries = [e for s in self.stacks for e in s.entries]
        out = [e.name for e in entries if e.out]
        if len(out) > self.limit:
            raise AssertionError(self.trace(f"{len(out)} GPU nodes out, shared budget {self.limit}: {out}"))
        for s in self.stacks:
            mine = [e.name for e in s.entries if e.out and e.state != "failed"]
            if len(mine) > s.max_unavailable:
                raise AssertionError(self.trace(f"{s.name}: {mine} out, its maxUnavailable {s.max_unavailable}"))
            if len(s.running) > s.plan.slots:
                raise AssertionError(self.trace(f"{s.name}: {sorted(s.running)} in flight, {s.plan.slots} slots"))
        twice = [e.name for e in entries if e.requested > 1]
        if twice:
            raise AssertionError(self.trace(f"replaced twice: {twice}"))
        for (process, stack, pool, zone), lost in self.lost.items():
            if lost > 1:
                raise AssertionError(self.trace(f"{stack} (process {process}) lost {lost} workers in {pool}/{zone} "
                                                f"before the pool and zone proved itself"))

    # A stack's `up` ------------------------------------------------------------------------------------------------
    def views(self) -> list[plan.NodeView]:
        """Every Node as the cluster shows it now (read again only after an entry's state changed)."""
        key = tuple(e.state for s in self.stacks for e in s.entries)
        if self._views is None or self._views[0] != key:
            self._views = (key, [v for s in self.stacks for e in s.entries if (v := e.view()) is not None])
        return self._views[1]

    def fleet(self) -> Fleet:
        members = {s.holder: Member((s.entries[0].pool,), len(s.entries)) for s in self.stacks}
        return Fleet(tuple(self.views()), SELECTOR, members)

    def admit(self, s: Stack, index: int, batch: tuple[str, ...], fits_locally: bool = True,
              merge: bool = False) -> bool:
        """The shared budget, as kube/shared_budget.py try_admit decides and writes it."""
        admission = decide.admission(self.claims, self.limit, s.holder, index, batch, self.stamp(), "fleet",
                                     self.fleet(), self.ttl, merge=merge)
        if admission.expired:
            self.say(f"{s.name}: dropped the expired claims of {sorted(admission.expired)}")
        self.claims = admission.claims if fits_locally else \
            {h: c for h, c in admission.claims.items() if h != s.holder}
        return admission.open and fits_locally

    def begin(self, s: Stack) -> None:
        """A process starts: the first slots' nodes go (components/slots.py SlotTurns.watch). A resumed `up` retries
        what failed, as the next `pulumi up` does."""
        if s.alive:
            self.start(s, s.slots.starts(), s.process)

    def start(self, s: Stack, starts: list[Start], process: int) -> None:
        for start in starts:
            self.say(f"{s.name}: {start.node} gets a slot beside {list(start.peers)}")
            s.running[start.node] = "gate"
            self.gate(s, start, process)

    def gate(self, s: Stack, start: Start, process: int) -> None:
        """The node's CapacityGate (kube/capacity_gate.py), unless recorded by an earlier process."""
        if not s.alive or process != s.process:
            return
        # Peers done since the slot came count back (kube/finished.py): the node's last step recorded them.
        node, members = start.node, (start.node, *(p for p in start.peers if p not in s.done))
        if node not in s.gated:
            turn = s.plan.batch_of(node)
            local = plan.gate_decision(self.views(), members, SELECTOR, s.plan.budget.min_available)
            if not self.admit(s, turn.index, members, local.open):
                since = s.gate_since.setdefault(node, self.now)
                if self.now - since > WAIT_TIMEOUT:
                    return self.node_done(s, s.by_name[node], process, f"{node}'s capacity gate timed out")
                return self.at(POLL, lambda: self.gate(s, start, process))
            s.gated.add(node)
            self.say(f"{s.name}: {node} starts")
        s.admitted[node] = members
        self.step(s, s.by_name[node], process)

    def step(self, s: Stack, e: Entry, process: int) -> None:
        """One node's replacement, resumable: its next step from the state IKS and the cluster show."""
        if not s.alive or process != s.process:
            return
        s.running[e.name] = e.state
        if e.state == "new":
            return self.at(self.rng.uniform(1, 10), lambda: self.node_done(s, e, process, None))
        if e.state == "failed":
            return self.node_done(s, e, process, "provision_failed")
        if e.state == "gone":  # requested by an earlier process: followed, it is this process's canary if none is
            s.canaries.adopt("sim", f"sim/{e.name}", self.worker(e))
            return
        turn = s.plan.batch_of(e.name)
        if not self.drain_ok(s, e, turn):
            e.waiting_since = self.now if e.waiting_since is None else e.waiting_since
            if self.now - e.waiting_since > WAIT_TIMEOUT:
                e.state = "old" if e.state == "cordoned" else e.state  # never requested: uncordoned again
                return self.node_done(s, e, process, "the capacity re-check before its drain timed out")
            return self.at(POLL, lambda: self.step(s, e, process))
        e.waiting_since = None
        if e.state in ("old", "broken"):
            e.state = "cordoned"
            self.say(f"{s.name}: {e.name} drained")
        try:
            waits = s.canaries.turn("sim", self.worker(e), turn.round if s.every_batch else None)
        except ReplacementError as error:
            e.state = "old"  # never requested: uncordoned again
            return self.node_done(s, e, process, str(error)[:80])
        if waits is not None:
            return self.at(POLL, lambda: self.step(s, e, process))
        self.request(s, e, process)

    def drain_ok(self, s: Stack, e: Entry, turn: plan.Batch) -> bool:
        """kube/drain_budget.py hold_for_budget: the stack's budget, then the shared one (the claim keeps the stack's
        other nodes: merge)."""
        admitted = s.admitted.get(e.name, turn.nodes)
        members = (admitted[0], *(p for p in admitted[1:] if p not in s.done))  # kube/finished.py
        decision = plan.drain_decision(self.views(), e.name, members, SELECTOR, s.plan.budget.min_available)
        return decision.open and self.admit(s, turn.index, members, merge=True)

    @staticmethod
    def worker(e: Entry) -> dict:
        return {"id": e.name, "poolID": e.pool, "poolName": e.pool, "location": e.zone}

    def request(self, s: Stack, e: Entry, process: int) -> None:
        group = s.canaries._groups.get(Canaries.group("sim", self.worker(e)))
        proof = s.plan.batch_of(e.name).round if s.every_batch else None
        e.unproven = not (group and {None, proof} & group.proven)
        e.state, e.requested, e.requested_by = "gone", e.requested + 1, process
        self.say(f"{s.name}: {e.name} replaceWorker")
        base = self.rng.uniform(60, 180)
        took = base * (3 if self.rng.random() < 0.1 else 1)
        key = (e.pool, e.zone)
        if key in self.stock:  # a flavor with limited stock in this pool and zone
            self.stock[key] -= 1
            if self.stock[key] < 0:  # out of stock: provision_failed, after a while in provisioning
                return self.at(took / 2, lambda: self.provisioned(s, e, False))
        self.at(took, lambda: self.provisioned(s, e, True))

    def provisioned(self, s: Stack, e: Entry, ok: bool) -> None:
        e.state = "new" if ok else "failed"
        self.say(f"{s.name}: {e.name} {'joined' if ok else 'provision_failed'}")
        if not ok and e.unproven:  # lost before its pool and zone proved itself in the `up` that requested it
            key = (e.requested_by, s.name, e.pool, e.zone)
            self.lost[key] = self.lost.get(key, 0) + 1
        if s.alive and e.name in s.running:
            self.step(s, e, s.process)

    def node_done(self, s: Stack, e: Entry, process: int, error: Optional[str]) -> None:
        if not s.alive or process != s.process:
            return
        s.running.pop(e.name, None)
        s.canaries.end("sim", f"sim/{e.name}", None if error is None else RuntimeError(error),
                       requested=e.requested > 0 or e.state == "failed", worker=self.worker(e),
                       every_batch=s.every_batch, batch=s.plan.batch_of(e.name).round)
        if error is None:
            s.done.add(e.name)
            self.start(s, s.slots.finish(e.name), process)
        else:
            s.failed[e.name] = error
            self.say(f"{s.name}: {e.name} failed: {error}")
            self.start(s, s.slots.fail(e.name, error), process)
        if s.running:
            return
        if s.failed:
            self.say(f"{s.name}: stopped, the nodes not yet started were not started ({sorted(s.failed)})")
        elif s.converged:
            self.claims = decide.released(self.claims, s.holder)  # shared-budget-release
            self.say(f"{s.name}: converged")

    # Kills ---------------------------------------------------------------------------------------------------------
    def kill(self) -> None:
        live = [s for s in self.stacks if s.alive and not s.finished]
        if not live:
            return
        s = self.rng.choice(live)
        s.alive, s.running = False, {}
        self.say(f"{s.name}: killed")
        self.at(self.rng.uniform(10, 900), lambda: self.resume(s))

    def resume(self, s: Stack) -> None:
        s.alive, s.process, s.canaries = True, s.process + 1, Canaries()
        s.gate_since, s.failed = {}, {}
        s.new_process()
        self.say(f"{s.name}: resumed")
        self.begin(s)
