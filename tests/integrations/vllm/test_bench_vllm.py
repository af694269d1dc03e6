"""Smoke test of `python -m kvoffload.bench vllm` on the tiny model.

A tiny workload (three conversations of two turns on a four-block device cache)
through all three configurations: the benchmark must report identical outputs and
tokens loaded by kvoffload. Timings are not checked.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvoffload.integrations.vllm.model_builder import BuiltModel

pytestmark = pytest.mark.vllm


def test_bench_reports_identical_outputs_and_loaded_tokens(
    tiny_model: BuiltModel,
    vllm_in_process: None,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    from kvoffload.bench import vllm as bench

    code = bench.main(
        [
            "--json",
            "--model=tiny",
            "--conversations=3",
            "--turns=2",
            "--first-tokens=260",
            "--message-tokens=32",
            "--answer-tokens=8",
            "--device-blocks=4",
            "--tiered-host-chunks=4",
            f"--file-dir={tmp_path / 'kv'}",
        ]
    )
    out = capsys.readouterr().out
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [row["config"] for row in rows] == list(bench.CONFIGS)
    for row in rows:
        assert row["turns"] == 6
        assert row["outputs_identical"], row
    assert code == 0
    assert rows[0]["loaded_tokens"] == 0
    for row in rows[1:]:
        assert row["loaded_tokens"] > 0, row
    assert any((tmp_path / "kv").rglob("*.kvc")), "the file tier wrote chunk files"
