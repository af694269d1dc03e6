"""The tiers benchmark runs end to end on a tiny workload and prints its rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvoffload.bench import tiers


@pytest.mark.parametrize("extra", [[], ["--empty", "--page-cache"]])
def test_file_rows_for_each_direction_with_both_baselines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str]
) -> None:
    argv = ["--sizes", "64,128", "--total-mib", "1", "--repeats", "2"]
    argv += ["--redis-mib", "0", "--dir", str(tmp_path), "--json", *extra]
    assert tiers.main(argv) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["chunk_kib"], r["direction"]) for r in rows] == [
        (64, "write"),
        (64, "read"),
        (128, "write"),
        (128, "read"),
    ]
    for r in rows:
        assert r["gbps"] > 0 and r["plain_gbps"] > 0 and r["per_file_gbps"] > 0
        assert r["ratio_min"] <= r["ratio"] <= r["ratio_max"]
    assert list(tmp_path.iterdir()) == []  # everything it wrote is gone
