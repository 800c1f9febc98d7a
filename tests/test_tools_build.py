"""tools/build's own behaviour, on a cache of stand-in outputs (nothing is compiled): each tool under a key of its own,
one line when everything is cached, and while another tools/build holds a tool, which tool and for how long."""
import fcntl
import os
import pathlib
import re
import subprocess
import time

BUILD = pathlib.Path(__file__).resolve().parents[1] / "tools" / "build"


def _run(cache: pathlib.Path, *args: str, **kw):
    env = {**os.environ, "GPU_MIGRATION_TOOLS_CACHE": str(cache)}
    return subprocess.Popen([str(BUILD), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **kw)


def _tools(cache: pathlib.Path) -> dict[str, tuple[str, list[str]]]:
    out = _run(cache, "--keys").communicate()[0]
    tools = {t: (k, outs) for t, k, *outs in (line.split() for line in out.splitlines())}
    assert tools and all(outs for _, outs in tools.values()), out  # else the run below would really build
    return tools


def _fake(cache: pathlib.Path, tool: str, key: str, outputs: list[str]) -> None:
    for o in outputs:
        path = cache / "by-tool" / f"{tool}-{key}" / "out" / o
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)


def test_every_tool_has_its_own_key_and_a_cached_run_says_so_once(tmp_path):
    tools = _tools(tmp_path)
    assert {"kubelet", "containerd", "runc", "cni_plugins", "kubernetes", "pulumi"} <= set(tools)
    assert len({k for k, _ in tools.values()}) == len(tools)
    for t, (k, outs) in tools.items():
        _fake(tmp_path, t, k, outs)
    stdout, stderr = _run(tmp_path).communicate(timeout=60)
    bin_dir = pathlib.Path(stdout.strip())
    assert (bin_dir / "kubelet").exists() and (bin_dir.parent / "cni" / "bin" / "bridge").exists()
    assert stderr.count("\n") == 1 and stderr.strip().endswith(f"tools cached: {bin_dir}"), stderr


def test_waiting_for_another_build_names_the_tool_and_how_long(tmp_path):
    tools = _tools(tmp_path)
    for t, (k, outs) in tools.items():
        if t != "kubelet":
            _fake(tmp_path, t, k, outs)
    key, outs = tools["kubelet"]
    held = tmp_path / "by-tool" / f"kubelet-{key}"
    (held.parent / f"{held.name}.building").write_text(f"{int(time.time()) - 125} 4242\n")
    with open(held.parent / f"{held.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = _run(tmp_path)
        os.set_blocking(proc.stderr.fileno(), False)
        seen, deadline = "", time.monotonic() + 30
        while "waiting for it" not in seen and time.monotonic() < deadline:
            try:
                seen += os.read(proc.stderr.fileno(), 4096).decode()
            except BlockingIOError:
                time.sleep(0.1)
        assert re.search(r"another tools/build \(pid 4242\) is building kubelet \(for 2 min \d+ s so far\); "
                         r"waiting for it", seen), seen
        _fake(tmp_path, "kubelet", key, outs)  # the other build finishes
    os.set_blocking(proc.stderr.fileno(), True)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "tools cached" in seen + stderr and "built" not in seen + stderr
