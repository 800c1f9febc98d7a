"""Moved to gpu_migration_local.http_server."""
from gpu_migration_local.http_server import *  # noqa: F401,F403
from gpu_migration_local.http_server import LocalServer, encode  # noqa: F401
