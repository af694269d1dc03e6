"""Synthetic workloads in the Mooncake block format, for policies to be judged on
more than one trace: multi-turn chat, agents, RAG over popular documents, and chat
mixed with long one-shot documents (a scan). Each is seeded and deterministic.

A prompt is a list of segments (a content label and a token count) cut into
512-token blocks; a block is named by interning (previous block, its content), so
equal names mean equal prefixes, as Mooncake hash ids do. The last block may be
partial and is padded like `load_mooncake(partial="pad")` pads it. A spec's
`requests` are generated, then its `window` keeps those up to that quantile of
arrival times (about 80% of them by default).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace
from typing import NamedTuple, TypeVar

import numpy as np

from kvoffload.replay.mooncake import MOONCAKE_BLOCK_TOKENS
from kvoffload.replay.workload import Workload, WorkloadRequest

Segment = tuple[Hashable, int]  # (what the tokens are, how many)
DEFAULT_SEED = 7


@dataclass(frozen=True)
class LogNormal:
    """A token count or a time: lognormal around `median`, clipped to [low, high]."""

    median: float
    sigma: float
    low: int = 1
    high: int = 10_000_000

    def draw(self, rng: np.random.Generator) -> int:
        value = rng.lognormal(math.log(self.median), self.sigma)
        return int(min(self.high, max(self.low, value)))


class _Event(NamedTuple):
    time: float
    segments: list[Segment]
    kind: str


class _BlockNamer:
    """Names blocks by interning (parent name, content); content is the list of
    (label, offset, tokens) pieces the block holds."""

    def __init__(self) -> None:
        self._names: dict[tuple[int, tuple[tuple[Hashable, int, int], ...]], int] = {}

    def names(self, segments: list[Segment]) -> list[int]:
        out: list[int] = []
        parent, pieces, filled = -1, [], 0
        for label, tokens in segments:
            offset = 0
            while tokens > 0:
                take = min(tokens, MOONCAKE_BLOCK_TOKENS - filled)
                pieces.append((label, offset, take))
                filled, offset, tokens = filled + take, offset + take, tokens - take
                if filled == MOONCAKE_BLOCK_TOKENS:
                    parent = self._intern(parent, pieces)
                    out.append(parent)
                    pieces, filled = [], 0
        if pieces:
            out.append(self._intern(parent, pieces))
        return out

    def _intern(self, parent: int, pieces: list[tuple[Hashable, int, int]]) -> int:
        return self._names.setdefault((parent, tuple(pieces)), len(self._names))


def _block_hash(name: int) -> bytes:
    return b"syn" + name.to_bytes(8, "big")


def _check(spec: object, name: str, ok: bool, allowed: str) -> None:
    if not ok:
        value = getattr(spec, name)
        raise ValueError(
            f"{type(spec).__name__}.{name} must be {allowed}, got {value!r}"
        )


@dataclass(frozen=True)
class SynthChatSpec:
    """Multi-turn chats on five shared system prompts. A conversation has a
    geometric number of turns (mean 4, or 12.5 for `long_share` of them); each turn's
    prompt is the previous one plus its answer and a new user message, and comes
    after the answer is generated and the user has read and typed."""

    requests: int = 15_000
    conversation_rate: float = 3.5  # new conversations per second
    system_tokens: tuple[int, ...] = (300, 900, 1500, 2500, 4000)
    system_weights: tuple[float, ...] = (0.4, 0.25, 0.15, 0.12, 0.08)
    long_share: float = 0.3
    turn_stop: float = 0.25  # geometric turns: P(a turn is the last)
    long_turn_stop: float = 0.08
    first_message: LogNormal = LogNormal(600, 1.2, 20, 60_000)
    answer: LogNormal = LogNormal(350, 0.9, 10, 8_000)
    message: LogNormal = LogNormal(150, 1.0, 5, 8_000)
    think_s: LogNormal = LogNormal(40, 1.1, 2, 3_600)
    decode_tokens_per_s: float = 40.0
    window: float = 0.8  # keep requests up to this quantile of arrival times
    seed: int = DEFAULT_SEED

    def __post_init__(self) -> None:
        _check(self, "requests", self.requests >= 1, ">= 1")
        _check(self, "conversation_rate", self.conversation_rate > 0, "> 0")
        _check(
            self,
            "system_weights",
            len(self.system_weights) == len(self.system_tokens)
            and math.isclose(sum(self.system_weights), 1.0),
            "one weight per system prompt, summing to 1",
        )
        for name in ("turn_stop", "long_turn_stop"):
            _check(self, name, 0 < getattr(self, name) <= 1, "in (0, 1]")
        _check(self, "long_share", 0 <= self.long_share <= 1, "in [0, 1]")
        _check(self, "window", 0 < self.window <= 1, "in (0, 1]")


def _chat_events(
    rng: np.random.Generator, spec: SynthChatSpec, requests: int
) -> list[_Event]:
    weights = np.array(spec.system_weights)
    events: list[_Event] = []
    start, conversation = 0.0, 0
    while len(events) < requests:
        start += rng.exponential(1 / spec.conversation_rate)
        conversation += 1
        system = int(rng.choice(len(spec.system_tokens), p=weights))
        prompt: list[Segment] = [
            (("sys", system), spec.system_tokens[system]),
            (("user", conversation, 0), spec.first_message.draw(rng)),
        ]
        long = rng.random() >= 1 - spec.long_share
        turns = int(rng.geometric(spec.long_turn_stop if long else spec.turn_stop))
        t = start
        for turn in range(turns):
            events.append(_Event(t, list(prompt), "chat"))
            answer = spec.answer.draw(rng)
            t += answer / spec.decode_tokens_per_s + spec.think_s.draw(rng)
            prompt.append((("answer", conversation, turn), answer))
            prompt.append((("user", conversation, turn + 1), spec.message.draw(rng)))
    return events


@dataclass(frozen=True)
class SynthAgentSpec:
    """Agent sessions on three shared system prompts: a task, then steps a few
    seconds apart, each adding an action and its tool result to the context. A
    session has 3 + geometric steps (mean about 20); after any step it may fork a
    sub-agent that continues from its context for 1 + geometric steps."""

    requests: int = 7_500
    session_rate: float = 0.25  # new sessions per second
    system_tokens: tuple[int, ...] = (3000, 5000, 8000)
    task: LogNormal = LogNormal(400, 1.0)
    min_steps: int = 3
    step_stop: float = 0.06
    action: LogNormal = LogNormal(150, 0.7, 10, 2_000)
    tool_result: LogNormal = LogNormal(700, 1.2, 10, 30_000)
    step_gap_s: LogNormal = LogNormal(6, 0.8, 1, 300)
    fork_share: float = 0.08  # per step of a top-level session
    sub_step_stop: float = 0.2
    window: float = 0.8
    seed: int = DEFAULT_SEED

    def __post_init__(self) -> None:
        _check(self, "requests", self.requests >= 1, ">= 1")
        _check(self, "session_rate", self.session_rate > 0, "> 0")
        _check(self, "min_steps", self.min_steps >= 0, ">= 0")
        for name in ("step_stop", "sub_step_stop"):
            _check(self, name, 0 < getattr(self, name) <= 1, "in (0, 1]")
        _check(self, "fork_share", 0 <= self.fork_share <= 1, "in [0, 1]")
        _check(self, "window", 0 < self.window <= 1, "in (0, 1]")


class _AgentSessions:
    """Draws agent sessions and their sub-agents in one random stream."""

    def __init__(self, rng: np.random.Generator, spec: SynthAgentSpec) -> None:
        self.rng, self.spec = rng, spec
        self.events: list[_Event] = []
        self.sessions = 0

    def run(self, requests: int) -> list[_Event]:
        rng, spec = self.rng, self.spec
        start = 0.0
        while len(self.events) < requests:
            start += rng.exponential(1 / spec.session_rate)
            system = int(rng.integers(len(spec.system_tokens)))
            context: list[Segment] = [
                (("sys", system), spec.system_tokens[system]),
                (("task", self.sessions + 1), spec.task.draw(rng)),
            ]
            steps = spec.min_steps + int(rng.geometric(spec.step_stop))
            self._session(start, context, steps, sub=False)
        return self.events

    def _session(self, t: float, context: list[Segment], steps: int, sub: bool) -> None:
        rng, spec = self.rng, self.spec
        self.sessions += 1
        session = self.sessions
        for step in range(steps):
            self.events.append(_Event(t, list(context), "subagent" if sub else "agent"))
            context = [
                *context,
                (("action", session, step), spec.action.draw(rng)),
                (("tool", session, step), spec.tool_result.draw(rng)),
            ]
            t += spec.step_gap_s.draw(rng)
            if not sub and rng.random() < spec.fork_share:
                sub_steps = 1 + int(rng.geometric(spec.sub_step_stop))
                self._session(t, list(context), sub_steps, sub=True)


@dataclass(frozen=True)
class SynthRagSpec:
    """Retrieval-augmented questions: a shared system prompt, 1 to 3 documents drawn
    by Zipf popularity, and a one-off question; some get a follow-up on the same
    context (answer and a new question appended)."""

    requests: int = 15_000
    question_rate: float = 4.0  # new questions per second
    system_tokens: int = 700
    documents: int = 3_000
    zipf_exponent: float = 1.05
    document_tokens: LogNormal = LogNormal(2500, 0.8, 300, 20_000)
    max_documents: int = 3
    question: LogNormal = LogNormal(120, 0.8, 10, 2_000)
    followup_share: float = 0.2
    answer: LogNormal = LogNormal(300, 0.8)
    followup: LogNormal = LogNormal(80, 0.8)
    followup_gap_s: LogNormal = LogNormal(30, 1.0, 3, 1_800)
    window: float = 0.8
    seed: int = DEFAULT_SEED

    def __post_init__(self) -> None:
        _check(self, "requests", self.requests >= 1, ">= 1")
        _check(self, "question_rate", self.question_rate > 0, "> 0")
        _check(
            self,
            "max_documents",
            1 <= self.max_documents <= self.documents,
            "in [1, documents]",
        )
        _check(self, "followup_share", 0 <= self.followup_share <= 1, "in [0, 1]")
        _check(self, "window", 0 < self.window <= 1, "in (0, 1]")


def _rag_events(rng: np.random.Generator, spec: SynthRagSpec) -> list[_Event]:
    popularity = 1 / np.arange(1, spec.documents + 1) ** spec.zipf_exponent
    popularity /= popularity.sum()
    lengths = [spec.document_tokens.draw(rng) for _ in range(spec.documents)]
    events: list[_Event] = []
    t, question = 0.0, 0
    while len(events) < spec.requests:
        t += rng.exponential(1 / spec.question_rate)
        question += 1
        count = int(rng.integers(1, spec.max_documents + 1))
        docs = rng.choice(spec.documents, size=count, replace=False, p=popularity)
        prompt: list[Segment] = [(("sys",), spec.system_tokens)]
        prompt += [(("doc", int(d)), lengths[int(d)]) for d in docs]
        prompt.append((("question", question), spec.question.draw(rng)))
        events.append(_Event(t, prompt, "rag"))
        if rng.random() < spec.followup_share:
            answer = spec.answer.draw(rng)
            followup = spec.followup.draw(rng)
            prompt = [
                *prompt,
                (("answer", question), answer),
                (("followup", question), followup),
            ]
            events.append(_Event(t + spec.followup_gap_s.draw(rng), prompt, "followup"))
    return events


@dataclass(frozen=True)
class SynthScanSpec:
    """The chat workload (at a lower rate) with long one-shot documents arriving
    uniformly over its span: a quarter of the requests, about half the blocks. A
    document follows the chat's first system prompt."""

    requests: int = 15_000
    chat: SynthChatSpec = field(
        default_factory=lambda: SynthChatSpec(conversation_rate=2.6)
    )
    chat_share: float = 0.75
    document_tokens: LogNormal = LogNormal(30_000, 0.6, 5_000, 120_000)
    window: float = 0.8
    seed: int = DEFAULT_SEED

    def __post_init__(self) -> None:
        _check(self, "requests", self.requests >= 1, ">= 1")
        _check(self, "chat_share", 0 < self.chat_share <= 1, "in (0, 1]")
        _check(self, "window", 0 < self.window <= 1, "in (0, 1]")


def _scan_events(rng: np.random.Generator, spec: SynthScanSpec) -> list[_Event]:
    events = _chat_events(rng, spec.chat, int(spec.requests * spec.chat_share))
    end = max(e.time for e in events)
    system: Segment = (("sys", 0), spec.chat.system_tokens[0])
    for doc in range(spec.requests - len(events)):
        t = rng.random() * end
        document = (("document", doc), spec.document_tokens.draw(rng))
        events.append(_Event(t, [system, document], "document"))
    return events


def _workload(
    name: str, events: list[_Event], window: float, time_scale: float
) -> Workload:
    """Keep one steady-state window (turns after it would make the end of the trace
    all continuations), name the blocks in arrival order, pad the last one."""
    times = sorted(e.time for e in events)
    horizon = times[min(len(times) - 1, int(len(times) * window))]
    kept = sorted((e for e in events if e.time <= horizon), key=lambda e: e.time)
    start = kept[0].time
    namer = _BlockNamer()
    requests: list[WorkloadRequest] = []
    actual: list[int] = []
    for event in kept:
        hashes = [_block_hash(n) for n in namer.names(event.segments)]
        prompt = len(hashes) * MOONCAKE_BLOCK_TOKENS + 1
        arrival = (event.time - start) * time_scale
        requests.append(WorkloadRequest(arrival, prompt, 1, hashes, event.kind))
        actual.append(sum(tokens for _, tokens in event.segments))
    return Workload(name, tuple(requests), MOONCAKE_BLOCK_TOKENS, tuple(actual))


def synth_chat(
    spec: SynthChatSpec = SynthChatSpec(), time_scale: float = 1.0
) -> Workload:
    """Multi-turn chats; see SynthChatSpec."""
    rng = np.random.default_rng(spec.seed)
    events = _chat_events(rng, spec, spec.requests)
    return _workload("synth-chat", events, spec.window, time_scale)


def synth_agent(
    spec: SynthAgentSpec = SynthAgentSpec(), time_scale: float = 1.0
) -> Workload:
    """Agent sessions and sub-agents; see SynthAgentSpec."""
    rng = np.random.default_rng(spec.seed)
    events = _AgentSessions(rng, spec).run(spec.requests)
    return _workload("synth-agent", events, spec.window, time_scale)


def synth_rag(spec: SynthRagSpec = SynthRagSpec(), time_scale: float = 1.0) -> Workload:
    """Questions over Zipf-popular documents; see SynthRagSpec."""
    rng = np.random.default_rng(spec.seed)
    return _workload("synth-rag", _rag_events(rng, spec), spec.window, time_scale)


def synth_scan(
    spec: SynthScanSpec = SynthScanSpec(), time_scale: float = 1.0
) -> Workload:
    """Chats with long one-shot documents; see SynthScanSpec."""
    rng = np.random.default_rng(spec.seed)
    return _workload("synth-scan", _scan_events(rng, spec), spec.window, time_scale)


_Spec = TypeVar("_Spec", SynthChatSpec, SynthAgentSpec, SynthRagSpec, SynthScanSpec)


def _seeded(spec: _Spec, seed: int | None) -> _Spec:
    return spec if seed is None else replace(spec, seed=seed)


# Each takes (seed or None for the default, time scale).
SYNTHETIC_WORKLOADS: dict[str, Callable[[int | None, float], Workload]] = {
    "synth-chat": lambda seed, scale: synth_chat(_seeded(SynthChatSpec(), seed), scale),
    "synth-agent": lambda seed, scale: synth_agent(
        _seeded(SynthAgentSpec(), seed), scale
    ),
    "synth-rag": lambda seed, scale: synth_rag(_seeded(SynthRagSpec(), seed), scale),
    "synth-scan": lambda seed, scale: synth_scan(_seeded(SynthScanSpec(), seed), scale),
}


# Each takes (seed or None, time scale, requests to generate).
_SIZED: dict[str, Callable[[int | None, float, int], Workload]] = {
    "synth-chat": lambda seed, scale, n: synth_chat(
        replace(_seeded(SynthChatSpec(), seed), requests=n), scale
    ),
    "synth-agent": lambda seed, scale, n: synth_agent(
        replace(_seeded(SynthAgentSpec(), seed), requests=n), scale
    ),
    "synth-rag": lambda seed, scale, n: synth_rag(
        replace(_seeded(SynthRagSpec(), seed), requests=n), scale
    ),
    "synth-scan": lambda seed, scale, n: synth_scan(
        replace(_seeded(SynthScanSpec(), seed), requests=n), scale
    ),
}


def synthetic(
    name: str,
    seed: int | None = None,
    time_scale: float = 1.0,
    requests: int | None = None,
) -> Workload:
    """The synthetic workload `name` (see SYNTHETIC_WORKLOADS) with its default
    spec, under another seed if given, its arrival times stretched by
    `time_scale`; `requests` replaces the spec's number of requests generated
    (before its `window` keeps the steady part)."""
    if name not in SYNTHETIC_WORKLOADS:
        raise ValueError(
            f"unknown synthetic workload {name!r}; known: {', '.join(SYNTHETIC_WORKLOADS)}"
        )
    if requests is None:
        return SYNTHETIC_WORKLOADS[name](seed, time_scale)
    return _SIZED[name](seed, time_scale, requests)
