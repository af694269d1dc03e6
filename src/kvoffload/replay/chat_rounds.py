"""Conversations taking turns, one request at a time, in an engine with a prefix
cache: `python -m kvoffload.bench vllm`'s workload, in the engine model.

Each conversation opens with a first message (after an optional system prompt
every conversation shares) and goes on with short messages; every turn's prompt
is the conversation so far plus the new message, so it starts with the previous
turn's prompt and answer, token for token. Lengths follow the bench's chat
template: `framing_tokens` of role markers and separators around each message.

Turns run alone in the engine (the next arrives when the previous finished), in
one of these orders:

- `round-robin`: every conversation's turn 0, then every turn 1, ... (the bench's);
- `bursts:K`: each conversation takes K turns in a row, then the next one does;
- `random:SEED`: a conversation drawn at random each time, turns in order.

With a device cache of a few conversations and a host tier smaller than all of
them, this is where an offloading layer earns its keep and where the order of its
lookups, stores and touches decides what it keeps (docs/policies.md, "Inside a
real engine"); the engine model reproduces real vLLM's figures for it exactly.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvoffload.connector import ConnectorConfig, GroupSpec, OffloadConnector
from kvoffload.engine_model import (
    EngineConfig,
    EngineModel,
    SimClock,
    SimRequest,
)
from kvoffload.keys import BlockHasher
from kvoffload.tiers.primary import CPUOffloadingManager

ORDERS = ("round-robin", "bursts:K", "random:SEED")


def turn_order(conversations: int, turns: int, order: str) -> list[tuple[int, int]]:
    """(conversation, turn) in the order the turns run; `ValueError` naming the
    order and the choices for an unknown one."""
    kind, _, arg = order.partition(":")
    if kind == "round-robin" and not arg:
        return [(c, t) for t in range(turns) for c in range(conversations)]
    if kind == "bursts" and arg.isdigit() and int(arg) >= 1:
        k = int(arg)
        return [
            (c, t)
            for start in range(0, turns, k)
            for c in range(conversations)
            for t in range(start, min(turns, start + k))
        ]
    if kind == "random" and arg.isdigit():
        rng = random.Random(int(arg))
        left = [turns] * conversations
        out: list[tuple[int, int]] = []
        while len(out) < conversations * turns:
            c = rng.choice([i for i, n in enumerate(left) if n])
            out.append((c, turns - left[c]))
            left[c] -= 1
        return out
    raise ValueError(f"order: {order!r} is not one of {', '.join(ORDERS)}")


@dataclass(frozen=True)
class ChatRounds:
    """Sizes in tokens; defaults are the case of issue 22 (4 x 4 turns, 768-token
    first messages: 6 to 9 chunks of 128 tokens a prompt)."""

    conversations: int = 4
    turns: int = 4
    first_tokens: int = 768
    message_tokens: int = 96
    answer_tokens: int = 16
    system_tokens: int = 0
    framing_tokens: int = 19
    order: str = "round-robin"
    block_tokens: int = 128

    def __post_init__(self) -> None:
        for name in (
            "conversations",
            "turns",
            "first_tokens",
            "answer_tokens",
            "block_tokens",
        ):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name}: {value!r} must be an int >= 1")
        for name in ("message_tokens", "system_tokens", "framing_tokens"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ValueError(f"{name}: {value!r} must be an int >= 0")
        turn_order(1, 1, self.order)  # validates the order

    def requests(self) -> list[Turn]:
        """Every turn, in the order they run."""
        hasher = BlockHasher(self.block_tokens)
        system = [1 + i for i in range(self.system_tokens)]
        history = {c: list(system) for c in range(self.conversations)}
        built: dict[tuple[int, int], Turn] = {}
        for c, t in turn_order(self.conversations, self.turns, "round-robin"):
            size = (self.first_tokens if t == 0 else self.message_tokens) + (
                self.framing_tokens
            )
            prompt = history[c] + _tokens(size, c, t, "message")
            answer = _tokens(self.answer_tokens, c, t, "answer")
            hashes = tuple(hasher.hash_blocks(prompt + answer))
            built[c, t] = Turn(c, t, len(prompt), self.answer_tokens, hashes)
            history[c] = prompt + answer
        order = turn_order(self.conversations, self.turns, self.order)
        return [built[key] for key in order]


@dataclass(frozen=True)
class Turn:
    conversation: int
    turn: int
    prompt_tokens: int
    answer_tokens: int
    hashes: tuple[bytes, ...]


def _tokens(n: int, conversation: int, turn: int, what: str) -> list[int]:
    rng = random.Random(f"{conversation}/{turn}/{what}")
    return [rng.randrange(1_000, 50_000) for _ in range(n)]


@dataclass
class RoundsResult:
    """What each turn got: tokens from the device cache and from the host tier."""

    policy: str
    capacity_chunks: int
    turns: list[tuple[Turn, int, int]] = field(default_factory=list)
    chunks_stored: int = 0

    @property
    def later_hit_tokens(self) -> int:
        """Tokens loaded from the host tier by every turn after a conversation's
        first (the first has nothing to reuse)."""
        return sum(loaded for turn, _, loaded in self.turns if turn.turn > 0)

    def per_turn(self) -> list[int]:
        return [loaded for _, _, loaded in self.turns]


def run_chat_rounds(
    rounds: ChatRounds,
    policy: str,
    capacity_chunks: int,
    device_blocks: int = 16,
    turns: Sequence[Turn] | None = None,
    warm_up_tokens: int = 64,
) -> RoundsResult:
    """The turns through the engine model (prefix cache of `device_blocks`
    blocks) and the real connector over a host tier of `capacity_chunks`, after
    a warm-up request of `warm_up_tokens` as the bench sends (0: none)."""
    block = rounds.block_tokens
    clock = SimClock()
    manager = CPUOffloadingManager(capacity_chunks, policy)
    connector = OffloadConnector(
        ConnectorConfig(
            (GroupSpec(block, 1),), hash_block_tokens=block, engine_blocks=device_blocks
        ),
        manager,
        clock=clock,
    )
    engine = EngineModel(
        EngineConfig(
            tokens_per_block=(block,),
            device_blocks=device_blocks,
            max_batched_tokens=device_blocks * block,
        ),
        connector,
        clock=clock,
    )
    result = RoundsResult(policy, capacity_chunks)
    if warm_up_tokens:
        # The bench's warm-up request: it leaves a freed block in the device
        # cache, which the first turn takes, as in vLLM.
        warm = _tokens(warm_up_tokens, -1, 0, "warm-up")
        hashes = BlockHasher(block).hash_blocks(warm + warm[: rounds.answer_tokens])
        engine.run(
            [
                SimRequest(
                    "warm-up", 0.0, warm_up_tokens, rounds.answer_tokens, hashes, block
                )
            ]
        )
    for i, turn in enumerate(turns if turns is not None else rounds.requests()):
        request = SimRequest(
            f"c{turn.conversation}t{turn.turn}#{i}",
            clock.now,
            turn.prompt_tokens,
            turn.answer_tokens,
            turn.hashes,
            block,
        )
        engine.run([request])  # alone in the engine, as the bench runs turns
        result.turns.append((turn, request.device_hit_tokens, request.loaded_tokens))
    result.chunks_stored = manager.get_stats()["cpu"].chunks_stored
    return result
