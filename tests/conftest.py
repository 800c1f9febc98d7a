import os
import pathlib
import sys

import pytest

# Tests import the program's modules the way the Pulumi language host does: from the project root.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


@pytest.fixture(autouse=True)
def fresh_worker_claims(monkeypatch):
    """Claims on new workers and canaries last as long as the provider process (NewWorkerClaims, Canaries); the
    emulators reuse worker and pool IDs from test to test, so each test starts with none."""
    from iks_gpu_migration.iks import claims
    monkeypatch.setattr(claims, "CLAIMS", claims.NewWorkerClaims())
    from iks_gpu_migration.iks import pool_rules  # canaries per pool and zone, kept per process the same way
    monkeypatch.setattr(pool_rules, "CANARIES", pool_rules.Canaries())
    from iks_gpu_migration.iks import master  # masters seen resting, kept per process the same way
    monkeypatch.setattr(master, "RESTED", set())
    from iks_gpu_migration.iks import api  # IAM tokens, kept per process: an emulator may get a port used before
    monkeypatch.setattr(api, "_AUTHENTICATORS", {})
    monkeypatch.setattr(api, "_CLIENTS", {})


@pytest.fixture(scope="session")
def envtest(request):
    """One real etcd + kube-apiserver for the whole session (tests/envtest.py); a missing binary fails, naming
    tools/build."""
    from tests.envtest import EnvTest
    env = EnvTest().start()
    request.config.envtest_started_in = env.started_in
    yield env
    env.stop()
    assert not env.terminator.errors, env.terminator.errors


@pytest.fixture
def kube(envtest):
    """This test's view of the session's API server: every name it creates carries its own prefix, and all of it is
    deleted afterwards (tests/envtest.py Kube)."""
    from tests.envtest import Kube
    k = Kube(envtest, envtest.next_prefix())
    yield k
    k.cleanup()
    assert not k.errors, k.errors


@pytest.fixture
def kubeconfig(kube):
    return kube.kubeconfig


def pytest_configure(config):
    config.real_engine_nodeids = set()  # tests that ran `pulumi` through the real CLI (tests/real/conftest.py)


def pytest_collection_modifyitems(session, config, items):
    # The real-engine tests run inline programs in this process and leave Pulumi's runtime settings pointing at an
    # engine that is gone; the fast tests run first so they never see them.
    items.sort(key=lambda item: "/tests/real/" in str(item.fspath))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if getattr(config, "envtest_started_in", None) is not None:
        terminalreporter.write_line(f"envtest: etcd + kube-apiserver started in {config.envtest_started_in:.1f} s")
    passed = [r.nodeid for r in terminalreporter.stats.get("passed", []) if r.when == "call"]
    real = config.real_engine_nodeids
    ran = [n for n in passed if n in real]
    if not real:
        return
    from gpu_migration_local import tools
    from gpu_migration_local.nodes import room
    kubelets = f", kubelet {tools.kubelet_version()} on {room.nodes_started} nodes" if room.nodes_started else ""
    terminalreporter.write_line(f"real engine: {tools.versions_line()}{kubelets}, {len(ran)} scenarios passed")


def pytest_sessionfinish(session, exitstatus):
    # In CI a skip hides a failure: any skipped test fails the run.
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    if os.environ.get("CI") and skipped and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
