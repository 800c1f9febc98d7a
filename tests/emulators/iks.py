"""Moved to gpu_migration_local.iks_emulator (the local demo uses it too)."""
from gpu_migration_local.iks_emulator import *  # noqa: F401,F403
from gpu_migration_local.iks_emulator import Error, IksEmulator  # noqa: F401
