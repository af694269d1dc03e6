"""The benchmarks run end to end on small inputs (numbers are not checked: speed is
measured by running them, see docs/benchmarks.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvoffload.bench.__main__ import main as bench_main


def _trace(path: Path) -> Path:
    lines = [
        {
            "timestamp": i * 100,
            "input_length": 512 * (2 + i % 3),
            "output_length": 4,
            "hash_ids": [0, *range(10 * i + 1, 10 * i + 2 + i % 3)],
        }
        for i in range(40)
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_manager_benchmark_reports_every_policy_and_equal_lru_hits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _trace(tmp_path / "t.jsonl")
    code = bench_main(
        [
            "manager",
            "--trace",
            str(trace),
            "--capacity",
            "8",
            "--repeat",
            "3",
            "--policy",
            "lru",
            "--policy",
            "split",
            "--json",
        ]
    )
    assert code == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    ours = {r["policy"]: r for r in records if r["implementation"] == "kvoffload"}
    assert set(ours) == {"lru", "split"}
    assert ours["lru"]["time_vs_lru"] == pytest.approx(1.0)
    assert ours["lru"]["time_vs_lru_rounds"] == pytest.approx([1.0, 1.0, 1.0])
    median, low, high = ours["split"]["time_vs_lru_rounds"]
    assert 0 < low <= median <= high
    theirs = [r for r in records if r["implementation"] == "vllm"]
    if theirs:  # vLLM installed: same operation stream, same hits for LRU
        assert theirs[0]["hit_chunks"] == ours["lru"]["hit_chunks"]


def test_manager_benchmark_with_hints_times_each_policy_against_itself(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _trace(tmp_path / "t.jsonl")
    argv = ["manager", "--trace", str(trace), "--capacity", "8", "--repeat", "2",
            "--policy", "lru", "--policy", "arc", "--hints", "all:60", "--json"]  # fmt: skip
    assert bench_main(argv) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    hinted = {r["policy"]: r for r in records if r["implementation"] == "+hints"}
    assert set(hinted) == {"lru", "arc"}
    for record in hinted.values():
        assert record["hints"] == "all:60"
        median, low, high = record["time_vs_no_hints_rounds"]
        assert 0 < low <= median <= high
    plain = [r for r in records if r["implementation"] == "kvoffload"]
    assert plain and all("hints" not in r for r in plain)


def test_manager_benchmark_floor_runs_the_bare_classes_beside_the_product(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--floor` adds the bare classes (`bench.hint_floor`), timed against the
    same policy without hints; without `--hints` it is a usage error."""
    trace = _trace(tmp_path / "t.jsonl")
    argv = ["manager", "--trace", str(trace), "--capacity", "8", "--repeat", "2",
            "--policy", "lru", "--hints", "session:300", "--floor", "--json"]  # fmt: skip
    assert bench_main(argv) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    floor = [r for r in records if r["implementation"] == "+floor"]
    assert len(floor) == 1 and floor[0]["hints"] == "session:300"
    median, low, high = floor[0]["time_vs_no_hints_rounds"]
    assert 0 < low <= median <= high
    with pytest.raises(SystemExit) as raised:
        bench_main([*argv[:-4], "--floor"])
    assert raised.value.code == 2
    assert "--floor needs --hints" in capsys.readouterr().err


def test_unknown_benchmark_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main(["nope"]) == 2
    assert "usage" in capsys.readouterr().out


def test_replay_benchmark_reports_requests_per_second(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _trace(tmp_path / "t.jsonl")
    assert (
        bench_main(["replay", "--trace", str(trace), "--capacity", "8", "--json"]) == 0
    )
    record = json.loads(capsys.readouterr().out)
    assert record["requests"] == 40
    assert (
        record["replay_requests_per_s"] > 0
        and record["manager_only_requests_per_s"] > 0
    )


def test_policies_benchmark_margins_are_against_the_best_baseline(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = bench_main(
        [
            "policies",
            "--workload",
            "rag-steep-popularity",
            "--requests",
            "300",
            "--policy",
            "split",
            "--policy",
            "lru",
            "--baseline",
            "lru",
            "--baseline",
            "arc",
            "--json",
        ]
    )
    assert code == 0
    *points, split_summary, lru_summary = [
        json.loads(line) for line in capsys.readouterr().out.splitlines()
    ]
    assert len(points) == 5
    capacities = [p["capacity"] for p in points]
    assert capacities == sorted(capacities) and capacities[0] >= 64
    for p in points:
        ratios, margins = p["hit_ratio"], p["margin_vs_best_baseline"]
        assert set(ratios) == {"lru", "arc", "split"}
        assert all(0.0 <= r <= 1.0 for r in ratios.values())
        best = max(ratios["lru"], ratios["arc"])
        assert margins["split"] == pytest.approx(ratios["split"] - best)
        assert margins["lru"] == pytest.approx(ratios["lru"] - best)
    assert ratios["lru"] > 0, "the largest capacity hits something"
    assert split_summary["worst_margin"] == pytest.approx(
        min(p["margin_vs_best_baseline"]["split"] for p in points)
    )
    assert lru_summary["points_below_margin"] == sum(
        p["margin_vs_best_baseline"]["lru"] < -0.005 for p in points
    )


def test_reuse_guard_benchmark_times_every_case_with_and_without_the_guard(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = bench_main(
        [
            "reuse_guard",
            "--requests",
            "4",
            "--steps",
            "32",
            "--prompt",
            "1024",
            "2048",
            "--window",
            "256",
            "--rounds",
            "2",
            "--json",
        ]
    )
    assert code == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["case"] for r in records] == [
        "stored",
        "put-off",
        "hybrid",
        "hybrid-put-off",
    ]
    for r in records:
        groups = 2 if r["case"].startswith("hybrid") else 1
        # 32 decode steps: each of the 4 requests begins 2 blocks in every group.
        assert r["fresh_blocks_per_step"] == pytest.approx(4 * 2 * groups / 32)
        assert r["build_us"] > 0 and r["build_us_no_guard"] > 0
        assert r["step_us"] >= r["build_us"]
        assert r["build_ratio"] == pytest.approx(r["build_us"] / r["build_us_no_guard"])


def test_gpu_benchmark_without_cuda_says_so_and_writes_its_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the GPU benchmark would run for real")
    out = tmp_path / "gpu.json"
    assert bench_main(["gpu", "--json", str(out), "--sizes", "256,1024"]) == 0
    assert "no CUDA device" in capsys.readouterr().out
    record = json.loads(out.read_text())
    assert record["bench"] == "gpu" and record["cuda"] is False
    assert record["args"]["sizes"] == [256, 1024]


@pytest.mark.parametrize(
    "bad",
    [["--sizes", "256,x"], ["--sizes", "0"], ["--rounds", "-1"], ["--skip", "all"]],
)
def test_gpu_benchmark_refuses_bad_arguments(
    bad: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        bench_main(["gpu", *bad])
    assert exit_.value.code == 2
    assert "error" in capsys.readouterr().err


def test_rounds_benchmark_counts_points_below_vllm_over_every_order(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from kvoffload.bench.rounds import below_vllm

    # random:1-2 runs both seeds; the totals cover every order and host size.
    argv = ["rounds", "--order", "random:1-2", "--order", "bursts:2", "--json"]
    assert bench_main([*argv, "--chunks", "10", "28"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    *records, summary = lines
    assert [r["order"] for r in records] == ["random:1", "random:2", "bursts:2"]
    assert summary["orders"] == 3 and summary["points"] == 6
    for name in ("kvoffload lru", "kvoffload arc", "kvoffload split"):
        per_order = [sum(r["later_turn_hit_tokens"][name]) for r in records]
        assert summary["sums"][name] == sum(per_order) > 0
    counted: dict[str, int] = {}
    for record in records:
        for policy, where in below_vllm(record["later_turn_hit_tokens"]).items():
            counted[policy] = counted.get(policy, 0) + len(where)
    assert summary["below_vllm"] == counted


def test_rounds_benchmark_takes_the_peer_tools_sizes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The sizes peer_vllm passes to its workers reach the engine model: with 2
    conversations, 200-token messages and 12 device blocks the engine serves
    most of each turn, and the tier's hits follow from the chunk where each
    prompt ended (issue 22); at 8 blocks the engine keeps less and the tier
    serves more."""
    sizes = ["--conversations", "2", "--turns", "4", "--first-tokens", "256"]
    sizes += ["--message-tokens", "200", "--chunks", "8", "--json"]
    got = {}
    for blocks in ("8", "12"):
        assert bench_main(["rounds", *sizes, "--device-blocks", blocks]) == 0
        record = json.loads(capsys.readouterr().out.splitlines()[0])
        got[blocks] = record["later_turn_hit_tokens"]["kvoffload lru"][0]
    assert got["12"] == 128 and got["8"] > got["12"]


def test_rounds_benchmark_grid_runs_the_drawn_configurations(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--grid 1` runs the first drawn configuration at its ten host sizes, in
    round-robin order, and names its sizes; the same seed draws the same one."""
    from kvoffload.bench.rounds_grid import grid_cases

    assert bench_main(["rounds", "--grid", "1", "--json"]) == 0
    record, summary = map(json.loads, capsys.readouterr().out.splitlines())
    case = grid_cases(1)[0]
    assert record["sizes"] == case.label() and record["order"] == "round-robin"
    assert record["chunks"] == list(case.chunks) and len(case.chunks) == 10
    assert summary["orders"] == 1 and summary["points"] == 10
    assert grid_cases(3) == grid_cases(3) and grid_cases(3)[0] == case
    assert grid_cases(3, seed=8) != grid_cases(3)


def test_rounds_benchmark_below_vllm_compares_split_with_the_better_peer() -> None:
    from kvoffload.bench.rounds import below_vllm

    rows = {
        "kvoffload lru": [5, 5],
        "kvoffload arc": [5, 1],
        "kvoffload split": [6, 6],
        "vLLM lru": [6, 4],
        "vLLM arc": [2, 7],
    }
    assert below_vllm(rows) == {"lru": [0], "arc": [1], "split": [1]}
    assert below_vllm({"kvoffload lru": [1]}) == {}


@pytest.mark.parametrize("order", ["random:3-1", "random:a-2", "zigzag"])
def test_rounds_benchmark_refuses_a_bad_order(
    order: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        bench_main(["rounds", "--order", order])
    assert exc.value.code == 2
    assert order in capsys.readouterr().err


def test_rounds_benchmark_refuses_a_negative_grid(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        bench_main(["rounds", "--grid", "-1"])
    assert exc.value.code == 2
    assert "--grid" in capsys.readouterr().err


def test_rounds_grid_draws_for_the_answer_length_given() -> None:
    """Longer answers make longer prompts: every configuration drawn for them
    still fits the device with its last answer, as vLLM's max_model_len needs,
    and the default draws the documented grids."""
    from kvoffload.bench.rounds_grid import ANSWER_TOKENS, BLOCK_TOKENS, grid_cases
    from kvoffload.replay.chat_rounds import ChatRounds

    assert grid_cases(5, answer_tokens=ANSWER_TOKENS) == grid_cases(5)
    for case in grid_cases(20, seed=9, answer_tokens=200):
        rounds = ChatRounds(
            conversations=case.conversations,
            turns=case.turns,
            first_tokens=case.first_tokens,
            message_tokens=case.message_tokens,
            answer_tokens=200,
        )
        longest = max(t.prompt_tokens + t.answer_tokens for t in rounds.requests())
        assert longest <= case.device_blocks * BLOCK_TOKENS


def test_rounds_benchmark_refuses_answers_no_grid_fits(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        bench_main(["rounds", "--grid", "2", "--answer-tokens", "5000"])
    assert exc.value.code == 2
    assert "5000" in capsys.readouterr().err
