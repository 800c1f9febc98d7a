"""Rollback from stack history: the stack's updates with each node's stage, and an earlier update's config back.

    python -m iks_gpu_migration.cli.history --stack pilot [--json]
    python -m iks_gpu_migration.cli.history --stack pilot --restore N [--dry-run] [--allow-failed]

Every update records the stack config it ran with (`pulumi stack history --json`, field `config`). The list shows each
update's number, start time, kind, result and nodes by stage, and which update the stack file matches now. `--restore
N` shows what restoring update N changes (per node: stage from -> to; every other `gpu-migration:*` key that
changes), validates the result as `pulumi preview` does, and writes update N's `gpu-migration:*` keys back into
Pulumi.<stack>.yaml (in place, all at once: comments, other keys and secrets stay as they are); then `pulumi preview`
shows the rollback and `pulumi up` runs it. An update that did not succeed is restored only with --allow-failed.
Every failure is one line (an invalid result: preview's own list) on stderr naming what to fix; exit code 1, and the
stack file is left as it was.
"""
import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

import yaml

from ..config import NAMESPACE, ConfigError, parse
from ..config.loading import SECRET_KEYS
from .history_config import (SECRET, HistoryError, Update, parse_history, plan, restored_text, same_config, select,
                             stage_summary, stages)
from .status_inputs import PROJECT_DIR, StatusError, local_environment_hint, local_session_cli, program_view

HISTORY_TIMEOUT = 120  # seconds for `pulumi stack history`: a backend that does not answer is named, not waited on


def history_command(stack: str) -> list[str]:
    # --page-size 0: every update (pulumi pkg/backend/diy/state.go getHistory and httpstate client GetStackUpdates
    # page only with a size > 0; the CLI's default is 10).
    return ["stack", "history", "--stack", stack, "--json", "--page-size", "0"]


def read_history(stack: str, project_dir: Path, history_file: Optional[Path], config: dict) -> list[Update]:
    """The stack's updates, newest first: from --history FILE, else from the running local session's CLI or the
    `pulumi` on PATH. HistoryError names the command and why it failed."""
    if history_file is not None:
        try:
            return parse_history(json.loads(Path(history_file).read_text()))
        except (OSError, ValueError, HistoryError) as e:
            raise HistoryError(f"--history {history_file}: not the JSON of `pulumi {' '.join(history_command(stack))}`"
                               f" ({' '.join(str(e).split())})") from None
    pulumi, env = local_session_cli(project_dir, stack) or (shutil.which("pulumi"), None)
    shown = f"`pulumi {' '.join(history_command(stack))}`"
    if pulumi is None:
        hint = local_environment_hint(config, project_dir, stack)
        raise HistoryError(hint or f"the pulumi CLI is not on PATH: install it, or pass --history FILE with the "
                                   f"output of {shown}")
    try:
        done = run_bounded([pulumi, *history_command(stack)], project_dir, env, HISTORY_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise HistoryError(f"{shown} did not answer within {HISTORY_TIMEOUT}s: is the backend reachable "
                           f"(`pulumi whoami -v`)?") from None
    except OSError as e:
        raise HistoryError(f"{shown} could not run {pulumi}: {e.strerror or e}") from None
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["no message"])[-1]
        hint = local_environment_hint(config, project_dir, stack)
        raise HistoryError(f"{shown} failed (exit {done.returncode}: {reason})" + (f"; {hint}" if hint else ""))
    try:
        return parse_history(json.loads(done.stdout or "[]"))
    except ValueError:
        raise HistoryError(f"{shown} printed no JSON: {' '.join(done.stdout.split())[:200]}") from None


def run_bounded(argv: list[str], cwd: Path, env: Optional[dict], timeout: float) -> subprocess.CompletedProcess:
    """`argv` in a process group of its own, killed whole at `timeout` (TimeoutExpired): a child it left behind
    would otherwise hold the pipes open past it."""
    with subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as process:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise
    return subprocess.CompletedProcess(argv, process.returncode, out, err)


def file_config(path: Path) -> dict:
    """The stack file's `gpu-migration:*` keys as the program gets them (status_inputs.program_view), a secret as
    SECRET; HistoryError for a file that is missing or not YAML."""
    try:
        view = program_view(path)
    except FileNotFoundError:
        known = sorted(p.name for p in path.parent.glob("Pulumi.*.yaml") if p.name != "Pulumi.yaml")
        raise HistoryError(f"no {path.name} in {path.parent} (stack files here: {', '.join(known) or 'none'})"
                           ) from None
    except (OSError, yaml.YAMLError) as e:
        raise HistoryError(f"{path} is not a readable stack file: {' '.join(str(e).split())}") from None
    return {k: SECRET if isinstance(v, dict) and list(v) == ["secure"] else v for k, v in view.items()}


def listing(stack: str, path: Path, updates: list[Update], current: dict) -> str:
    if not updates:
        return f"stack {stack} has no updates yet: nothing to restore"
    rows = [("#", "STARTED", "KIND", "RESULT", "NODES")]
    for u in updates:
        mark = f"  (= {path.name})" if same_config(u.config, current) else ""
        rows.append((str(u.number), u.started, u.kind, u.result, stage_summary(u.config) + mark))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4] for r in rows]
    return (f"stack {stack}: {len(updates)} update(s), newest first; `--restore N` shows and writes update N's "
            f"{NAMESPACE}:* config back into {path.name}\n" + "\n".join(lines))


def as_json(stack: str, path: Path, updates: list[Update], current: dict) -> str:
    return json.dumps({"stack": stack, "stackFile": str(path), "updates": [
        {"number": u.number, "startTime": u.started, "kind": u.kind, "result": u.result, "stages": stages(u.config),
         "matchesStackFile": same_config(u.config, current)} for u in updates]}, indent=2)


def restore(path: Path, update: Update, current: dict, project_dir: Path, dry_run: bool) -> str:
    """What restoring `update` changes; unless `dry_run`, the stack file with its config, if that passes validation."""
    change = plan(current, update.config)
    lines = [f"{update.describe()} -> {path.name}:", *(f"  {line}" for line in change.nodes + change.keys),
             *(f"  kept: {line}" for line in change.kept)]
    if not change.writes:
        return "\n".join([*lines, f"{path.name} already holds its {NAMESPACE}:* config: nothing to write"])
    text = path.read_text(encoding="utf-8")
    new_text, exact = restored_text(text, change.writes)
    if not exact:
        print(f"note: {path.name}'s indentation is not one this command writes back exactly: lines besides the "
              f"restored keys may change form (not content); review them with `git diff {path.name}`", file=sys.stderr)
    write_validated(path, text, new_text, project_dir, update, dry_run)
    if dry_run:
        return "\n".join([*lines, f"dry run: {path.name} left as it is (the result passes preview's validation)"])
    stack = path.name[len("Pulumi."):-len(".yaml")]
    return "\n".join([*lines, f"written: {path.name} holds {update.describe()}'s {NAMESPACE}:* config; next: "
                              f"`pulumi preview --stack {stack}` shows the rollback, `pulumi up --stack {stack}` runs "
                              f"it"])


def write_validated(path: Path, old_text: str, new_text: str, project_dir: Path, update: Update,
                    dry_run: bool) -> None:
    """Validate `new_text` as `pulumi preview` does (config.parse, in the project directory: status_inputs.validate),
    then, unless `dry_run`, put it in place of `path` at once (a temporary file beside it, renamed: the stack file is
    either as it was or fully restored). HistoryError, with the file untouched, if it is invalid or changed
    meanwhile."""
    target = path.resolve()
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".restore")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(new_text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, target.stat().st_mode & 0o7777)
        try:
            with contextlib.chdir(project_dir):
                raw = program_view(Path(tmp))
                parse({k: v for k, v in raw.items() if k not in SECRET_KEYS})  # secrets: read on their own
        except ConfigError as e:
            raise HistoryError(f"{update.describe()}'s config does not pass preview's validation today, so "
                               f"{path.name} was left as it was:\n{e}") from None
        if dry_run:
            return
        if target.read_text(encoding="utf-8") != old_text:
            raise HistoryError(f"{path.name} changed while this command ran; nothing was written: run it again")
        os.replace(tmp, target)
        tmp = None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m iks_gpu_migration.cli.history",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--stack", required=True, help="stack name: reads its history and Pulumi.<stack>.yaml")
    parser.add_argument("--restore", type=int, metavar="N", help="write update N's gpu-migration:* config back into "
                                                                 "the stack file (N as listed)")
    parser.add_argument("--dry-run", action="store_true", help="with --restore: show and validate, write nothing")
    parser.add_argument("--allow-failed", action="store_true", help="with --restore: also an update that failed or "
                                                                    "never finished")
    parser.add_argument("--json", action="store_true", help="the list, machine-readable")
    parser.add_argument("--history", type=Path, metavar="FILE", help="saved output of `pulumi stack history --json "
                                                                     "--page-size 0` (default: run it)")
    parser.add_argument("--project-dir", type=Path, default=PROJECT_DIR)
    args = parser.parse_args(argv)
    if args.restore is None and (args.dry_run or args.allow_failed):
        parser.error("--dry-run and --allow-failed go with --restore N")
    if args.restore is not None and args.json:
        parser.error("--json lists the history; it does not go with --restore")
    try:
        path = Path(args.project_dir) / f"Pulumi.{args.stack}.yaml"
        current = file_config(path)
        updates = read_history(args.stack, Path(args.project_dir), args.history, current)
        if args.restore is None:
            print(as_json(args.stack, path, updates, current) if args.json else
                  listing(args.stack, path, updates, current))
            return 0
        update = select(updates, args.restore, args.allow_failed)
        print(restore(path, update, current, Path(args.project_dir), args.dry_run))
    except (HistoryError, StatusError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
