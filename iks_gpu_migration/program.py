"""The Pulumi program: one function, run by the Python language host (__main__.py) and by the Automation API."""
from . import config, migration


def main() -> None:
    migration.export(migration.declare(config.load()))
