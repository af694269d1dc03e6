"""The bundled production trace lives in ../shared; tests that need it skip without it."""

from __future__ import annotations

from pathlib import Path

import pytest

TRACE = (
    Path(__file__).resolve().parents[3]
    / "shared"
    / "traces"
    / "mooncake_fast25_conversation_trace.jsonl"
)


@pytest.fixture(scope="session")
def bundled_trace() -> Path:
    if not TRACE.exists():
        pytest.skip(f"the bundled trace is not at {TRACE} (../shared is absent)")
    return TRACE
