"""The offline bounds on hand-checked sequences."""

from __future__ import annotations

import pytest

from kvoffload.replay import belady, infinite


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
