"""Fixtures for tests against the real tools: a local control plane (kube-apiserver, kube-scheduler,
kube-controller-manager, etcd, kwok) and the Pulumi CLI, all built by tools/build. A missing tool fails; nothing skips."""
import pytest

from gpu_migration_local.env import LocalCluster


@pytest.fixture(scope="session")
def cluster():
    with LocalCluster() as c:
        yield c


@pytest.fixture
def project(tmp_path, request):
    """A throw-away project under the real CLI; the test counts in the `real engine:` summary line."""
    from .project import Project
    request.config.real_engine_nodeids.add(request.node.nodeid)
    return Project(tmp_path)


@pytest.fixture
def env(project):
    """Each whole-migration scenario gets its own cluster with three IKS GPU workers (tests/real/scenario_env.py)."""
    from .scenario_env import three_workers
    yield from three_workers(project)
