"""The core needs only its own dependencies (numpy, rich): every optional extra
(torch, redis-py, PyYAML, matplotlib, ISA-L, vLLM) may be missing, and the
planner, the file tier's model and the Redis tier's model still run. Each case
runs in a fresh interpreter where importing those libraries fails."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import kvoffload

EXTRAS = ("torch", "redis", "yaml", "matplotlib", "isal", "vllm", "triton")
SRC = Path(kvoffload.__file__).resolve().parents[1]


def run_without_extras(code: str) -> subprocess.CompletedProcess[str]:
    blocker = "".join(f"sys.modules[{name!r}] = None\n" for name in EXTRAS)
    program = f"import sys\nsys.path.insert(0, {str(SRC)!r})\n{blocker}{code}"
    return subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_extras_are_really_blocked() -> None:
    done = run_without_extras("import redis")
    assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr


@pytest.mark.parametrize(
    "tiers",
    [(), ("--tier", "file:200"), ("--tier", "redis:200"), ("--engines", "2")],
    ids=["host", "file", "redis", "fleet"],
)
def test_the_planner_runs_without_any_extra(tiers: tuple[str, ...]) -> None:
    argv = ["replay", "--workload", "synth-chat", "--limit", "120", "--jobs", "1",
            "--capacity-chunks", "50", "--policy", "lru", "--json", *tiers]  # fmt: skip
    done = run_without_extras(
        f"from kvoffload.cli import main\nsys.exit(main({argv!r}))"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line]
    assert any(r.get("policy") == "lru" and r["prompt_chunks"] > 0 for r in records)


def test_a_redis_tier_without_redis_py_is_refused_naming_the_extra() -> None:
    done = run_without_extras(
        "from kvoffload.tiers.secondary import parse_tier_config\n"
        "try:\n"
        "    parse_tier_config({'type': 'redis', 'url': 'redis://localhost'})\n"
        "except ValueError as exc:\n"
        "    print(exc)\n"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "kvoffload[redis]" in done.stdout
