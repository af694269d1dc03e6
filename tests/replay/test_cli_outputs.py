"""Where `kvoffload replay` reads and writes: a trace that can be read only once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvoffload.cli import main as kvoffload_main

ROOT = Path(__file__).resolve().parents[2]
LINES = [
    '{"timestamp": 0, "input_length": 1500, "output_length": 10, "hash_ids": [0, 1, 2]}',
    '{"timestamp": 1000, "input_length": 2100, "output_length": 10, '
    '"hash_ids": [0, 1, 2, 3, 4]}',
]
TRACE_TEXT = "".join(line + "\n" for line in LINES)


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.jsonl"
    path.write_text(TRACE_TEXT)
    return path


def replay(*argv: str) -> int:
    return kvoffload_main(["replay", *argv, "--capacity-chunks", "4", "--jobs", "1"])


def _kvoffload(*argv: str, **kwargs: object) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
        [sys.executable, "-m", "kvoffload.cli", *argv], env=env, **kwargs
    )


def test_a_trace_that_can_be_read_once_replays(trace: Path) -> None:
    """A pipe (`kvoffload replay <(zcat t.gz)`) was read twice with --time-scale
    auto: the second read found it empty."""
    proc = _kvoffload(
        "replay",
        "/dev/stdin",
        "--json",
        "--jobs",
        "1",
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = proc.communicate(TRACE_TEXT.encode(), timeout=120)
    assert proc.returncode == 0, err.decode()
    first = json.loads(out.decode().splitlines()[0])
    assert first["requests"] == 2
