"""The Pulumi program: one function, run by the Python language host (__main__.py) and by the Automation API."""
from . import config, sdk_workarounds
from .components import migration


def main() -> None:
    sdk_workarounds.quiet_sdk_debug()
    sdk_workarounds.one_frame_stack_traces()
    migration.export(migration.declare(config.load()))
    sdk_workarounds.start_registrations_before_waiting()
