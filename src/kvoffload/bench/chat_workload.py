"""A multi-turn chat workload as token ids, for the vLLM benchmark.

Each conversation opens with a long first user message (a document and a
question) and goes on with short ones; every turn's prompt is the whole
conversation so far (previous prompts and answers) plus the new message, so a
turn's prompt starts with the previous turn's prompt, token for token.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kvoffload.integrations.vllm.model_builder import synthetic_text
from kvoffload.replay.chat_rounds import turn_order

USER_OPEN = "<|user|>\n"
USER_CLOSE = "\n<|assistant|>\n"
TURN_SEPARATOR = "\n"


@dataclass(frozen=True)
class ChatWorkload:
    """Sizes in tokens; `conversations` take turns in `order` (`round-robin`:
    one turn each per round; `bursts:K`; `random:SEED`; see
    `kvoffload.replay.chat_rounds`), each first message after a system prompt
    of `system_tokens` that every conversation shares."""

    conversations: int = 4
    turns: int = 4
    first_message_tokens: int = 1536
    message_tokens: int = 96
    answer_tokens: int = 16
    seed: int = 0
    system_tokens: int = 0
    order: str = "round-robin"

    def __post_init__(self) -> None:
        for name in (
            "conversations",
            "turns",
            "first_message_tokens",
            "message_tokens",
            "answer_tokens",
        ):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name}: {value!r} must be an int >= 1")
        if type(self.system_tokens) is not int or self.system_tokens < 0:
            raise ValueError(
                f"system_tokens: {self.system_tokens!r} must be an int >= 0"
            )
        turn_order(1, 1, self.order)  # ValueError naming the order

    def max_context_tokens(self) -> int:
        """An upper bound on the last turn's prompt plus its answer."""
        framing = 32  # role markers and separators around a message (~19 tokens)
        later = (self.turns - 1) * (self.message_tokens + self.answer_tokens + framing)
        first = self.system_tokens + self.first_message_tokens
        return 1 + first + framing + later + self.answer_tokens


class Tokenizer:
    """The model's own tokenizer (`tokenizer.json`), used without special tokens."""

    def __init__(self, model_dir: Path) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        self._tokenizer = HFTokenizer.from_file(str(model_dir / "tokenizer.json"))
        bos = self._tokenizer.token_to_id("<|bos|>")
        self.bos: list[int] = [] if bos is None else [int(bos)]

    def encode(self, text: str) -> list[int]:
        ids = self._tokenizer.encode(text, add_special_tokens=False).ids
        return [int(i) for i in ids]


class Conversation:
    """One conversation's token ids: the messages to send and the history so far."""

    def __init__(self, index: int, messages: list[list[int]]) -> None:
        self.index = index
        self._messages = messages
        self._history: list[int] = []
        self.turn = 0

    def next_prompt(self) -> list[int]:
        """The whole conversation so far plus the next user message."""
        return self._history + self._messages[self.turn]

    def record_answer(self, prompt: list[int], answer: list[int]) -> None:
        self._history = prompt + list(answer)
        self.turn += 1


def _text(tokenizer: Tokenizer, tokens: int, seed: int) -> list[int]:
    words = synthetic_text(tokens, seed=seed)  # more words than tokens needed
    body = tokenizer.encode(words)
    while len(body) < tokens:
        body += tokenizer.encode(" " + words)
    return body[:tokens]


def _message(
    tokenizer: Tokenizer, tokens: int, seed: int, first: bool, system: list[int]
) -> list[int]:
    opening = tokenizer.bos + system if first else tokenizer.encode(TURN_SEPARATOR)
    return (
        opening
        + tokenizer.encode(USER_OPEN)
        + _text(tokenizer, tokens, seed)
        + tokenizer.encode(USER_CLOSE)
    )


def make_conversations(
    workload: ChatWorkload, tokenizer: Tokenizer
) -> list[Conversation]:
    """Fresh conversations (no history); unrelated texts for every message but
    the shared system prompt."""
    system = (
        _text(tokenizer, workload.system_tokens, seed=workload.seed * 1_000_003 - 1)
        if workload.system_tokens
        else []
    )
    conversations = []
    for c in range(workload.conversations):
        messages = [
            _message(
                tokenizer,
                workload.first_message_tokens if t == 0 else workload.message_tokens,
                seed=workload.seed * 1_000_003 + c * 1000 + t + 1,
                first=t == 0,
                system=system,
            )
            for t in range(workload.turns)
        ]
        conversations.append(Conversation(c, messages))
    return conversations


def interleaved(
    conversations: list[Conversation], turns: int, order: str = "round-robin"
) -> Iterator[Conversation]:
    """The conversation whose turn is next, in `order` (default: every
    conversation's turn 0, then every turn 1, ...)."""
    for c, _ in turn_order(len(conversations), turns, order):
        yield conversations[c]
