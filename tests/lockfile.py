"""Reading the hashed locks (requirements.txt, requirements-test.txt: pip-compile --generate-hashes output) and the
ranges they are compiled from (requirements.in)."""
import pathlib
import re
from dataclasses import dataclass

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = pathlib.Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Pin:
    spec: str  # the requirement as written, e.g. "pulumi==3.272.0"
    hashes: tuple[str, ...]


def entries(path: pathlib.Path) -> list[str]:
    """The file's logical lines (continuations joined), comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
    return [line for line in lines if line]


def pins(path: pathlib.Path) -> dict[str, Pin]:
    """{canonical name: Pin}; option lines (-r, -c, --index-url, ...) are returned under their own text."""
    out: dict[str, Pin] = {}
    for line in entries(path):
        spec, *hashes = line.split(" --hash=")
        key = spec if spec.startswith("-") else canonicalize_name(Requirement(spec).name)
        out[key] = Pin(spec.strip(), tuple(h.strip() for h in hashes))
    return out


def pinned_version(pin: Pin) -> str:
    """The exact version of `name==version`; anything else is not a lock entry."""
    specifiers = list(Requirement(pin.spec).specifier)
    assert len(specifiers) == 1 and specifiers[0].operator == "==", f"{pin.spec} is not pinned exactly (==)"
    return specifiers[0].version


def ranges(path: pathlib.Path) -> dict[str, Requirement]:
    return {canonicalize_name(Requirement(line).name): Requirement(line)
            for line in entries(path) if not line.startswith("-")}
