"""The bundled production trace lives in ../shared; tests that need it skip without
it. `no_replay` fails a test whose command would start replaying."""

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


@pytest.fixture
def no_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if a replay starts: bad input must stop a command before it
    runs (and a test of input that once hung then fails instead of hanging)."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the replay ran")

    monkeypatch.setattr("kvoffload.replay.cli.run_sweep", refuse)
