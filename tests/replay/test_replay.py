"""Replays through the real connector and manager: traces, workloads, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvoffload.cli import main as kvoffload_main
from kvoffload.policies import policy_names
from kvoffload.replay import (
    ReasoningSpec,
    ReplaySettings,
    load_mooncake,
    reasoning,
    run_replay,
)


def _write_trace(path: Path) -> Path:
    lines = [
        {
            "timestamp": 0,
            "input_length": 1500,
            "output_length": 10,
            "hash_ids": [0, 1, 2],
        },
        {
            "timestamp": 1000,
            "input_length": 2100,
            "output_length": 10,
            "hash_ids": [0, 1, 2, 3, 4],
        },
        {
            "timestamp": 2000,
            "input_length": 700,
            "output_length": 10,
            "hash_ids": [0, 9],
        },
        {
            "timestamp": 3000,
            "input_length": 2600,
            "output_length": 10,
            "hash_ids": [0, 1, 2, 3, 4, 5],
        },
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_mooncake_ids_are_chunks_and_partial_blocks_are_padded(tmp_path: Path) -> None:
    workload = load_mooncake(_write_trace(tmp_path / "t.jsonl"))
    assert [r.num_prompt_tokens for r in workload.requests] == [1537, 2561, 1025, 3073]
    result = run_replay(workload, "lru", 100, ReplaySettings(chunk_tokens=512))
    # Hits: 0, then [0,1,2], then [0], then [0..4].
    assert (result.prompt_chunks, result.hit_chunks) == (16, 9)
    dropped = load_mooncake(tmp_path / "t.jsonl", partial="drop")
    assert [r.num_prompt_tokens for r in dropped.requests] == [1500, 2100, 700, 2600]


def test_bad_trace_lines_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 5}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:1"):
        load_mooncake(path)


def test_prompt_only_writes_fewer_chunks_on_reasoning_chats() -> None:
    """Scenario: reasoning chats drop their thinking between turns; offloading decode
    chunks writes far more for no extra hits."""
    workload = reasoning(ReasoningSpec(conversations=25))
    common = {"chunk_tokens": 256}
    on = run_replay(
        workload, "lru", 400, ReplaySettings(**common, offload_prompt_only=True)
    )
    off = run_replay(
        workload, "lru", 400, ReplaySettings(**common, offload_prompt_only=False)
    )
    assert on.chunks_stored < 0.5 * off.chunks_stored
    assert on.hit_ratio >= off.hit_ratio - 0.01


def test_cli_lists_policies(capsys: pytest.CaptureFixture[str]) -> None:
    assert kvoffload_main(["replay", "--list-policies"]) == 0
    assert capsys.readouterr().out.split() == policy_names()


def test_cli_json_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _write_trace(tmp_path / "t.jsonl")
    code = kvoffload_main(
        [
            "replay",
            str(trace),
            "--policy",
            "all",
            "--capacity-chunks",
            "2",
            "50",
            "--belady",
            "--json",
            "--jobs",
            "1",
        ]
    )
    assert code == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    online = [r for r in records if r["policy"] in policy_names()]
    assert len(online) == 2 * len(policy_names())
    required = {
        "policy",
        "capacity_chunks",
        "requests",
        "prompt_chunks",
        "hit_chunks",
        "hit_ratio",
        "token_hit_ratio",
        "chunks_stored",
        "chunks_loaded",
        "chunks_evicted",
        "est_ttft_s",
    }
    assert all(required <= set(r) for r in online)
    assert {r["capacity_chunks"] for r in records if r["policy"] == "belady"} == {2, 50}
    assert all(r["hit_chunks"] == 9 for r in online if r["capacity_chunks"] == 50)


def test_cli_report_dir_writes_table_json_and_plot(tmp_path: Path) -> None:
    trace = _write_trace(tmp_path / "t.jsonl")
    out = tmp_path / "report"
    assert (
        kvoffload_main(
            [
                "replay",
                str(trace),
                "--capacity-chunks",
                "4",
                "--report-dir",
                str(out),
                "--jobs",
                "1",
            ]
        )
        == 0
    )
    assert (out / "results.jsonl").read_text().count("\n") == 2
    assert "lru" in (out / "table.txt").read_text()
    assert (out / "hit_ratio.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_rejects_a_chunk_size_that_is_not_a_block_multiple(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _write_trace(tmp_path / "t.jsonl")
    with pytest.raises(SystemExit) as stopped:
        kvoffload_main(["replay", str(trace), "--chunk-tokens", "100", "--jobs", "1"])
    assert stopped.value.code == 2
    assert "--chunk-tokens 100 must be a positive multiple" in capsys.readouterr().err


def test_a_loaded_request_with_nothing_running_waits_for_delayed_decodes(
    tmp_path: Path,
) -> None:
    """Scenario (the engine model raised IndexError here): on a device of 8 blocks,
    A stores its 3 chunks and finishes; B holds 5 blocks through a long decode off
    the step loop; C repeats A's prompt and loads from the host what the device lost
    of it, but its last block does not fit while nothing is running: C waits for
    B's memory."""
    records = [
        (0, 1536, 1, [1, 2, 3]),
        (5000, 2048, 500, [11, 12, 13, 14]),
        (5001, 512, 1, [21]),
        (6000, 1536, 1, [1, 2, 3]),
    ]
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "".join(
            json.dumps(
                {"timestamp": t, "input_length": n, "output_length": o, "hash_ids": ids}
            )
            + "\n"
            for t, n, o, ids in records
        )
    )
    result = run_replay(
        load_mooncake(trace),
        "lru",
        100,
        ReplaySettings(chunk_tokens=512, device_tokens=4096),
    )
    assert result.requests == 4
    # C's prompt: what the device lost of A's is loaded from the host.
    assert (result.device_hit_chunks, result.hit_chunks) == (1, 2)


def test_token_hit_ratio_counts_a_padded_hit_only_up_to_the_true_prompt(
    tmp_path: Path,
) -> None:
    """Scenario: the same 600-token prompt twice, its last id a partial block padded
    to 512 tokens; the second request hits both chunks, 600 true tokens of 1,200."""
    record = {"input_length": 600, "output_length": 10, "hash_ids": [7, 8]}
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "".join(json.dumps({"timestamp": t, **record}) + "\n" for t in (0, 60_000))
    )
    result = run_replay(load_mooncake(trace), "lru", 100, ReplaySettings(512))
    assert result.hit_ratio == 0.5
    assert result.token_hit_ratio == 0.5


def test_p90_ttft_of_two_requests_is_the_slower_one(tmp_path: Path) -> None:
    """Scenario: a cold 17-chunk prompt, then the same prompt a minute later, which
    loads from the host and starts sooner: the 90th percentile (nearest rank) of two
    TTFTs is the larger, the cold one's."""
    record = {
        "input_length": 17 * 512,
        "output_length": 10,
        "hash_ids": list(range(17)),
    }
    settings = ReplaySettings(chunk_tokens=512)
    first, both = tmp_path / "first.jsonl", tmp_path / "both.jsonl"
    first.write_text(json.dumps({"timestamp": 0, **record}) + "\n")
    both.write_text(
        "".join(json.dumps({"timestamp": t, **record}) + "\n" for t in (0, 60_000))
    )
    cold = run_replay(load_mooncake(first), "lru", 100, settings).est_ttft_s
    result = run_replay(load_mooncake(both), "lru", 100, settings)
    assert result.est_ttft_s < cold
    assert result.p90_ttft_s == pytest.approx(cold)


def test_a_device_cache_smaller_than_the_longest_request_is_refused(
    tmp_path: Path,
) -> None:
    """Scenario: with --device-tokens below one request's prompt and output, that
    request waited for room forever and the replay never ended."""
    workload = load_mooncake(_write_trace(tmp_path / "t.jsonl"))
    longest = max(
        r.num_prompt_tokens + r.num_output_tokens - 1 for r in workload.requests
    )
    with pytest.raises(ValueError, match="--device-tokens 2,048 cannot hold"):
        ReplaySettings(512, device_tokens=2048).validate(workload)
    ReplaySettings(512, device_tokens=-(-longest // 512) * 512).validate(workload)
