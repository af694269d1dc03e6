"""The synthetic workloads: seeded, shaped as described, replayable, on the CLI."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from kvoffload.cli import main as kvoffload_main
from kvoffload.replay import ReplaySettings, Workload, infinite, run_replay
from kvoffload.replay.synthetic import (
    SYNTHETIC_WORKLOADS,
    SynthAgentSpec,
    SynthChatSpec,
    SynthRagSpec,
    SynthScanSpec,
    synth_agent,
    synth_chat,
    synth_rag,
    synth_scan,
    synthetic,
)

BLOCK = 512


def _small(name: str, seed: int = 7) -> Workload:
    if name == "synth-chat":
        return synth_chat(SynthChatSpec(requests=400, seed=seed))
    if name == "synth-agent":
        return synth_agent(SynthAgentSpec(requests=300, seed=seed))
    if name == "synth-rag":
        return synth_rag(SynthRagSpec(requests=400, seed=seed))
    return synth_scan(SynthScanSpec(requests=400, seed=seed))


def _extends_earlier(workload: Workload, skip: int) -> float:
    """Share of requests that contain an earlier request's full blocks beyond their
    first `skip`. Names chain, so one equal name means an equal prefix."""
    earlier_ends: set[bytes] = set()
    extending = 0
    for req in workload.requests:
        if any(h in earlier_ends for h in req.hashes[skip:]):
            extending += 1
        if len(req.hashes) >= 2:
            earlier_ends.add(req.hashes[-2])  # the last block may be partial
    return extending / len(workload)


@pytest.mark.parametrize("name", list(SYNTHETIC_WORKLOADS))
def test_a_seed_gives_the_same_workload(name: str) -> None:
    first, again, other = _small(name), _small(name), _small(name, seed=8)
    assert [r.hashes for r in first.requests] == [r.hashes for r in again.requests]
    assert [r.arrival for r in first.requests] == [r.arrival for r in again.requests]
    assert [r.hashes for r in first.requests] != [r.hashes for r in other.requests]


@pytest.mark.parametrize("name", list(SYNTHETIC_WORKLOADS))
def test_blocks_are_mooncake_chunks_with_a_padded_last_block(name: str) -> None:
    workload = _small(name)
    assert workload.name == name
    assert workload.hash_block_tokens == BLOCK
    assert workload.actual_prompt_tokens is not None
    for i, req in enumerate(workload.requests):
        actual = workload.actual_prompt_tokens[i]
        assert len(req.hashes) == -(-actual // BLOCK)  # the last block may be partial
        assert req.num_prompt_tokens == len(req.hashes) * BLOCK + 1
        assert req.num_prompt_blocks(BLOCK) == len(req.hashes)
    assert workload.requests[0].arrival == 0.0


def test_chat_turns_extend_the_conversation_so_far() -> None:
    """Scenario: one 2-block system prompt, so a request that repeats an earlier
    request's blocks past the second is a later turn of the same conversation."""
    workload = synth_chat(
        SynthChatSpec(requests=400, system_tokens=(1024,), system_weights=(1.0,))
    )
    assert _extends_earlier(workload, skip=2) > 0.5
    first_blocks = Counter(r.hashes[0] for r in workload.requests)
    assert first_blocks.most_common(1)[0][1] == len(workload)


def test_agents_grow_their_context_and_fork_sub_agents() -> None:
    workload = synth_agent(SynthAgentSpec(requests=300, system_tokens=(2048,)))
    kinds = Counter(r.kind for r in workload.requests)
    assert kinds["agent"] > 0 and kinds["subagent"] > 0
    assert _extends_earlier(workload, skip=4) > 0.8
    mean_blocks = sum(len(r.hashes) for r in workload.requests) / len(workload)
    assert mean_blocks > 10  # long contexts: 4 system blocks, then tool results


def test_rag_shares_popular_documents() -> None:
    workload = synth_rag(SynthRagSpec(requests=400))
    in_requests = Counter(h for r in workload.requests for h in set(r.hashes))
    system = workload.requests[0].hashes[0]
    assert in_requests[system] == len(workload)
    # Past the system prompt, the most popular document is in many requests...
    popular = max(c for h, c in in_requests.items() if h != system)
    assert popular > 0.05 * len(workload)
    # ...while each question is its own, and a follow-up extends its question.
    kinds = Counter(r.kind for r in workload.requests)
    assert kinds["followup"] > 0
    assert infinite(workload.chunk_sequence(BLOCK)).hit_ratio < 0.6


def test_scan_documents_are_long_and_never_reused() -> None:
    workload = synth_scan(SynthScanSpec(requests=400))
    uses = Counter(h for r in workload.requests for h in r.hashes)
    documents = [r for r in workload.requests if r.kind == "document"]
    chats = [r for r in workload.requests if r.kind == "chat"]
    assert documents and chats
    assert min(len(r.hashes) for r in documents) >= 5_000 // BLOCK
    assert all(uses[h] == 1 for r in documents for h in r.hashes[1:])
    doc_blocks = sum(len(r.hashes) for r in documents)
    assert 0.3 < doc_blocks / sum(uses.values()) < 0.7


@pytest.mark.parametrize("name", list(SYNTHETIC_WORKLOADS))
def test_replays_through_the_connector(name: str) -> None:
    workload = _small(name)
    result = run_replay(workload, "split", 200, ReplaySettings(chunk_tokens=BLOCK))
    bound = infinite(workload.chunk_sequence(BLOCK))
    assert result.requests == len(workload)
    assert result.prompt_chunks == bound.prompt_chunks
    assert 0 < result.hit_chunks <= bound.hit_chunks


def test_time_scale_stretches_arrivals_only() -> None:
    spec = SynthRagSpec(requests=300, seed=3)
    base, slow = synth_rag(spec), synth_rag(spec, time_scale=2.0)
    assert [2 * r.arrival for r in base.requests] == [r.arrival for r in slow.requests]
    assert [r.hashes for r in base.requests] == [r.hashes for r in slow.requests]
    with pytest.raises(ValueError, match="synth-nope"):
        synthetic("synth-nope")


def test_specs_reject_bad_values_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"SynthChatSpec\.requests"):
        SynthChatSpec(requests=0)
    with pytest.raises(ValueError, match=r"SynthChatSpec\.system_weights"):
        SynthChatSpec(system_weights=(1.0,))
    with pytest.raises(ValueError, match=r"SynthRagSpec\.max_documents"):
        SynthRagSpec(documents=2)


def test_cli_replays_a_synthetic_workload_in_512_token_chunks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["replay", "--workload", "synth-agent", "--seed", "5", "--limit", "150"]
    argv += ["--capacity-chunks", "300", "--time-scale", "1", "--jobs", "1", "--json"]
    assert kvoffload_main(argv) == 0
    lru = json.loads(capsys.readouterr().out.splitlines()[0])
    assert (lru["workload"], lru["policy"], lru["requests"]) == (
        "synth-agent",
        "lru",
        150,
    )
    requests = synthetic("synth-agent", seed=5).requests[:150]
    # One 512-token chunk per block, and --seed reaches the generator.
    assert lru["prompt_chunks"] == sum(len(r.hashes) for r in requests)
    assert 0 < lru["hit_chunks"] < lru["prompt_chunks"]
