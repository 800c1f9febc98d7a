"""The README's main command with its local default (`python -m gpu_migration_local`) runs the whole migration of
Pulumi.local.yaml under the real CLI, and a second run does it again from scratch (the IKS emulator lives in the
process, so nothing of the first run may leak into the second)."""
import json
import re
import stat
import subprocess
import sys

from gpu_migration_local.__main__ import REPO, STATE

DRA_NODE = "10.240.0.11"  # the stack file's dra node


def credentials() -> str:
    """The admin token of the run that just ended; its files must be 0600 in 0700 directories (issue 18 point 5)."""
    mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
    assert mode(STATE) == mode(STATE / "cluster") == 0o700
    for f in (STATE / "kubeconfig", STATE / "cluster" / "kubeconfig", STATE / "cluster" / "tokens.csv",
              STATE / "cluster" / "sa.key"):
        assert mode(f) == 0o600, f
    return json.loads((STATE / "kubeconfig").read_text())["users"][0]["user"]["token"]


def test_the_readme_main_command_runs_the_whole_migration_and_runs_again(request):
    request.config.real_engine_nodeids.add(request.node.nodeid)
    tokens = []
    for run in (1, 2):
        done = subprocess.run([sys.executable, "-m", "gpu_migration_local", "--exit"], cwd=REPO, text=True,
                              capture_output=True, timeout=900)
        out = done.stdout + done.stderr
        assert done.returncode == 0, f"run {run}:\n{out[-4000:]}"
        assert re.search(r"\+ \d+ created", out) and "failed" not in out, f"run {run}:\n{out[-4000:]}"
        smoke = re.search(rf'node:{re.escape(DRA_NODE)}: \{{.*?smokeTest\s*: "passed: ', out, re.S)
        assert smoke, f"run {run}: no passed smoke test for {DRA_NODE} in the stack outputs:\n{out[-4000:]}"
        tokens.append(credentials())
        if run == 2:
            assert f"removing {STATE / 'backend'} of an earlier run" in out
    assert tokens[0] != tokens[1]  # a fresh admin token per run
