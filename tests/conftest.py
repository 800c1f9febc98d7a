import os
import pathlib
import sys

import pytest

# Tests import the program's modules the way the Pulumi language host does: from the project root.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


@pytest.fixture(autouse=True)
def fresh_worker_claims(monkeypatch):
    """Claims on new workers last as long as the provider process (NewWorkerClaims); the emulators
    reuse worker IDs from test to test, so each test starts with none."""
    from iks_gpu_migration.iks import claims
    monkeypatch.setattr(claims, "CLAIMS", claims.NewWorkerClaims())


@pytest.fixture
def kube():
    """The Kubernetes API emulator (tests/emulators/kube.py) for the dynamic providers' unit tests."""
    from tests.emulators.kube import KubeEmulator
    emulator = KubeEmulator().start()
    yield emulator
    emulator.stop()


@pytest.fixture
def kubeconfig(kube, tmp_path):
    return kube.write_kubeconfig(tmp_path / "kubeconfig")


def pytest_configure(config):
    config.real_engine_nodeids = set()  # tests that ran `pulumi` through the real CLI (tests/real/conftest.py)


def pytest_collection_modifyitems(session, config, items):
    # The real-engine tests run inline programs in this process and leave Pulumi's runtime settings pointing at an
    # engine that is gone; the fast tests run first so they never see them.
    items.sort(key=lambda item: "/tests/real/" in str(item.fspath))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    passed = [r.nodeid for r in terminalreporter.stats.get("passed", []) if r.when == "call"]
    real = config.real_engine_nodeids
    ran = [n for n in passed if n in real]
    if not real:
        return
    from gpu_migration_local import tools
    terminalreporter.write_line(f"real engine: {tools.versions_line()}, {len(ran)} scenarios passed")


def pytest_sessionfinish(session, exitstatus):
    # In CI a skip hides a failure: any skipped test fails the run.
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    if os.environ.get("CI") and skipped and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
