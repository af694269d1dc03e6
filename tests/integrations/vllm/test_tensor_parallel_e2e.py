"""kvoffload inside real vLLM with two tensor-parallel ranks (CPU platform).

Each rank is a worker process with its threads bound to one CPU; both ranks fill
their own host pool with their slice of every chunk, and a file-tier chunk holds
both slices. The engines run one after another in one subprocess
(`tp_engine.py`), once for the module; each test checks one engine's part of its
report. A's first run in the first engine loads nothing, so its output is the
reference: a rank given the other's slice, or a stale one, answers differently.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvoffload.integrations.vllm.model_builder import TINY, BuiltModel, build_model

from .conftest import VLLM_MISSING

pytestmark = pytest.mark.vllm

BLOCK = 128
ENGINE = Path(__file__).with_name("tp_engine.py")


def run_engines(directory: Path) -> dict[str, Any]:
    """Runs `tp_engine.py` (three engines, one after another, on `directory`);
    each engine's runs of A, its cached tokens and output."""
    env = dict(os.environ)
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the script sets it per engine
    done = subprocess.run(
        [sys.executable, str(ENGINE), str(directory)],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    assert done.returncode == 0 and lines, (
        f"tp_engine.py exited {done.returncode}:\n{done.stderr[-4000:]}"
    )
    report: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    return report


@pytest.fixture(scope="module")
def model() -> BuiltModel:
    pytest.importorskip("vllm", reason=VLLM_MISSING)
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two tensor-parallel ranks need two CPUs to bind")
    return build_model(TINY)  # built (or found cached) before the engines start


@pytest.fixture(scope="module")
def engines(
    model: BuiltModel, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """The report of `tp_engine.py`'s three engines, run once for the module."""
    return run_engines(tmp_path_factory.mktemp("tp") / "kv")


def test_two_ranks_load_an_evicted_prefix_from_host_memory(
    engines: dict[str, Any],
) -> None:
    first, again = engines["first"]
    assert first["cached"] == 0
    assert again["cached"] == 2 * BLOCK
    assert again["tokens"] == first["tokens"]


def test_a_restarted_two_rank_engine_loads_both_slices_from_disk(
    engines: dict[str, Any],
) -> None:
    reference, _ = engines["first"]
    assert engines["chunk_files_after_first"] > 0, "chunk files were written"
    (again,) = engines["restarted"]
    assert again["cached"] == 2 * BLOCK
    assert again["tokens"] == reference["tokens"]


def test_a_single_rank_engine_does_not_read_two_rank_chunks(
    engines: dict[str, Any],
) -> None:
    assert engines["chunk_files_after_first"] > 0, "chunk files were written"
    (alone,) = engines["single"]
    assert alone["cached"] == 0, "chunks of another parallel layout were loaded"
