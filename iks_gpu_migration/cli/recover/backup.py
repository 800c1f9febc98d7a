"""The export recover writes before it changes the state, and the command that restores it.

The export is the whole document `pulumi stack export` printed (its `version` and all), not a rebuilt one; secrets in
it stay encrypted as in the state (no --show-secrets). It goes to `.recover-backups/` in the project directory
(mode 0700, with a `.gitignore` of `*`), one file per run, mode 0600, never overwritten: the refresh that follows an
import overwrites the backend's single `.bak`, so that is no backup."""
from __future__ import annotations

import os
import pathlib
import shlex
import stat
from datetime import datetime, timezone
from typing import Optional

DIRECTORY = ".recover-backups"


def _directory(project: pathlib.Path) -> pathlib.Path:
    path = project / DIRECTORY
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise OSError(f"{path} is not a directory of this user: remove it, recover makes it anew")
    os.chmod(path, 0o700)
    ignore = path / ".gitignore"
    if not ignore.exists():
        ignore.write_text("# backups of stack state written by `recover`: never commit them\n*\n")
    return path


def write(project: pathlib.Path, stack: str, export_text: str, now: Optional[datetime] = None) -> pathlib.Path:
    """Write the export to `.recover-backups/<stack>-<UTC time>.json` (mode 0600, a new file) and return its path."""
    now = now or datetime.now(timezone.utc)
    path = _directory(project) / f"{stack}-{now:%Y%m%dT%H%M%S.%fZ}.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(export_text)
        f.flush()
        os.fsync(f.fileno())
    return path


def latest(project: pathlib.Path, stack: str) -> Optional[pathlib.Path]:
    found = sorted((project / DIRECTORY).glob(f"{stack}-*.json"))
    return found[-1] if found else None


def restore_command(stack: str, path: pathlib.Path) -> str:
    """The command that puts the backed-up state back (run in the project directory). `pulumi stack import` drops
    the backup's pending operations (pkg/cmd/pulumi/stack/io.go SaveSnapshot): the stack is back as the killed update
    left it, without the pending creates, so the next `up` creates those again."""
    return f"pulumi stack import --stack {shlex.quote(stack)} --file {shlex.quote(str(path))}"
