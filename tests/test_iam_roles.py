"""Issue 18 point 1, IBM Cloud IAM: the IKS emulator enforces the two platform roles on containers-kubernetes (Viewer
reads, Operator also updates the master, replaces workers and creates or removes worker pools), IKS's 403 answer
reaches the user, and the program's error names the role that is missing and for which cluster."""
import pathlib
import re

import pytest

from iks_gpu_migration.iks import api as iks_api
from iks_gpu_migration.iks.api import IksApiError, IksClient
from iks_gpu_migration.iks.master import MasterVersionProvider
from iks_gpu_migration.iks.pool import TempGpuPoolProvider
from tests.emulators.iks import IksEmulator
from tests.test_iks_providers import master_props, pool_props, replace

VIEWER_KEY = "viewer-api-key"
NEEDS_OPERATOR = "the API key's identity needs the Operator platform role on containers-kubernetes for cluster " \
                 "gpu-cluster"
DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "permissions.md"


@pytest.fixture
def emu():
    emulator = IksEmulator(master_version="1.35.4_1540").start()
    emulator.grant(VIEWER_KEY, "Viewer")
    yield emulator
    emulator.stop()


def viewer(emu: IksEmulator) -> dict:
    return emu.api(api_key=VIEWER_KEY)


def test_a_viewer_key_reads_everything_the_program_reads(emu):
    pool = emu.add_pool("gpu")
    emu.add_worker(worker_id="w1")
    client = IksClient.from_api(viewer(emu))
    assert client.get_cluster("gpu-cluster")["name"] == "gpu-cluster"
    assert [w["id"] for w in client.list_workers("gpu-cluster")] == ["w1"]
    assert client.get_worker("gpu-cluster", "w1")["id"] == "w1"
    assert client.get_worker_pool("gpu-cluster", pool["id"])["poolName"] == "gpu"
    assert "1.36" in client.kube_versions()
    assert emu.refused == []


def test_a_viewer_key_cannot_replace_a_worker_and_the_error_names_the_role(emu):
    emu.add_worker(worker_id="w1", version="1.34.2_1520")  # behind the master: to be replaced
    with pytest.raises(IksApiError) as refused:
        replace(emu, "w1", api=viewer(emu), kube_version="1.35")
    message = str(refused.value)
    assert refused.value.status_code == 403
    assert "IKS refused the replacement, worker w1 is unchanged" in message
    # IKS's own answer, then what to do.
    assert "HTTP 403: You are not authorized to replace worker nodes of cluster gpu-cluster" in message, message
    assert NEEDS_OPERATOR in message and "docs/permissions.md" in message
    assert emu.refused == [("POST", "/v2/vpc/replaceWorker")]
    assert emu.workers["w1"]["lifecycle"]["actualState"] == "deployed"


def test_a_viewer_key_cannot_update_the_master(emu):
    with pytest.raises(IksApiError) as refused:
        MasterVersionProvider().create({**master_props(emu), "api": viewer(emu)})
    assert "update master of cluster gpu-cluster to 1.36 failed: HTTP 403: You are not authorized to update the " \
           "master of cluster gpu-cluster" in str(refused.value)
    assert NEEDS_OPERATOR in str(refused.value)
    assert emu.cluster["masterKubeVersion"] == "1.35.4_1540" and emu.master_requests == []


def test_a_viewer_key_cannot_create_or_remove_a_worker_pool(emu):
    with pytest.raises(IksApiError, match=NEEDS_OPERATOR):
        TempGpuPoolProvider().create(pool_props(emu, api=viewer(emu)))
    assert emu.pools == {}
    pool = emu.add_pool("gpu-migration-temp", size=1)
    with pytest.raises(IksApiError, match=NEEDS_OPERATOR):
        TempGpuPoolProvider().delete(pool["id"], pool_props(emu, api=viewer(emu)))
    assert pool["lifecycle"]["actualState"] == "active"
    assert emu.refused == [("POST", "/v2/vpc/createWorkerPool"),
                           ("DELETE", f"/v1/clusters/gpu-cluster/workerpools/{pool['poolName']}")]


def test_the_default_key_is_an_operator(emu):
    emu.add_worker(worker_id="w1", version="1.35.4_1540")
    assert replace(emu, "w1", kube_version="1.35")["new_worker_id"] == "w1"  # at target: read only
    MasterVersionProvider().create(master_props(emu))
    assert emu.cluster["masterKubeVersion"].startswith("1.36") and emu.refused == []


def test_every_iks_call_names_its_role_and_the_permissions_doc_lists_each():
    """docs/permissions.md's table of IKS calls is the client's, role for role."""
    calls = {name: fn.role for name, fn in vars(IksClient).items() if callable(fn) and not name.startswith("_")
             and name not in ("from_api",)}
    assert set(calls.values()) == {"Viewer", "Operator"} and len(calls) == 9, calls
    documented = dict(re.findall(r"^\| `(\w+)` \|[^|]+\|[^|]+\| (Viewer|Operator) \|$", DOC.read_text(), re.M))
    assert documented == calls
    assert iks_api.IksClient.replace_worker.role == "Operator"
