"""Issue 10 points 10 and 11 in the declared program: each replacement carries the eviction settings, and a node's
resources keep their names when its config entry is renamed with `key`."""
import contextlib
import copy
import gc
import logging

import pytest

from harness import REPLACEMENT, RecordingMocks, run_program, stack_config
from iks_gpu_migration import config

DRA_NODE, DP_NODE = "10.240.0.11", "10.240.0.12"


def pilot() -> dict:
    return copy.deepcopy(stack_config("pilot"))


def test_every_replacement_evicts_first_with_the_stack_timeout():
    raw = pilot()
    raw["timeouts"] = {"evict": 321}
    raw["devicePluginResourceName"] = "nvidia.com/mig-1g.10gb"  # temp pool GPUs count under either name
    run = run_program(raw)
    for replacement in run.of_type(REPLACEMENT):
        evict = replacement.inputs["evict"]
        assert evict["timeout"] == 321 and "gpu_nodes" not in evict
        assert evict["gpu_resources"] == ["nvidia.com/mig-1g.10gb", "nvidia.com/gpu"]


@contextlib.contextmanager
def quiet_asyncio():
    """A failed registration under mocks leaves futures whose exception asyncio reports again on collection."""
    logger = logging.getLogger("asyncio")
    level, logger.level = logger.level, logging.CRITICAL
    try:
        yield
    finally:
        gc.collect()
        logger.setLevel(level)


class FailingOperator(RecordingMocks):
    def new_resource(self, args):
        if args.name == "gpu-operator":
            raise RuntimeError("Helm refused gpu-operator")
        return super().new_resource(args)


def test_with_a_temp_pool_eviction_waits_for_its_gpus_and_the_operator_comes_first():
    raw = pilot()
    raw["tempGpuPool"] = {"enabled": True, "flavor": "gx3.16x80.l4", "zone": "us-south-1", "vpcId": "vpc",
                          "subnetId": "subnet"}
    run = run_program(raw)
    assert run.depends(f"{DRA_NODE}-replacement", "temp-gpu-pool")
    # The operator comes first without an edge from every node (rollout.once_done): a failed install starts no batch.
    mocks = FailingOperator()
    with pytest.raises(Exception, match="Helm refused gpu-operator"), quiet_asyncio():
        run_program(raw, mocks=mocks)
    names = {r.name for r in mocks.registered}
    assert "temp-gpu-pool" in names
    assert not {f"{DRA_NODE}-gate", f"{DRA_NODE}-replacement", f"{DRA_NODE}-operator-ready"} & names
    from types import SimpleNamespace
    from iks_gpu_migration.components.migration import eviction_settings
    pool = SimpleNamespace(node_names=["10.240.9.1"])  # TempGpuPool.node_names: its ready nodes
    assert eviction_settings(config.parse(raw), pool)["gpu_nodes"] == ["10.240.9.1"]
    assert "gpu_nodes" not in eviction_settings(config.parse(raw), None)


def test_a_renamed_entry_with_its_old_name_as_key_keeps_its_resources():
    before = run_program(pilot()).names()
    raw = pilot()
    for node in raw["nodes"]:
        if node["name"] in (DRA_NODE, DP_NODE):
            node.update(key=node["name"], name=f"10.240.1.{node['name'].rsplit('.', 1)[1]}",
                        workerId=f"{node['workerId']}-new")
    run = run_program(raw)
    assert run.names() == before
    replacement = run.named(f"{DRA_NODE}-replacement").inputs
    assert (replacement["worker_id"], replacement["node_name"]) == ("kube-pilot0001-gpu-00000101-new", "10.240.1.11")


def test_timeouts_evict_and_key_are_validated():
    raw = pilot()
    raw["timeouts"] = {"evict": 0}
    with pytest.raises(config.ConfigError, match=r"gpu-migration:timeouts\.evict"):
        config.parse(raw)
    raw = pilot()
    raw["nodes"][0]["key"] = "Not_A_Name"
    with pytest.raises(config.ConfigError, match=r"nodes\[0\]\.key.*'Not_A_Name'"):
        config.parse(raw)
    raw = pilot()
    raw["nodes"][1]["key"] = raw["nodes"][0]["name"]
    with pytest.raises(config.ConfigError, match=r"duplicate node key \(or name\) '10\.240\.0\.11'"):
        config.parse(raw)
    assert config.parse(pilot()).timeouts.evict == 1800
