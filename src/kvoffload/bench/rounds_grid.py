"""Configurations of `bench rounds --grid N`: the sizes peer_vllm can run.

`../shared/tools/peer_vllm` runs conversations in round-robin order and passes
`--conversations`, `--turns`, `--first-tokens`, `--message-tokens`,
`--device-blocks` and `--host-bytes` to its workers. A grid draws N such
configurations from a fixed seed (2 to 8 conversations, 3 to 6 turns, first
messages of 256 to 1,280 tokens, messages of 48 to 200, 8 to 32 device blocks;
only those whose last prompt and answer fit the device, as vLLM's
`max_model_len` requires) and gives each ten host sizes, from 10% to 100% of
the chunks of a round's last prompts: the comparison with vLLM's connector at
sizes no fixed table holds (docs/policies.md, "Sizes the peer tool can run").
"""

from __future__ import annotations

import random
from dataclasses import dataclass

BLOCK_TOKENS = 128
FRAMING_TOKENS = 19  # `ChatRounds.framing_tokens`
ANSWER_TOKENS = 16


@dataclass(frozen=True)
class GridCase:
    conversations: int
    turns: int
    first_tokens: int
    message_tokens: int
    device_blocks: int
    chunks: tuple[int, ...]

    def label(self) -> str:
        return (
            f"--conversations {self.conversations} --turns {self.turns} "
            f"--first-tokens {self.first_tokens} --message-tokens "
            f"{self.message_tokens} --device-blocks {self.device_blocks}"
        )


def grid_cases(
    n: int, seed: int = 7, answer_tokens: int = ANSWER_TOKENS
) -> list[GridCase]:
    """`n` configurations drawn from `seed` (the same list for the same pair),
    for answers of `answer_tokens` (the default draws the documented grids)."""
    rng = random.Random(seed)
    cases: list[GridCase] = []
    for _ in range(1000 * max(n, 1)):
        if len(cases) >= n:
            break
        conversations = rng.choice([2, 3, 4, 5, 6, 8])
        turns = rng.choice([3, 4, 5, 6])
        first = rng.choice([256, 384, 512, 768, 1024, 1280])
        message = rng.choice([48, 96, 200])
        device = rng.choice([8, 12, 16, 24, 32])
        step = message + FRAMING_TOKENS + answer_tokens
        last = first + FRAMING_TOKENS + (turns - 1) * step
        if last + answer_tokens > device * BLOCK_TOKENS:
            continue
        round_chunks = conversations * (last // BLOCK_TOKENS)
        sizes = sorted({max(1, round(round_chunks * f / 10)) for f in range(1, 11)})
        cases.append(
            GridCase(conversations, turns, first, message, device, tuple(sizes))
        )
    if len(cases) < n:
        raise ValueError(
            f"--grid: too few configurations fit the device with answers of "
            f"{answer_tokens} tokens"
        )
    return cases
