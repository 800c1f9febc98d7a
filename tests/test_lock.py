"""The dependency locks: requirements.txt (what the program and the Pulumi language host install) and
requirements-test.txt are exact and hashed, so pip installs them in hash-checking mode, and they agree with each other
and with the ranges in requirements.in they are compiled from (docs/testing.md#dependencies-the-hashed-lock)."""
import pytest

from lockfile import REPO, pins, pinned_version, ranges

LOCKS = ["requirements.txt", "requirements-test.txt"]


@pytest.mark.parametrize("lock", LOCKS)
def test_every_entry_is_pinned_exactly_with_hashes(lock):
    entries = pins(REPO / lock)
    options = [k for k in entries if k.startswith("-")]
    # pip's hash-checking mode refuses editable and unpinned requirements; an index or find-links line would tie the
    # lock to one machine.
    assert options == [], f"{lock}: option lines {options}: only name==version --hash=... entries belong in a lock"
    for name, pin in entries.items():
        pinned_version(pin)
        assert pin.hashes and all(h.startswith("sha256:") for h in pin.hashes), f"{lock}: {name} has no sha256 hash"


def test_the_test_lock_has_the_program_lock_with_the_same_pins_and_hashes():
    program, test = pins(REPO / "requirements.txt"), pins(REPO / "requirements-test.txt")
    assert {name: test.get(name) for name in program} == program


@pytest.mark.parametrize("source, lock", [("requirements.in", "requirements.txt"),
                                          ("requirements-test.in", "requirements-test.txt")])
def test_the_lock_satisfies_the_ranges_it_was_compiled_from(source, lock):
    locked = pins(REPO / lock)
    wanted = dict(ranges(REPO / source))
    if source == "requirements-test.in":
        wanted.update(ranges(REPO / "requirements.in"))  # its -r
    missing = sorted(set(wanted) - set(locked))
    assert not missing, f"{lock} lacks {missing}: run pip-compile again (docs/testing.md)"
    outside = [f"{name}=={pinned_version(locked[name])} (wants {req.specifier})" for name, req in wanted.items()
               if not req.specifier.contains(pinned_version(locked[name]), prereleases=True)]
    assert not outside, f"{lock} pins outside {source}: {outside}: run pip-compile again (docs/testing.md)"

