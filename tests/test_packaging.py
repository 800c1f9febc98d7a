"""What an installed (not editable) package holds: every subpackage, and the data files the program reads at run
time (the shipped RBAC manifests, rbac/*.yaml, which `up` checks the cluster against; the local charts)."""
import pathlib
import tomllib

import setuptools

ROOT = pathlib.Path(__file__).resolve().parents[1]


def setuptools_config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_subpackage_is_packaged():
    found = set(setuptools.find_packages(where=ROOT, include=setuptools_config()["packages"]["find"]["include"]))
    wanted = {".".join(p.parent.relative_to(ROOT).parts) for top in ("iks_gpu_migration", "gpu_migration_local")
              for p in (ROOT / top).rglob("__init__.py")}
    assert wanted <= found and {"iks_gpu_migration.kube", "iks_gpu_migration.iks"} <= found, wanted - found


def test_the_rbac_manifests_are_package_data():
    patterns = setuptools_config()["package-data"]["iks_gpu_migration"]
    packaged = {p for pattern in patterns for p in (ROOT / "iks_gpu_migration").glob(pattern)}
    assert {p.name for p in packaged} == {"gpu-migration.yaml", "gpu-migration-status.yaml",
                                          "gpu-migration-charts.yaml"}
