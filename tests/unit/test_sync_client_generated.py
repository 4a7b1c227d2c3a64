"""The SDK's blocking client is generated from the async one: the checked-in copy must be
what scripts/gen_sync_client.py writes now."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_sync_client_is_up_to_date() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_sync_client.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_sync_and_async_clients_have_the_same_methods() -> None:
    from clients import AsyncRMClient, RMClient

    def public(cls: type) -> set[str]:
        return {name for name in dir(cls) if not name.startswith("_")}

    assert public(RMClient) == public(AsyncRMClient)
