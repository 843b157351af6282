"""The moto-based AWS emulator used by the tests (see server.py)."""

from tests.harness.aws.server import (
    HARNESS_ACCESS_KEY,
    HPKV_ACCESS_KEY,
    SECRET_KEY,
    AwsEmulator,
    Fault,
    LoggedCall,
)

__all__ = [
    "HARNESS_ACCESS_KEY",
    "HPKV_ACCESS_KEY",
    "SECRET_KEY",
    "AwsEmulator",
    "Fault",
    "LoggedCall",
]
