"""The offline bounds on hand-checked sequences."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvoffload.bench.manager import run_ours
from kvoffload.keys import make_offload_key
from kvoffload.replay import (
    ReplaySettings,
    belady,
    infinite,
    load_mooncake,
    run_replay,
)


def test_infinite_counts_leading_runs_seen_before() -> None:
    reqs = [["a", "b"], ["a", "b", "c"], ["x", "b"], ["a", "c"]]
    result = infinite(reqs)
    assert (result.hit_chunks, result.prompt_chunks) == (4, 9)


def test_belady_keeps_what_is_used_soonest_and_bypasses_the_rest() -> None:
    # Capacity 1: "a" is needed by request 2, "z" never again: "z" is bypassed.
    reqs = [["a"], ["z"], ["a"]]
    assert belady(reqs, 1).hit_chunks == 1
    # Capacity 2 holds both prefixes of the alternating pattern.
    alt = [["a"], ["b"], ["a"], ["b"], ["a"]]
    assert belady(alt, 2).hit_chunks == 3
    assert belady(alt, 1).hit_chunks == 2  # keeps "a", bypasses "b"


def test_belady_never_beats_infinite_and_grows_with_capacity() -> None:
    reqs = [[f"s{i % 3}", f"t{i % 5}", f"u{i % 7}"] for i in range(60)]
    bounds = [belady(reqs, c).hit_chunks for c in (1, 2, 4, 8, 16)]
    assert bounds == sorted(bounds)
    assert bounds[-1] <= infinite(reqs).hit_chunks


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity"):
        belady([["a"]], 0)


def _online_hits(requests: list[list[str]], policy: str, capacity: int) -> int:
    """Hit chunks of `policy` on the real manager, one request after another (the
    reference figures' sequential replay)."""
    stream = [
        (str(i), [make_offload_key(key.encode(), 0) for key in keys])
        for i, keys in enumerate(requests)
    ]
    return run_ours(stream, policy, capacity, collect=False)[0]


def test_belady_keeps_the_head_of_a_prefix_whose_chunks_are_next_used_together() -> (
    None
):
    """Scenario: a request repeats; its chunks all tie on next use, so only the
    position in the prompt tells the head (worth keeping) from the tail."""
    assert belady([["a", "b"], ["a", "b"]], 1).hit_chunks == 1
    prompt = [f"c{i}" for i in range(17)]
    assert belady([prompt, prompt], 16).hit_chunks == 16


def test_belady_is_an_upper_bound_for_lru_and_arc_on_a_repeated_long_prompt(
    tmp_path: Path,
) -> None:
    """Scenario: two identical 17-chunk prompts a minute apart, replayed through the
    engine model at 16 chunks of capacity: LRU and ARC keep the first 16 (the
    head goes in as free room allows; the tail never evicts it), as Belady does."""
    record = {
        "input_length": 17 * 512,
        "output_length": 10,
        "hash_ids": list(range(17)),
    }
    trace = tmp_path / "repeat.jsonl"
    trace.write_text(
        "".join(json.dumps({"timestamp": t, **record}) + "\n" for t in (0, 60_000))
    )
    workload = load_mooncake(trace)
    bound = belady(workload.chunk_sequence(512), 16).hit_chunks
    for policy in ("lru", "arc"):
        online = run_replay(workload, policy, 16, ReplaySettings(chunk_tokens=512))
        assert online.hit_chunks == 16
        assert bound >= online.hit_chunks, policy


def _chained(paths: list[list[int]]) -> list[list[str]]:
    """Each path as chunk keys that name their whole prefix, as chained block hashes
    (and Mooncake's ids) do: a chunk always follows the same chunks."""
    return [
        ["/".join(map(str, path[: i + 1])) for i in range(len(path))] for path in paths
    ]


@settings(max_examples=100, deadline=None)
@given(
    paths=st.lists(
        st.lists(st.integers(0, 2), min_size=1, max_size=5), min_size=1, max_size=12
    ),
    capacity=st.integers(min_value=1, max_value=6),
)
def test_belady_is_never_beaten_by_lru_or_arc(
    paths: list[list[int]], capacity: int
) -> None:
    """Random small traces of chained prompts, replayed one request at a time."""
    requests = _chained(paths)
    bound = belady(requests, capacity).hit_chunks
    for policy in ("lru", "arc"):
        assert bound >= _online_hits(requests, policy, capacity), policy
