"""A capacity budget shared by every stack that migrates GPU nodes of one cluster (gpu-migration:sharedBudget).

Each stack's gates keep their own budget (gates.py); on top, the GPU nodes out across the whole fleet never exceed
the shared `maxUnavailable`. What is out is counted as it really is, not only as claimed: every GPU node of the cluster
that is unavailable now (NotReady, cordoned: whichever stack, or nobody, made it so), together with the nodes other
stacks claimed and have not taken out yet. So a stack's batch does not go out while the rest of the fleet is down,
and a stack that died with nodes drained holds them out by their state, not by its claim.

The claims live in one Lease of the cluster (kube/shared_budget.py), one entry per stack: the batch it has out. A gate
admits its batch only if the fleet's out nodes plus the batch fit, and replaces its own stack's previous claim (that
batch is done) in the same write. A running stack renews its claim (a heartbeat); a claim not renewed within the
budget's `claimTtl` is expired: it no longer counts, and the next write drops it, naming the stack (as a Lease holder
that stops renewing loses it: client-go tools/leaderelection, leaseDurationSeconds). Pure: the claims and the
unavailable nodes in, the decision and the claims to write out; the Lease's resourceVersion makes the write atomic
(optimistic concurrency, as client-go's leaderelection updates its Lease).
"""
import datetime
import json
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from .fleet_count import Fleet, Member, Members, fleet_out

SHOWN = 5  # claims of other stacks named in a decision; the rest are counted


class SharedBudgetError(ValueError):
    """The shared budget's recorded limit and this stack's disagree while other stacks hold claims."""


@dataclass(frozen=True)
class Claim:
    """A stack's nodes out: its batch `index` and the batch's configured node names, since `since` (ISO time), last
    renewed at `renewed` (ISO time; a claim written before heartbeats were kept is as old as `since`)."""
    index: int
    nodes: tuple[str, ...]
    since: str
    renewed: str = ""

    @property
    def heartbeat(self) -> str:
        return self.renewed or self.since

    def describe(self, holder: str) -> str:
        return f"{holder}: batch {self.index}, {len(self.nodes)} node(s) since {self.since}"


def age(stamp: str, now: str) -> float:
    """Seconds from `stamp` to `now` (ISO times); an unreadable stamp is infinitely old (it can't hold room)."""
    try:
        return (datetime.datetime.fromisoformat(now) - datetime.datetime.fromisoformat(stamp)).total_seconds()
    except (TypeError, ValueError):
        return float("inf")


Claims = dict[str, Claim]  # holder (org/project/stack) -> its claim


def parse_claims(text: Optional[str]) -> Claims:
    """The Lease annotation's JSON; an unreadable one is an error naming it (never read as empty: that would let
    every stack in)."""
    if not text:
        return {}
    try:
        raw = json.loads(text)
        return {holder: Claim(int(c["batch"]), tuple(c["nodes"]), str(c.get("since", "")), str(c.get("renewed", "")))
                for holder, c in raw.items()}
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise SharedBudgetError(f"the shared budget's claims are unreadable ({e}): {text[:200]!r}") from None


def dump_claims(claims: Claims) -> str:
    return json.dumps({h: {"batch": c.index, "nodes": list(c.nodes), "since": c.since,
                           **({"renewed": c.renewed} if c.renewed else {})}
                       for h, c in sorted(claims.items())}, separators=(",", ":"))


def parse_members(text: Optional[str]) -> Members:
    """The Lease annotation of the stacks' members (fleet_count.Member); unreadable is an error, as for claims."""
    if not text:
        return {}
    try:
        return {h: Member(tuple(m["pools"]), int(m["nodes"])) for h, m in json.loads(text).items()}
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise SharedBudgetError(f"the shared budget's stacks are unreadable ({e}): {text[:200]!r}") from None


def dump_members(members: Members) -> str:
    return json.dumps({h: {"pools": list(m.pools), "nodes": m.nodes} for h, m in sorted(members.items())},
                      separators=(",", ":"))


def with_member(members: Members, holder: str, member: Optional[Member], aliases: frozenset[str] = frozenset()
                ) -> Members:
    """`members` with `holder`'s entry set to `member` (None: removed), its older names' entries gone."""
    out = {h: m for h, m in members.items() if h != holder and h not in aliases}
    if member is not None:
        out[holder] = member
    return out


@dataclass(frozen=True)
class Admission:
    open: bool
    claims: Claims  # what to write: own previous claim gone, expired ones gone; the batch's claim added when open
    state: str
    expired: Claims = field(default_factory=dict)  # other stacks' claims that were not renewed in time (dropped)


def held(claims: Claims, but: str = "") -> int:
    return sum(len(c.nodes) for h, c in claims.items() if h != but)


def describe_others(claims: Claims, holder: str) -> str:
    others = sorted((h, c) for h, c in claims.items() if h != holder)
    text = "; ".join(c.describe(h) for h, c in others[:SHOWN])
    return text + (f"; and {len(others) - SHOWN} more stack(s)" if len(others) > SHOWN else "")


def live(claims: Claims, now: str, ttl: Optional[float]) -> tuple[Claims, Claims]:
    """(claims renewed within `ttl` seconds of `now`, expired ones); no ttl: none expires."""
    if ttl is None:
        return dict(claims), {}
    fresh = {h: c for h, c in claims.items() if age(c.heartbeat, now) <= ttl}
    return fresh, {h: c for h, c in claims.items() if h not in fresh}


def admission(claims: Claims, limit: int, holder: str, index: int, batch: tuple[str, ...], now: str, name: str,
              fleet: Optional[Fleet] = None, ttl: Optional[float] = None,
              aliases: frozenset[str] = frozenset(), merge: bool = False) -> Admission:
    """May `holder`'s batch `index` go out now? With `fleet` (the cluster's Nodes and the stacks' members, this one's
    included) what is out is counted from the cluster (fleet_count.py), the other stacks' live claims adding the nodes
    they have not taken out yet; without it, from the claims alone. The batch fits if, with it, no more than `limit`
    are out. The stack's own claim (a previous batch, done, or this one from a run that was cut short; also under an
    older holder name in `aliases`) never counts against it; expired claims don't count and are dropped. A batch
    that does not fit keeps its own claim if it holds one (a drain of it re-checking), else drops the stack's
    previous one (that batch is done)."""
    own = {holder, *aliases}
    fresh, expired = live({h: c for h, c in claims.items() if h not in own}, now, ttl)
    claimed = [n for c in fresh.values() for n in c.nodes]
    if fleet is not None:
        counted = fleet_out(fleet, batch, claimed, holder)
        out, detail = counted.count, f" ({counted.text})" if counted.parts else ""
    else:
        out, detail = len(set(claimed) - set(batch)) + len(batch), ""
    fits = out <= limit
    write, previous = dict(fresh), claims.get(holder)
    if merge and previous is not None:
        batch = tuple(dict.fromkeys((*previous.nodes, *batch)))  # the stack's claim covers the batch
        index = previous.index if set(batch) == set(previous.nodes) else index
    if fits:
        keep_since = previous.since if previous and previous.index == index and previous.nodes == batch else now
        write[holder] = Claim(index, tuple(batch), keep_since, now)
    elif previous and previous.index == index and previous.nodes == batch:
        write[holder] = previous  # the batch under way keeps its room while a drain of it waits
    who = f"; claims of other stacks: {describe_others(fresh, holder)}" if fresh else ""
    state = (f"shared budget {name!r}: {out} of {limit} node(s) out with this batch of {len(batch)}{detail}{who}")
    return Admission(fits, write, state, expired)


def renewed(claims: Claims, holder: str, now: str) -> Claims:
    """The heartbeat: `holder`'s claim renewed at `now` (unchanged if it holds none: a dropped claim is not revived)."""
    return {h: replace(c, renewed=now) if h == holder else c for h, c in claims.items()}


def released(claims: Claims, holder: str) -> Claims:
    return {h: c for h, c in claims.items() if h != holder}


def check_limit(recorded: Optional[int], limit: int, claims: Claims, holder: str, name: str) -> int:
    """The limit to record. Stacks that share a budget must agree on it; a new value is taken only while no other
    stack holds a claim (it could otherwise let more out than a running stack planned for)."""
    if recorded is None or recorded == limit or not held(claims, but=holder):
        return limit
    raise SharedBudgetError(
        f"gpu-migration:sharedBudget.maxUnavailable is {limit}, but the shared budget {name!r} records {recorded} "
        f"and other stacks hold claims under it ({describe_others(claims, holder)}). Give every stack that shares "
        f"{name!r} the same value (it changes once no other stack holds a claim)")


def limit_from(annotations: dict[str, Any], key: str) -> Optional[int]:
    value = annotations.get(key)
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        raise SharedBudgetError(f"the shared budget's limit annotation {key}={value!r} is not a number") from None
