"""Retention hints (`kv_retention_s`) inside real vLLM (issue 25).

One engine on the tiny model: a device cache of 16 usable blocks and a host tier
of 10 chunks (at most 3 of them hinted: `max_hinted_share` 0.35). Prompt H (two
whole chunks and a tail) comes with `kv_retention_s: 600`, then prompt U, the
same length, with no hint; then 8 unhinted prompts of two chunks each flood both
tiers (16 chunks through a tier of 10, 24 blocks through 16). Under LRU alone
H, stored before U, would be the first to go. H and U come back: H loads its two
chunks from host memory, U computes everything (so neither cache kept U, and H's
hit is kvoffload's), and both give the tokens they gave the first time. With
`max_hinted_share: 0` (positive hints off) H comes back with nothing cached, as
U does: the hint, not the sizes, keeps it. Two of the flood carry bad hints
(`"soon"`, `-1`): each is served and warned about once.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from kvoffload.integrations.vllm.model_builder import BuiltModel, synthetic_text

from .conftest import LLMFactory
from .test_connector_e2e import BLOCK, DEVICE, PAGE, kv_config, run, tokens

pytestmark = pytest.mark.vllm

HOST_CHUNKS = 10
HINTED = synthetic_text(250, seed=1)  # 347 tokens: two whole chunks and a tail
UNHINTED = synthetic_text(250, seed=2)
FLOOD = [synthetic_text(240, seed=10 + i) for i in range(8)]  # two chunks each
BAD_HINTS: dict[int, object] = {0: "soon", 1: -1}


def _cpu_metric(llm: Any, name: str) -> float:
    return sum(
        metric.value
        for metric in llm.get_metrics()
        if metric.name == f"vllm:kvoffload_{name}"
        and metric.labels.get("tier") == "cpu"
    )


def _hint_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if "kv_retention_s" in r.getMessage()
    ]


def test_a_hinted_prefix_outlives_a_flood_that_evicts_an_unhinted_one(
    llm_factory: LLMFactory,
    tiny_model: BuiltModel,
    caplog: pytest.LogCaptureFixture,
) -> None:
    llm = llm_factory(
        **tiny_model.vllm_args(),
        **DEVICE,
        kv_transfer_config=kv_config(cpu_bytes_to_use=HOST_CHUNKS * PAGE),
    )
    hinted = run(llm, HINTED, params={"kv_retention_s": 600})
    unhinted = run(llm, UNHINTED)
    # The connector sends kvoffload's records to vLLM's handlers, not the root's.
    ours = logging.getLogger("kvoffload")
    ours.addHandler(caplog.handler)
    try:
        for i, prompt in enumerate(FLOOD):
            caplog.clear()
            params = {"kv_retention_s": BAD_HINTS[i]} if i in BAD_HINTS else None
            served = run(llm, prompt, params=params)
            assert len(tokens(served)) == 8
            warned = _hint_warnings(caplog)
            assert len(warned) == (1 if i in BAD_HINTS else 0), warned
    finally:
        ours.removeHandler(caplog.handler)

    hinted_again = run(llm, HINTED)
    unhinted_again = run(llm, UNHINTED)
    assert hinted.num_cached_tokens == unhinted.num_cached_tokens == 0
    assert hinted_again.num_cached_tokens == 2 * BLOCK
    assert unhinted_again.num_cached_tokens == 0, "the flood evicted U everywhere"
    assert tokens(hinted_again) == tokens(hinted)
    assert tokens(unhinted_again) == tokens(unhinted)
    assert _cpu_metric(llm, "hints_honoured") == 2
    assert _cpu_metric(llm, "hit_tokens") == 2 * BLOCK
