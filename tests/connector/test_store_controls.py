"""What gets stored: max_offload_tokens, offload_prompt_only, policies, groups."""

from __future__ import annotations

import logging

import pytest

from kvoffload import CPUOffloadingManager, ReqContext, chunk_keys, offload_key_group
from kvoffload.connector import ConnectorConfig, GroupSpec, OffloadConnector
from kvoffload.engine_model import SimRequest
from kvoffload.tiering import TieringManager
from kvoffload.tiers.base import OffloadPolicy, RequestOffloadingContext
from kvoffload.tiers.secondary import ArrayChunkBuffer, MemoryTier, MemoryTierConfig

from .conftest import Harness

CHUNK = 12  # engine blocks of 4 tokens, 3 blocks per chunk


@pytest.mark.parametrize(
    ("value", "chunks", "warns"),
    [
        (None, 5, False),
        ("128", 5, True),
        (12.0, 5, True),
        (-1, 5, True),
        (True, 5, True),
        (False, 5, True),
        (0, 0, False),
        (30, 2, False),
        (60, 5, False),
        (1000, 5, False),
    ],
)
def test_max_offload_tokens(
    async_scheduling: bool,
    value: object,
    chunks: int,
    warns: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Scenario: a 60-token prompt (5 chunks) with max_offload_tokens=value."""
    h = Harness(async_scheduling=async_scheduling)
    params = {} if value is None else {"max_offload_tokens": value}
    with caplog.at_level(logging.WARNING):
        h.run(h.request("req-x", h.tokens(5 * CHUNK), params=params))
    assert len(h.manager.offered.get("req-x", [])) == chunks
    assert len(h.manager.stored) == chunks
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == (1 if warns else 0)
    if warns:
        assert "req-x" in warnings[0] and repr(value) in warnings[0]


@pytest.mark.parametrize("params", ["max_offload_tokens=12", ["max_offload_tokens"]])
def test_kv_transfer_params_that_are_not_a_mapping_warn_once_and_are_ignored(
    params: object, caplog: pytest.LogCaptureFixture
) -> None:
    """Scenario: an engine passes a request's kv_transfer_params as a string
    or a list. The request is served and stored as if it had none, with one
    warning naming it and the value."""
    h = Harness()
    req = h.request("req-y", h.tokens(5 * CHUNK))
    req.kv_transfer_params = params  # type: ignore[assignment]
    with caplog.at_level(logging.WARNING):
        h.run(req)
    assert len(h.manager.stored) == 5
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "req-y" in warnings[0] and repr(params) in warnings[0]


@pytest.mark.parametrize(
    ("prompt_only", "expected"),
    [(None, 2), (True, 2), (False, 6)],
    ids=["default", "on", "off"],
)
def test_offload_prompt_only(
    async_scheduling: bool, prompt_only: bool | None, expected: int
) -> None:
    """Scenario: a 2-chunk prompt, then 4 chunks' worth of generated tokens.

    49 tokens are generated: the last one's KV is never computed, so 48 are.
    On (the default), exactly the prompt's 2 chunks are offered and stored; off,
    the 4 chunks of generated tokens after them too, in prefix order."""
    h = Harness(async_scheduling=async_scheduling, offload_prompt_only=prompt_only)
    prompt = h.tokens(2 * CHUNK)
    req = h.request("r", prompt, output=h.tokens(4 * CHUNK + 1))
    h.run(req)
    chunks = chunk_keys(list(req.block_hashes), CHUNK // h.hash_tokens, 0)
    assert h.manager.offered["r"] == chunks[:expected]
    assert h.manager.stored == chunks[:expected]


def _evict_from_device(h: Harness, n: int = 3) -> None:
    h.run(*[h.request(f"filler-{i}", h.tokens(6 * CHUNK)) for i in range(n)])


@pytest.mark.parametrize(
    ("policy", "offered_by_b"),
    [(OffloadPolicy.CHUNK_LEVEL, 2), (OffloadPolicy.REQUEST_LEVEL, 5)],
)
def test_request_level_policy_stores_hit_chunks(
    async_scheduling: bool, policy: OffloadPolicy, offered_by_b: int
) -> None:
    """Scenario: A stores 3 chunks; B extends A's prompt by 2 chunks and hits A's 3.

    CHUNK_LEVEL offers only B's 2 new chunks; REQUEST_LEVEL offers all 5."""
    h = Harness(async_scheduling=async_scheduling, policy=policy, device_blocks=30)
    prompt_a = h.tokens(3 * CHUNK)
    h.run(h.request("A", prompt_a))
    _evict_from_device(h)
    b = h.request("B", prompt_a + h.tokens(2 * CHUNK + 1))
    h.run(b)
    assert b.loaded_tokens == 3 * CHUNK
    assert len(h.manager.offered["B"]) == offered_by_b


def test_keys_and_cursors_are_tracked_per_group(async_scheduling: bool) -> None:
    """Scenario: two groups (4- and 8-token blocks, 3 blocks per chunk); A stores
    36 tokens, so the tier holds group 0 up to 36 tokens and group 1 up to 24.
    B repeats A's prompt: it loads only what both groups can serve, 24 tokens."""
    h = Harness(
        async_scheduling=async_scheduling,
        tokens_per_block=(4, 8),
        blocks_per_chunk=(3, 3),
        device_blocks=24,
    )
    prompt = h.tokens(48)
    h.run(h.request("A", prompt, params={"max_offload_tokens": 36}))
    groups = [offload_key_group(k) for k in h.manager.offered["A"]]
    assert sorted(groups) == [0, 0, 0, 1]
    _evict_from_device(h)
    b = h.request("B", prompt + h.tokens(3))
    h.run(b)
    assert b.loaded_tokens == 24
    load = next(job for job in h.connector.loads() if h.connector.plans)
    by_group = {g.group: g for g in load.groups}
    assert len(by_group[0].engine_blocks) == 24 // 4
    assert len(by_group[1].engine_blocks) == 24 // 8


def test_when_all_new_chunks_do_not_fit_the_head_is_stored(
    async_scheduling: bool,
) -> None:
    """Scenario: a 10-chunk prompt computed in one step, a host tier of 4 chunks:
    the head of the prefix goes in (as much as fits), not nothing."""
    h = Harness(async_scheduling=async_scheduling, host_chunks=4)
    prompt = h.tokens(10 * CHUNK)
    h.run(h.request("A", prompt))
    offered = h.manager.offered["A"]
    assert 0 < len(offered) <= 4
    expected_head = chunk_keys(h.hasher.hash_blocks(prompt), 3, 0)[: len(offered)]
    assert offered == expected_head
    assert h.connector.get_stats().store_skipped > 0


def test_a_prompt_too_long_for_the_tier_never_evicts_others_for_its_head(
    async_scheduling: bool,
) -> None:
    """Scenario: B's 4-chunk prompt fills a host tier of 4 chunks; then A's
    10-chunk prompt cannot fit whole. Its head would go in only by evicting all of
    B for a fragment of A that cannot hit past the tier's size: it takes free room
    only, so B stays whole and A stores nothing."""
    h = Harness(async_scheduling=async_scheduling, host_chunks=4)
    b_prompt = h.tokens(4 * CHUNK)
    h.run(h.request("B", b_prompt))
    h.run(h.request("A", h.tokens(10 * CHUNK)))
    assert h.manager.offered.get("A", []) == []
    b_keys = chunk_keys(h.hasher.hash_blocks(b_prompt), 3, 0)
    assert h.manager.lookup_prefix(b_keys, ReqContext("probe")).ready == 4


def test_misspelt_tier_names_are_checked_against_the_managers_tiers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Scenario: tiers "cpu" and "disk"; one request selects ["disk", "dsik"],
    another only ["dsik"]. Each warns once; the first still keeps "disk" alone,
    the second's selector is ignored, as if absent (every tier)."""
    buffer = ArrayChunkBuffer(4, 64)
    disk = MemoryTier(MemoryTierConfig(4, name="disk"), buffer)
    seen: dict[str, ReqContext] = {}

    class Manager(TieringManager):
        def on_new_request(self, ctx: ReqContext) -> RequestOffloadingContext:
            seen[ctx.req_id] = ctx
            return super().on_new_request(ctx)

    connector = OffloadConnector(
        ConnectorConfig((GroupSpec(4, 1),)), Manager(CPUOffloadingManager(4), [disk])
    )
    with caplog.at_level(logging.WARNING):
        for req_id, names in (("both", ["disk", "dsik"]), ("typo", ["dsik"])):
            params = {"kv_store_tiers": names}
            connector.on_new_request(SimRequest(req_id, 0.0, 8, 1, (), 4, params))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "both" in warnings[0] and "['dsik'] in kv_store_tiers" in warnings[0]
    assert "typo" in warnings[1] and "['cpu', 'disk']" in warnings[1]
    assert seen["both"].params.store_tiers.allows("disk", "cpu", "local")
    assert not seen["both"].params.store_tiers.allows("other", "storage", "remote")
    assert seen["typo"].params.store_tiers.allows("disk", "cpu", "local")
