"""The Pulumi program: one function, run by the Python language host (__main__.py) and by the Automation API."""
from . import config, migration, sdk_scaling


def main() -> None:
    sdk_scaling.quiet_sdk_debug()
    migration.export(migration.declare(config.load()))
    sdk_scaling.start_registrations_before_waiting()
