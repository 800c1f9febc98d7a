"""Kubernetes / IKS version strings ('1.36', '1.36.2_1530', 'v1.35.4+IKS'), compared numerically."""
import re
from typing import Optional


def version_key(version: Optional[str]) -> tuple[int, ...]:
    """'1.36.2_1530' -> (1, 36, 2, 1530); '' -> ()."""
    return tuple(int(n) for n in re.findall(r"\d+", version or ""))


def version_at_least(actual: Optional[str], target: str) -> bool:
    """True if `actual` is at or above `target`, compared on as many parts as `target` has ('1.36' ~ '1.36.2_1530')."""
    want = version_key(target)
    have = version_key(actual)[: len(want)]
    return bool(have) and have >= want


def minor_steps(actual: Optional[str], target: str) -> list[str]:
    """IKS moves a master one minor version at a time: 1.35.4 -> 1.37 is ['1.36', '1.37']; at target: []."""
    if version_at_least(actual, target):
        return []
    have, want = version_key(actual), version_key(target)
    if len(have) < 2 or len(want) < 2 or have[0] != want[0]:
        return [target]
    return [f"{want[0]}.{minor}" for minor in range(have[1] + 1, want[1])] + [target]
