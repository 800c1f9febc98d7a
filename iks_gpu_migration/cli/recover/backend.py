"""The state backend as recover sees it: its kind, and for the file backend (a directory, `file://...`) its lock files
and checkpoint sidecars, read directly. Other DIY backends (s3://, gs://, azblob://, postgres://) keep the same files
in a bucket that recover does not read; Pulumi Cloud keeps its lock to itself."""
from __future__ import annotations

import json
import pathlib
import re
from datetime import datetime
from typing import Optional
from urllib.parse import unquote, urlparse

from .holders import Lock
from .stack import PROJECT


def kind(url: str) -> str:
    """"file", "cloud" (the Pulumi Cloud service or a self-hosted one: an http(s) URL) or "diy" (a bucket)."""
    if url.startswith("file://"):
        return "file"
    return "cloud" if url.startswith(("https://", "http://")) else "diy"


def file_root(url: str) -> pathlib.Path:
    """The directory of a `file://` backend URL (`file://~/x` is under the home directory, as the CLI reads it:
    pkg/backend/diy/backend.go)."""
    parsed = urlparse(url)
    path = unquote(parsed.path)
    if parsed.netloc == "~":
        return pathlib.Path.home() / path.lstrip("/")
    return pathlib.Path(path)


def lock_dirs(root: pathlib.Path, stack: str) -> list[pathlib.Path]:
    """Where the CLI keeps the stack's locks: `.pulumi/locks/organization/<project>/<stack>/` for project-scoped
    stacks, `.pulumi/locks/<stack>/` in the legacy layout (pkg/backend/diy/lock.go stackLockDir, backend.go
    FullyQualifiedName)."""
    locks = root / ".pulumi" / "locks"
    return [locks / "organization" / PROJECT / stack, locks / stack]


def parse_time(text: str) -> Optional[datetime]:
    """A Go time in RFC 3339 with up to nanoseconds (Go's JSON form), as an aware datetime; None if not one."""
    match = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", text or "")
    if not match:
        return None
    base, fraction, zone = match.groups()
    fraction = f".{(fraction or '0')[:6]}"
    return datetime.fromisoformat(base + fraction + ("+00:00" if zone == "Z" else zone))


def read_locks(root: pathlib.Path, stack: str) -> list[Lock]:
    found = []
    for directory in lock_dirs(root, stack):
        for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
            try:
                content = json.loads(path.read_text())
                pid = int(content["pid"])
            except (OSError, ValueError, KeyError, TypeError):
                found.append(Lock(str(path), None, "", "", None))
                continue
            found.append(Lock(str(path), pid, str(content.get("username") or ""),
                              str(content.get("hostname") or ""), parse_time(content.get("timestamp") or "")))
    return found


def broken_sidecars(root: pathlib.Path, stack: str) -> list[pathlib.Path]:
    """Unreadable sidecars `<project>/<stack>.json*.attrs` of the stack's checkpoint (this project's only). gocloud.dev's fileblob (the file backend's
    storage) writes that sidecar (os.Create, then its JSON) before it renames the new checkpoint into place
    (blob/fileblob/fileblob.go writerWithSidecar.Close, attrs.go setAttrs): a kill in between leaves it empty, the
    checkpoint beside it whole, and every command fails with "failed to load checkpoint: EOF" (attrs.go getAttrs
    decodes it). A missing sidecar reads as default attributes (getAttrs), so removing it is safe."""
    broken = []
    for attrs in sorted((root / ".pulumi" / "stacks" / PROJECT).glob(f"{stack}.json*.attrs")):
        try:
            json.loads(attrs.read_text())
        except ValueError:
            broken.append(attrs)
    return broken

