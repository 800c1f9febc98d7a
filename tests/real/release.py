"""The current release of iks_gpu_migration, run under the real CLI: its package materialised from git, a `pulumi up`
of it in a subprocess whose imports (program and dynamic-provider host) resolve to that package, and what its state's
`__provider` pickles reference. For tests/real/test_state_compat.py.

Run as `python -P -m tests.real.release <release dir> <project dir> <backend dir> <api key>` (what `up_with_release`
does): a `pulumi up` of the `local` stack in <project dir> with the program of `iks_gpu_migration` from <release dir>.
"""
from __future__ import annotations

import base64
import json
import os
import pathlib
import pickletools
import subprocess
import sys
import textwrap
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[2]
RELEASE = "7060577"  # the current release: stacks deployed with it must keep working after the package moves
IMPORT_LOG = "GPU_MIGRATION_IMPORT_LOG"

# Every `iks_gpu_migration` import of a process with this dir first on PYTHONPATH is appended to
# $GPU_MIGRATION_IMPORT_LOG (as JSON: pid, argv, module, the file it resolves to). It only looks: the import
# proceeds as it would without it.
SITECUSTOMIZE = textwrap.dedent('''\
    import importlib.machinery, json, os, sys

    class _ImportRecorder:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name == "iks_gpu_migration" or name.startswith("iks_gpu_migration."):
                spec = importlib.machinery.PathFinder.find_spec(name, path)
                line = json.dumps({"pid": os.getpid(), "argv": sys.argv, "module": name,
                                   "origin": spec.origin if spec else None}) + "\\n"
                fd = os.open(os.environ["GPU_MIGRATION_IMPORT_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, line.encode())
                finally:
                    os.close(fd)
            return None

    sys.meta_path.insert(0, _ImportRecorder)
''')


def materialise(dest: pathlib.Path, commit: str = RELEASE, repo: pathlib.Path = REPO) -> pathlib.Path:
    """`git archive <commit> iks_gpu_migration` unpacked into `dest`; returns `dest`. A missing commit is an error
    (a shallow clone lacks it: CI runs a full clone), never a reason to skip."""
    found = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"],
                           capture_output=True, text=True, check=False)
    if found.returncode != 0:
        raise AssertionError(
            f"release commit {commit} is not in the git repository at {repo} ({found.stderr.strip() or 'not found'}): "
            f"the state-compatibility test needs the current release's package; run it in a full clone "
            f"(`git fetch --unshallow` in a shallow one)")
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.Popen(["git", "-C", str(repo), "archive", commit, "iks_gpu_migration"], stdout=subprocess.PIPE)
    untar = subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, capture_output=True, text=True,
                           check=False)
    archive.stdout.close()
    if archive.wait() != 0 or untar.returncode != 0:
        raise AssertionError(f"git archive {commit} iks_gpu_migration | tar -x -C {dest} failed: {untar.stderr}")
    if not (dest / "iks_gpu_migration" / "program.py").is_file():
        raise AssertionError(f"release {commit} has no iks_gpu_migration/program.py")
    return dest


def up_with_release(release: pathlib.Path, project_dir: pathlib.Path, backend_dir: pathlib.Path, api_key: str,
                    import_log: pathlib.Path, timeout: float = 240) -> str:
    """`pulumi up` of the `local` stack with the release's program and providers (a subprocess: this process has the
    working tree's package imported). Returns its output; fails with it if the up failed."""
    hooks = release.parent / "import-recorder"
    hooks.mkdir(exist_ok=True)
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = os.pathsep.join([str(hooks), str(release), str(REPO)])  # the release's package before the working tree's
    env = {**os.environ, "PYTHONPATH": path, IMPORT_LOG: str(import_log)}
    # -P: neither the current directory nor a script's directory goes before PYTHONPATH.
    done = subprocess.run([sys.executable, "-P", "-m", "tests.real.release", str(release), str(project_dir),
                           str(backend_dir), api_key], cwd=str(project_dir), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise AssertionError(f"pulumi up with release {RELEASE} failed (exit {done.returncode}):\n"
                             f"{done.stdout[-6000:]}")
    return done.stdout


def imports(import_log: pathlib.Path) -> list[dict[str, Any]]:
    if not import_log.exists():
        return []
    return [json.loads(line) for line in import_log.read_text().splitlines() if line.strip()]


def export(pulumi: str, env: dict[str, str], project_dir: pathlib.Path, stack: str = "local") -> dict:
    """`pulumi stack export --show-secrets`: the deployment as the backend stores it."""
    done = subprocess.run([pulumi, "stack", "export", "--show-secrets", "--stack", stack], cwd=str(project_dir),
                          env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)["deployment"]


def pickled_globals(provider: str) -> set[tuple[str, str]]:
    """(module, name) of every global a base64 dill pickle refers to by reference (GLOBAL / STACK_GLOBAL)."""
    raw = base64.b64decode(provider)
    found, pushed, memo = set(), [], {}
    for op, arg, _ in pickletools.genops(raw):
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"):
            pushed.append(arg)
        elif op.name == "MEMOIZE":
            memo[len(memo)] = pushed[-1] if pushed else None
        elif op.name in ("BINGET", "LONG_BINGET", "GET"):
            pushed.append(memo.get(int(arg)))
        elif op.name == "STACK_GLOBAL":
            found.add((pushed[-2], pushed[-1]))
            pushed.append(None)
        elif op.name == "GLOBAL":
            module, name = arg.split(" ", 1)
            found.add((module, name))
            pushed.append(None)
        elif op.name in ("PUT", "BINPUT", "LONG_BINPUT"):
            memo[int(arg)] = pushed[-1] if pushed else None
        elif op.name not in ("PROTO", "FRAME", "STOP"):
            pushed.append(None)
    return found


SECRET_SIG = "4dabf18193072939515e22adb298388d"  # how a state marks a secret value


def plain(value: Any) -> Any:
    """A state value as `stack export --show-secrets` gives it: the SDK stores `__provider` as a secret."""
    if isinstance(value, dict) and value.get(SECRET_SIG) and "plaintext" in value:
        return json.loads(value["plaintext"])
    return value


def provider_pickles(deployment: dict, part: str = "outputs") -> dict[str, str]:
    """{resource name: the `__provider` in its `part` ("inputs" or "outputs")} of every dynamic resource.

    They can differ: a resource whose provider reports no change (`same`) gets the program's new inputs, with the
    new pickle, while its outputs keep the one it was created or last updated with. The dynamic-provider host
    unpickles the outputs' one for `refresh` (Read) and deletions (Delete), the inputs' one for Diff/Update."""
    out = {}
    for r in deployment.get("resources", []):
        if not r["type"].startswith("pulumi-python:dynamic"):
            continue
        name = r["urn"].rsplit("::", 1)[1]
        pickled = plain((r.get(part) or {}).get("__provider"))
        assert isinstance(pickled, str) and pickled, f"{name}: no __provider in its {part}: {pickled!r}"
        out[name] = pickled
    return out


def resource_ids(deployment: dict) -> dict[str, str]:
    """{resource name: id} of every dynamic resource (a replacement gets a new id; an update keeps it)."""
    return {r["urn"].rsplit("::", 1)[1]: r.get("id") for r in deployment.get("resources", [])
            if r["type"].startswith("pulumi-python:dynamic")}


def main(argv: list[str]) -> int:
    release, project_dir, backend_dir, api_key = argv
    import iks_gpu_migration
    from iks_gpu_migration.program import main as program
    here = pathlib.Path(iks_gpu_migration.__file__).resolve()
    if not here.is_relative_to(pathlib.Path(release).resolve()):
        print(f"iks_gpu_migration comes from {here}, not from the release in {release}", flush=True)
        return 3
    from gpu_migration_local.engine import Engine
    # The engine's environment puts the working tree first on PYTHONPATH (for the dynamic-provider host the CLI
    # starts): here this process's PYTHONPATH (recorder, release, working tree) goes to the CLI and its plugins.
    engine = Engine(pathlib.Path(project_dir), pathlib.Path(backend_dir),
                    env={"IC_API_KEY": api_key, "PYTHONPATH": os.environ["PYTHONPATH"]})
    stack = engine.stack("local", program)
    result = stack.up(on_output=lambda line: print(line, flush=True))
    print(f"release up: {result.summary.result}", flush=True)
    return 0 if result.summary.result == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
