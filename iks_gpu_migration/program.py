"""The Pulumi program: one function, run by the Python language host (__main__.py) and by the Automation API."""
import pulumi

from . import config, sdk_workarounds
from .components import migration


def main() -> None:
    sdk_workarounds.quiet_sdk_debug()
    sdk_workarounds.source_position_only()
    try:
        cfg = config.load()
    except config.ConfigError as e:
        # A RunError is reported as its message alone: the language hosts print other exceptions with a Python
        # traceback (pulumi/automation/_server.py LanguageServer.Run; pulumi-language-python-exec), which says
        # nothing about a stack file.
        raise pulumi.RunError(str(e)) from None
    migration.export(migration.declare(cfg))
    sdk_workarounds.start_registrations_before_waiting()
