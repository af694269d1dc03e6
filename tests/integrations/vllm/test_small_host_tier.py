"""Inside real vLLM, a host tier smaller than a round of conversations (issue 22).

Four conversations take four turns each, one at a time in round-robin order, on
the tiny model: first messages of 768 tokens, so prompts of 6 to 9 chunks of 128
tokens and 24 to 36 chunks a round, a device cache of 16 blocks and a host tier
of 20 chunks. vLLM's own OffloadingConnector hits 2,944 tokens in later turns
with LRU; kvoffload's connector of stop 21 hit 384 (each store evicted the
conversation due next). One engine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvoffload.integrations.vllm.model_builder import BuiltModel

pytestmark = pytest.mark.vllm

VLLM_LRU_LATER_TURN_HITS = 2944


def test_a_round_of_conversations_hits_at_least_what_vllms_connector_does(
    tiny_model: BuiltModel, vllm_in_process: None, tmp_path: Path
) -> None:
    from kvoffload.bench import vllm as bench

    args = bench.parse_args(
        [
            "--model=tiny",
            "--first-tokens=768",
            f"--host-bytes={20 * bench.page_bytes(tiny_model.spec)}",
        ]
    )
    workload = bench.workload_from(args)
    run = bench.run_config("kvoffload-lru", tiny_model, workload, args, str(tmp_path))
    later = [r for r in run.records if r.turn > 0]
    assert len(later) == 12
    assert all(len(r.output) == workload.answer_tokens for r in run.records)
    hits = sum(r.external_tokens for r in later)
    assert hits >= VLLM_LRU_LATER_TURN_HITS, [r.external_tokens for r in later]
    assert run.chunks_stored < 85, "vLLM's connector stores 85 chunks here"
