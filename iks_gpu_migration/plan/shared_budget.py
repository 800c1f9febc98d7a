"""A capacity budget shared by every stack that migrates GPU nodes of one cluster (gpu-migration:sharedBudget).

Each stack's gates keep their own budget (gates.py); on top, the nodes every stack has out at once never exceed the
shared `maxUnavailable`. The claims live in one Lease of the cluster (kube/shared_budget.py), one entry per stack:
the batch it has out. A gate admits its batch only if the other stacks' claims plus the batch fit, and replaces its
own stack's previous claim (that batch is done) in the same write. Pure: the claims in, the decision and the claims
to write out; the Lease's resourceVersion makes the write atomic (optimistic concurrency, as client-go's
leaderelection updates its Lease).
"""
import json
from dataclasses import dataclass
from typing import Any, Optional

SHOWN = 5  # claims of other stacks named in a decision; the rest are counted


class SharedBudgetError(ValueError):
    """The shared budget's recorded limit and this stack's disagree while other stacks hold claims."""


@dataclass(frozen=True)
class Claim:
    """A stack's nodes out: its batch `index` and the batch's configured node names, since `since` (ISO time)."""
    index: int
    nodes: tuple[str, ...]
    since: str

    def describe(self, holder: str) -> str:
        return f"{holder}: batch {self.index}, {len(self.nodes)} node(s) since {self.since}"


Claims = dict[str, Claim]  # holder (org/project/stack) -> its claim


def parse_claims(text: Optional[str]) -> Claims:
    """The Lease annotation's JSON; an unreadable one is an error naming it (never read as empty: that would let
    every stack in)."""
    if not text:
        return {}
    try:
        raw = json.loads(text)
        return {holder: Claim(int(c["batch"]), tuple(c["nodes"]), str(c.get("since", "")))
                for holder, c in raw.items()}
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise SharedBudgetError(f"the shared budget's claims are unreadable ({e}): {text[:200]!r}") from None


def dump_claims(claims: Claims) -> str:
    return json.dumps({h: {"batch": c.index, "nodes": list(c.nodes), "since": c.since}
                       for h, c in sorted(claims.items())}, separators=(",", ":"))


@dataclass(frozen=True)
class Admission:
    open: bool
    claims: Claims  # what to write: own previous claim gone; the batch's claim added when open
    state: str
    held_by_others: int


def held(claims: Claims, but: str = "") -> int:
    return sum(len(c.nodes) for h, c in claims.items() if h != but)


def describe_others(claims: Claims, holder: str) -> str:
    others = sorted((h, c) for h, c in claims.items() if h != holder)
    text = "; ".join(c.describe(h) for h, c in others[:SHOWN])
    return text + (f"; and {len(others) - SHOWN} more stack(s)" if len(others) > SHOWN else "")


def admission(claims: Claims, limit: int, holder: str, index: int, batch: tuple[str, ...], now: str,
              name: str) -> Admission:
    """May `holder`'s batch `index` go out now? Its own claim (a previous batch, done, or this one from a run that
    was cut short) never counts against it."""
    others = held(claims, but=holder)
    mine = {h: c for h, c in claims.items() if h != holder}
    fits = others + len(batch) <= limit
    if fits:
        previous = claims.get(holder)
        keep_since = previous.since if previous and previous.index == index and previous.nodes == batch else now
        mine[holder] = Claim(index, tuple(batch), keep_since)
    who = f" ({describe_others(claims, holder)})" if others else ""
    state = (f"shared budget {name!r}: {others} of {limit} node(s) out by other stacks{who}, this batch needs "
             f"{len(batch)}")
    return Admission(fits, mine, state, others)


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
