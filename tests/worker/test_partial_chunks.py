"""Jobs that start or end inside a chunk (`blocks_per_chunk` > 1)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvoffload.worker.layout import GroupSpec

from .kv_layouts import GROUPS, LAYOUTS, block_bytes, make_caches, scramble
from .support import LOAD, STORE, chunk_blocks, data_plane, run_job

BPC = 4
LAYOUT = LAYOUTS[0]
GROUP = GROUPS[0]


def _caches() -> dict[str, tuple[torch.Tensor, ...]]:
    return make_caches(LAYOUT, torch.float16, torch.device("cpu"), (GROUP,))


def _spec() -> list[GroupSpec]:
    return [GroupSpec(GROUP.group, GROUP.layers, GROUP.num_blocks, BPC)]


def test_load_starting_mid_chunk_and_crossing_into_the_next() -> None:
    """Scenario: chunks in slots 3 and 1 are stored whole; a load takes the last
    three blocks of the first and the first two of the second, as a request
    whose engine hit ends inside a chunk would."""
    torch.manual_seed(0)
    caches = _caches()
    sources = list(range(8))
    hosts = chunk_blocks([3, 1], BPC)
    with data_plane(caches, _spec(), num_slots=4) as (_, worker):
        stored = [block_bytes(LAYOUT, caches, GROUP, b) for b in sources]
        assert run_job(worker, 1, STORE, (0, sources, hosts)).success
        scramble(caches)
        targets = [11, 4, 9, 0, 6]
        result = run_job(worker, 2, LOAD, (0, targets, hosts[1:6]))
    assert result.success
    assert result.num_bytes == 5 * stored[0].numel()
    for target, index in zip(targets, range(1, 6), strict=True):
        assert torch.equal(block_bytes(LAYOUT, caches, GROUP, target), stored[index])


def test_store_ending_mid_chunk_keeps_the_rest_of_the_slot() -> None:
    """Scenario: a whole chunk is stored, then a second store rewrites only its
    first two blocks; loading the chunk gives the new two and the old two."""
    torch.manual_seed(1)
    caches = _caches()
    with data_plane(caches, _spec(), num_slots=2) as (_, worker):
        first = [block_bytes(LAYOUT, caches, GROUP, b) for b in (0, 1, 2, 3)]
        second = [block_bytes(LAYOUT, caches, GROUP, b) for b in (7, 8)]
        assert run_job(worker, 1, STORE, (0, [0, 1, 2, 3], [4, 5, 6, 7])).success
        assert run_job(worker, 2, STORE, (0, [7, 8], [4, 5])).success
        scramble(caches)
        assert run_job(worker, 3, LOAD, (0, [10, 11, 2, 3], [4, 5, 6, 7])).success
    loaded = [block_bytes(LAYOUT, caches, GROUP, b) for b in (10, 11, 2, 3)]
    for got, want in zip(loaded, [*second, *first[2:]], strict=True):
        assert torch.equal(got, want)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, GROUP.num_blocks - 1), st.integers(0, 3 * BPC - 1)),
        min_size=1,
        max_size=GROUP.num_blocks,
        unique_by=(lambda p: p[0], lambda p: p[1]),
    )
)
def test_any_pairing_of_engine_and_host_blocks_round_trips(
    pairs: list[tuple[int, int]],
) -> None:
    """Any order of engine blocks against any host blocks, gaps and mid-chunk
    starts included, stores and loads back the same bytes."""
    caches = _caches()
    engine = [e for e, _ in pairs]
    hosts = [h for _, h in pairs]
    with data_plane(caches, _spec(), num_slots=3) as (_, worker):
        stored = [block_bytes(LAYOUT, caches, GROUP, b) for b in engine]
        assert run_job(worker, 1, STORE, (0, engine, hosts)).success
        scramble(caches)
        targets = engine[::-1]
        assert run_job(worker, 2, LOAD, (0, targets, hosts)).success
    for target, want in zip(targets, stored, strict=True):
        assert torch.equal(block_bytes(LAYOUT, caches, GROUP, target), want)
