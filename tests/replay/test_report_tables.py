"""Every table `kvoffload replay` prints fits 80 columns: on an 80-column terminal
they were cut off with ellipses (results, tiers, fleet summary), and report
files were written 160 and 200 columns wide. A table that cannot fit is split
into parts of whole columns, each repeating the columns that name the run."""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path

import pytest

from kvoffload.cli import main as kvoffload_main
from kvoffload.replay.tables import ReportTable, write_tables

WIDTH = 80
SMALL = ["--workload", "chat-agents", "--limit", "40", "--jobs", "1"]
# Each adds every table (and every optional column) its kind of report has.
REPORTS = {
    "single engine": [
        "--policy",
        "lru",
        "--policy",
        "arc",
        "--capacity-chunks",
        "2",
        "50000",
        "--belady",
        "--store-threshold",
        "0",
        "2",
        "--offload-prompt-only",
        "both",
        "--device-tokens",
        "40000",
        "--tier",
        "file:200000",
        "--tier",
        "redis:100GiB:2.5",
    ],
    "fleet": [
        "--engines",
        "20",  # above 16: the engines' spread, with long labels
        "--router",
        "least-loaded",
        "--router",
        "round-robin",
        "--capacity-chunks",
        "50000",
        "--tier",
        "file:200000",
        "--shared-tier",
        "redis:100000",
    ],
}


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert kvoffload_main(["replay", *SMALL, *argv]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("report", sorted(REPORTS))
def test_every_table_of_a_report_fits_80_columns_with_every_figure_whole(
    report: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", str(WIDTH))  # what a terminal of 80 reports
    argv = REPORTS[report]
    records = [json.loads(x) for x in _run([*argv, "--json"], capsys).splitlines()]
    out = _run([*argv, "--report-dir", str(tmp_path)], capsys)
    written = (tmp_path / "table.txt").read_text()
    for text in (out, written):
        too_wide = [line for line in text.splitlines() if len(line) > WIDTH]
        assert too_wide == []
        assert "…" not in text
        # Figures are never folded onto two lines nor cut: each one is whole.
        words = set(re.findall(r"[\w.,%-]+", text))
        for r in records:
            assert f"{r['hit_ratio']:.3f}" in words
            if "est_ttft_s" in r:
                assert f"{r['est_ttft_s']:.3f}" in words
    assert "tiers" in written and "bandwidth" in written  # every table, in the file


def test_the_common_reports_are_one_table_each_not_split(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    out = _run(["--policy", "lru", "--policy", "arc", "--belady"], capsys)
    out += _run(
        ["--engines", "4", "--router", "session", "--shared-tier", "redis:50000"],
        capsys,
    )
    assert "(continued)" not in out


def figure(row: int, column: int) -> int:
    return 1_000_000 + 1000 * row + column


TABLE = ReportTable(
    "wide",
    ("run", "tier", *(f"figure {i}" for i in range(12))),
    tuple(
        (f"run {r}", f"tier {r}", *(f"{figure(r, i):,}" for i in range(12)))
        for r in range(3)
    ),
    keys=2,
)


@pytest.mark.parametrize("width", [40, 60, 80, 100])
def test_a_wide_table_is_split_into_parts_that_fit_each_naming_its_rows(
    width: int,
) -> None:
    out = io.StringIO()
    write_tables(out, [TABLE], width)
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= width
    parts = TABLE.column_parts(width)
    assert [i for part in parts for i in part if i >= 2] == list(range(2, 14))
    assert all(part[:2] == [0, 1] for part in parts)
    assert text.count("(continued)") == len(parts) - 1
    for r in range(3):  # every row's label in every part, every figure once
        assert text.count(f"run {r} ") == len(parts)
        for i in range(12):
            assert len(re.findall(rf"(?<![\d,]){figure(r, i):,}(?![\d,])", text)) == 1


@pytest.mark.parametrize("width", range(40, 150, 7))
def test_a_split_takes_as_few_parts_as_fit_and_evens_them_out(width: int) -> None:
    """Greedy filling left a last part of one column beside eleven (at 138)."""
    per_part = (width - len("run 0  tier 0")) // len("  1,000,000")
    sizes = [len(part) - 2 for part in TABLE.column_parts(width)]
    assert len(sizes) == math.ceil(12 / per_part)
    assert max(sizes) - min(sizes) <= 1


def test_a_table_that_fits_is_one_part() -> None:
    assert TABLE.column_parts(TABLE.width()) == [list(range(14))]
    assert len(TABLE.column_parts(TABLE.width() - 1)) == 2


def test_a_cell_wider_than_the_width_folds_instead_of_being_cut() -> None:
    name = "my_company.kv_policies.frequency_aware:FrequencyAwarePolicy"
    table = ReportTable("t", ("policy", "hit ratio"), ((name, "0.500"),))
    out = io.StringIO()
    write_tables(out, [table], 30)
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 30
    assert "…" not in text
    assert "".join(text.replace("0.500", "").split()).count(name) == 1
