"""Generated workloads with a fixed seed: chats and agents sharing system prompts,
and multi-turn reasoning conversations whose thinking is dropped between turns.

Each turn's prompt is the conversation so far plus a new message, so consecutive
turns share a prefix. A reasoning turn's output is thinking followed by an answer;
the next prompt keeps only the answer, which therefore sits at a shifted position
and hashes differently: the thinking's (and the answer's) decode KV is never reused.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

from kvoffload.keys import BlockHasher
from kvoffload.replay.workload import Workload, WorkloadRequest


class _Conversation:
    """Tokens of one conversation and their hashes, extended turn by turn."""

    def __init__(self, hasher: BlockHasher, tokens: list[int]) -> None:
        self.hasher = hasher
        self.tokens = list(tokens)
        self.hashes = hasher.hash_blocks(self.tokens)

    def hashes_with(self, extra: list[int]) -> list[bytes]:
        """Hashes of the conversation followed by `extra` (not kept)."""
        tokens = self.tokens + extra
        done = len(self.hashes)
        parent = self.hashes[-1] if done else None
        return self.hashes + self.hasher.hash_blocks(
            tokens, parent=parent, start_block=done
        )

    def extend(self, extra: list[int]) -> None:
        self.hashes = self.hashes_with(extra)
        self.tokens += extra


@dataclass(frozen=True)
class ChatAgentsSpec:
    """The demo's default workload: chats and agents on shared system prompts."""

    conversations: int = 240
    agent_share: float = 0.35
    system_prompts: int = 6
    system_tokens: tuple[int, int] = (800, 3000)
    chat_turns: tuple[int, int] = (1, 10)
    agent_turns: tuple[int, int] = (6, 24)
    user_tokens: tuple[int, int] = (30, 400)
    answer_tokens: tuple[int, int] = (80, 700)
    tool_tokens: tuple[int, int] = (300, 2500)
    chat_gap_s: float = 40.0
    agent_gap_s: float = 4.0
    arrival_rate: float = 0.5
    seed: int = 1234
    hash_block_tokens: int = 16


def _randint(rng: random.Random, bounds: tuple[int, int]) -> int:
    return rng.randint(bounds[0], bounds[1])


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(32_000) for _ in range(n)]


def chat_agents(spec: ChatAgentsSpec = ChatAgentsSpec()) -> Workload:
    """Multi-turn chats (long think times) and agents (many quick turns with tool
    output) starting from a few shared system prompts chosen with Zipf-like skew."""
    rng = random.Random(spec.seed)
    hasher = BlockHasher(spec.hash_block_tokens, "sha256")
    systems = [
        _tokens(rng, _randint(rng, spec.system_tokens))
        for _ in range(spec.system_prompts)
    ]
    weights = [1.0 / (i + 1) for i in range(spec.system_prompts)]
    events: list[tuple[float, int, WorkloadRequest]] = []
    start = 0.0
    for conv_id in range(spec.conversations):
        start += rng.expovariate(spec.arrival_rate)
        agent = rng.random() < spec.agent_share
        conv = _Conversation(hasher, rng.choices(systems, weights)[0])
        turns = _randint(rng, spec.agent_turns if agent else spec.chat_turns)
        t = start
        for _ in range(turns):
            extra = _tokens(
                rng, _randint(rng, spec.tool_tokens if agent else spec.user_tokens)
            )
            conv.extend(extra)
            answer = _tokens(rng, _randint(rng, spec.answer_tokens))
            prompt = len(conv.tokens)
            req = WorkloadRequest(
                t,
                prompt,
                len(answer),
                conv.hashes_with(answer),
                "agent" if agent else "chat",
            )
            heapq.heappush(events, (t, len(events), req))
            conv.extend(answer)
            gap = spec.agent_gap_s if agent else spec.chat_gap_s
            t += rng.expovariate(1.0 / gap)
        del conv_id
    requests = tuple(heapq.heappop(events)[2] for _ in range(len(events)))
    return Workload("chat-agents", requests, spec.hash_block_tokens)


@dataclass(frozen=True)
class ReasoningSpec:
    """Multi-turn reasoning chats: each output is thinking then an answer."""

    conversations: int = 150
    turns: tuple[int, int] = (2, 8)
    system_tokens: int = 1500
    user_tokens: tuple[int, int] = (50, 600)
    output_tokens: tuple[int, int] = (400, 3000)
    thinking_share: float = 0.8
    gap_s: float = 30.0
    arrival_rate: float = 0.3
    seed: int = 4321
    hash_block_tokens: int = 16

    def __post_init__(self) -> None:
        if not 0.0 <= self.thinking_share < 1.0:
            raise ValueError(
                f"thinking_share must be in [0, 1), got {self.thinking_share!r}"
            )


def reasoning(spec: ReasoningSpec = ReasoningSpec()) -> Workload:
    """Reasoning conversations whose thinking is dropped from the next turn's prompt."""
    rng = random.Random(spec.seed)
    hasher = BlockHasher(spec.hash_block_tokens, "sha256")
    system = _tokens(rng, spec.system_tokens)
    events: list[tuple[float, int, WorkloadRequest]] = []
    start = 0.0
    for _ in range(spec.conversations):
        start += rng.expovariate(spec.arrival_rate)
        conv = _Conversation(hasher, system)
        t = start
        for _ in range(_randint(rng, spec.turns)):
            conv.extend(_tokens(rng, _randint(rng, spec.user_tokens)))
            total = _randint(rng, spec.output_tokens)
            thinking = _tokens(rng, int(total * spec.thinking_share))
            answer = _tokens(rng, max(1, total - len(thinking)))
            output = thinking + answer
            req = WorkloadRequest(
                t, len(conv.tokens), len(output), conv.hashes_with(output), "reasoning"
            )
            heapq.heappush(events, (t, len(events), req))
            conv.extend(answer)  # the next turn keeps the answer, not the thinking
            t += rng.expovariate(1.0 / spec.gap_s)
    requests = tuple(heapq.heappop(events)[2] for _ in range(len(events)))
    return Workload("reasoning", requests, spec.hash_block_tokens)
