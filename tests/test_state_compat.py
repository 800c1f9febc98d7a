"""Old provider module paths (release 0.2.0) resolve to the classes that live elsewhere now (state_compat.py)."""
import base64
import importlib

import dill
import pytest
from pulumi.dynamic import ResourceProvider
from pulumi.dynamic.dynamic import serialize_provider

from iks_gpu_migration import state_compat

OLD = [(old, name, new) for old, names in state_compat.OLD_PROVIDERS.items() for name, new in names.items()]


def release_pickle(old_module: str, name: str) -> str:
    """`__provider` as release 0.2.0 wrote it: a dill pickle naming the class by reference, protocol 4
    (pulumi/dynamic/dynamic.py serialize_provider), with the old module path."""
    module, qual = f"iks_gpu_migration.{old_module}".encode(), name.encode()
    ops = (b"\x8c" + bytes([len(module)]) + module + b"\x94" + b"\x8c" + bytes([len(qual)]) + qual + b"\x94"
           + b"\x93\x94)\x81\x94.")
    return base64.b64encode(b"\x80\x04\x95" + len(ops).to_bytes(8, "little") + ops).decode()


@pytest.mark.parametrize("old,name,new", OLD, ids=[f"{o}.{n}" for o, n, _ in OLD])
def test_a_release_pickle_loads_the_class_at_its_new_home(old, name, new):
    provider = dill.loads(base64.b64decode(release_pickle(old, name)))
    cls = getattr(importlib.import_module(f"iks_gpu_migration.{new}"), name)
    assert type(provider) is cls and isinstance(provider, ResourceProvider)
    assert getattr(importlib.import_module(f"iks_gpu_migration.{old}"), name) is cls


def test_release_pickles_look_like_what_the_sdk_writes():
    """The hand-made old pickle has exactly the SDK's framing: only the module path differs from a new one."""
    old, name, new = OLD[0]
    cls = getattr(importlib.import_module(f"iks_gpu_migration.{new}"), name)
    now = base64.b64decode(serialize_provider(cls()))
    assert f"iks_gpu_migration.{new}".encode() in now
    made = base64.b64decode(release_pickle(old, name)).replace(f"iks_gpu_migration.{old}".encode(),
                                                               f"iks_gpu_migration.{new}".encode())
    assert made[11:] == now[11:]  # past the frame header (its length differs with the path)


def test_every_dynamic_provider_of_the_release_is_mapped():
    """Release 0.2.0's dynamic providers (every ResourceProvider subclass it pickled into state) are all in the table."""
    mapped = {name for names in state_compat.OLD_PROVIDERS.values() for name in names}
    assert mapped == {
        "_DraPreflightProvider", "_SmokeTestVerificationProvider", "_OperatorReadinessProvider", "_NodeFenceProvider",
        "_NodeDrainProvider", "_RollbackVerificationProvider", "_GpuNodeInventoryProvider",
        "_OperandPlacementProvider", "_PendingGpuPodsProvider", "_NodePathSwitchProvider", "_CapacityGateProvider",
        "MasterVersionProvider", "WorkerReplacementProvider", "TempGpuPoolProvider"}


def test_unknown_old_names_stay_unknown():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("iks_gpu_migration.no_such_module")
    with pytest.raises(AttributeError):
        importlib.import_module("iks_gpu_migration.kube_providers").NoSuchProvider  # noqa: B018


def test_a_check_whose_only_change_is_its_pickled_code_shows_no_change():
    """After the move every check's `__provider` names a new module path; that alone must not show `~ update` for
    every check of the fleet in the first preview (the IKS providers compare named inputs only)."""
    from iks_gpu_migration.kube.fence import _NodeFenceProvider
    olds = {"node": "n1", "__provider": release_pickle("kube_providers", "_NodeFenceProvider")}
    news = {"node": "n1", "__provider": serialize_provider(_NodeFenceProvider())}
    assert not _NodeFenceProvider().diff("id", olds, news).changes
    assert _NodeFenceProvider().diff("id", olds, {**news, "node": "n2"}).changes
