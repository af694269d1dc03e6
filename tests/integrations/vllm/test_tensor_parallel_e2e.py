"""kvoffload inside real vLLM with two tensor-parallel ranks (CPU platform).

Each rank is a worker process with its threads bound to one CPU; both ranks fill
their own host pool with their slice of every chunk, and a file-tier chunk holds
both slices. The engines run in subprocesses (`tp_engine.py`). A's first run in
the first engine loads nothing, so its output is the reference: a rank given the
other's slice, or a stale one, answers differently.
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


def run_engine(tp: int, directory: Path, evict: bool) -> list[dict[str, Any]]:
    """Runs `tp_engine.py`; each run of A's cached tokens and output."""
    cpus = sorted(os.sched_getaffinity(0))[:tp]
    env = dict(os.environ)
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # vLLM's default: on
    env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(map(str, cpus))
    done = subprocess.run(
        [sys.executable, str(ENGINE), str(tp), str(directory), "1" if evict else "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    assert done.returncode == 0 and lines, (
        f"tp_engine.py {tp} exited {done.returncode}:\n{done.stderr[-4000:]}"
    )
    report: list[dict[str, Any]] = json.loads(lines[-1].removeprefix("RESULT "))
    return report


@pytest.fixture(scope="module")
def model() -> BuiltModel:
    pytest.importorskip("vllm", reason=VLLM_MISSING)
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("two tensor-parallel ranks need two CPUs to bind")
    return build_model(TINY)  # built (or found cached) before the engines start


@pytest.fixture(scope="module")
def first_engine(
    model: BuiltModel, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, list[dict[str, Any]]]:
    """Two ranks, host memory and a file tier: A, fillers, A."""
    directory = tmp_path_factory.mktemp("tp") / "kv"
    return directory, run_engine(2, directory, evict=True)


def test_two_ranks_load_an_evicted_prefix_from_host_memory(
    first_engine: tuple[Path, list[dict[str, Any]]],
) -> None:
    _, (first, again) = first_engine
    assert first["cached"] == 0
    assert again["cached"] == 2 * BLOCK
    assert again["tokens"] == first["tokens"]


def test_a_restarted_two_rank_engine_loads_both_slices_from_disk(
    first_engine: tuple[Path, list[dict[str, Any]]],
) -> None:
    directory, (reference, _) = first_engine
    assert any(directory.rglob("*.kvc")), "chunk files were written"
    (again,) = run_engine(2, directory, evict=False)
    assert again["cached"] == 2 * BLOCK
    assert again["tokens"] == reference["tokens"]


def test_a_single_rank_engine_does_not_read_two_rank_chunks(
    first_engine: tuple[Path, list[dict[str, Any]]],
) -> None:
    directory, _ = first_engine
    assert any(directory.rglob("*.kvc")), "chunk files were written"
    (alone,) = run_engine(1, directory, evict=False)
    assert alone["cached"] == 0, "chunks of another parallel layout were loaded"
