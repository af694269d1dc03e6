"""Chunk and slot sizes from a per-group description, without tensors."""

from __future__ import annotations

import pytest

from kvoffload.worker.geometry import GroupGeometry, PoolGeometry

FULL = GroupGeometry(
    group=0, num_layers=32, layer_block_nbytes=65536, blocks_per_chunk=4
)
WINDOW = GroupGeometry(
    group=1, num_layers=8, layer_block_nbytes=32768, blocks_per_chunk=16
)


def test_chunk_bytes_are_layers_times_block_bytes_times_blocks_per_chunk() -> None:
    assert FULL.block_nbytes == 32 * 65536
    assert FULL.chunk_nbytes == 32 * 65536 * 4
    assert WINDOW.chunk_nbytes == 8 * 32768 * 16


def test_slot_is_the_largest_chunk_of_any_group() -> None:
    geometry = PoolGeometry.of([WINDOW, FULL])
    assert geometry.slot_nbytes == max(FULL.chunk_nbytes, WINDOW.chunk_nbytes)
    assert geometry.chunk_nbytes(1) == WINDOW.chunk_nbytes
    assert [g.group for g in geometry.groups] == [0, 1]


def test_budget_buys_whole_slots() -> None:
    geometry = PoolGeometry.of([FULL])
    slot = geometry.slot_nbytes
    assert geometry.num_slots_for(10 * slot + slot - 1) == 10
    assert geometry.num_slots_for(slot) == 1


def test_budget_below_one_slot_is_an_error_naming_the_setting() -> None:
    geometry = PoolGeometry.of([FULL])
    with pytest.raises(ValueError, match="cpu_bytes_to_use"):
        geometry.num_slots_for(geometry.slot_nbytes - 1)


def test_ranks_share_the_budget_with_the_same_slots_each() -> None:
    """The budget is the engine's total: each of 2 ranks' pools gets the whole
    slots of half of it, the same number on both."""
    geometry = PoolGeometry.of([FULL])
    slot = geometry.slot_nbytes
    assert geometry.num_slots_for(10 * slot, ranks=2) == 5
    assert geometry.num_slots_for(11 * slot, ranks=2) == 5
    assert geometry.num_slots_for(10 * slot, ranks=1) == 10


def test_budget_below_one_slot_on_every_rank_is_an_error_naming_it() -> None:
    geometry = PoolGeometry.of([FULL])
    slot = geometry.slot_nbytes
    with pytest.raises(
        ValueError,
        match=rf"cpu_bytes_to_use: {2 * slot - 1} bytes is smaller than one chunk "
        rf"slot on each of 2 ranks \({2 * slot} bytes\)",
    ):
        geometry.num_slots_for(2 * slot - 1, ranks=2)


def test_unknown_group_is_a_key_error() -> None:
    with pytest.raises(KeyError, match="group 5"):
        PoolGeometry.of([FULL]).chunk_nbytes(5)


@pytest.mark.parametrize(
    "groups",
    [[], [FULL, FULL]],
    ids=["empty", "duplicate"],
)
def test_pool_geometry_rejects_empty_or_duplicate_groups(
    groups: list[GroupGeometry],
) -> None:
    with pytest.raises(ValueError, match="group"):
        PoolGeometry.of(groups)


@pytest.mark.parametrize(
    "field", ["num_layers", "layer_block_nbytes", "blocks_per_chunk"]
)
def test_group_geometry_rejects_non_positive_sizes(field: str) -> None:
    values = {
        "group": 0,
        "num_layers": 1,
        "layer_block_nbytes": 1,
        "blocks_per_chunk": 1,
    }
    values[field] = 0
    with pytest.raises(ValueError, match=field):
        GroupGeometry(**values)
