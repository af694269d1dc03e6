"""Routers for a modeled fleet: which engine serves each arriving request.

A router sees the request and each engine's load: the prompt tokens routed to it
whose first token has not come yet (its queue of prefill work). `prefix` also
hears the engines' KV events, as a KV-aware router subscribed to them does, and
keeps them in a `PrefixIndex`: it knows no more of the engines' tiers than those
events tell.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import ClassVar, TypeVar, cast

from kvoffload.engine_model import SimRequest
from kvoffload.keys import offload_key_block_hash
from kvoffload.routing import PrefixIndex
from kvoffload.tiers.base import OffloadingEvent
from kvoffload.tiers.primary import CPUOffloadingManager


class Router(ABC):
    """Picks an engine (0 to `num_engines - 1`) for each request, in arrival order.

    `route` gets the request, its true prompt length in tokens and the engines'
    loads. Routers that set `wants_events` get every engine's stored and removed
    events after each of its steps through `observe`.
    """

    name: ClassVar[str]
    wants_events: ClassVar[bool] = False

    def __init__(self, num_engines: int, chunk_tokens: int) -> None:
        self.num_engines = num_engines
        self.chunk_tokens = chunk_tokens

    @abstractmethod
    def route(
        self, request: SimRequest, prompt_tokens: int, loads: Sequence[int]
    ) -> int:
        """The engine that serves `request`."""

    def observe(self, engine: int, events: Iterable[OffloadingEvent]) -> None:
        """Events `engine`'s tiers published (only if `wants_events`)."""
        del engine, events


R = TypeVar("R", bound=type[Router])
ROUTERS: dict[str, type[Router]] = {}


def _register(cls: R) -> R:
    ROUTERS[cls.name] = cls
    return cls


def least_loaded(loads: Sequence[int], start: int) -> int:
    """The engine with the least load; among equals, the first from `start` on
    (a rotating start spreads an idle fleet's requests evenly)."""
    n = len(loads)
    best, best_load = start % n, loads[start % n]
    for step in range(1, n):
        i = (start + step) % n
        if loads[i] < best_load:
            best, best_load = i, loads[i]
    return best


@_register
class RoundRobinRouter(Router):
    """Each engine in turn, whatever it holds or has queued."""

    name = "round-robin"

    def __init__(self, num_engines: int, chunk_tokens: int) -> None:
        super().__init__(num_engines, chunk_tokens)
        self._next = 0

    def route(
        self, request: SimRequest, prompt_tokens: int, loads: Sequence[int]
    ) -> int:
        engine = self._next
        self._next = (engine + 1) % self.num_engines
        return engine


@_register
class LeastLoadedRouter(Router):
    """The engine with the least prefill work queued."""

    name = "least-loaded"

    def __init__(self, num_engines: int, chunk_tokens: int) -> None:
        super().__init__(num_engines, chunk_tokens)
        self._start = 0

    def route(
        self, request: SimRequest, prompt_tokens: int, loads: Sequence[int]
    ) -> int:
        self._start += 1
        return least_loaded(loads, self._start)


class ConversationTracker:
    """Infers conversations from prompts, for traces that carry no session id.

    A request continues the conversation of the latest earlier request whose
    whole blocks (of its true prompt) its own prompt starts with, the longest
    such prefix first. Each request's prefix is continued by one request only:
    a second request starting with it (another conversation on the same system
    prompt and first message, say) starts a conversation of its own. The last
    `max_requests` prompts are remembered.
    """

    def __init__(self, max_requests: int = 1 << 20) -> None:
        self._ends: OrderedDict[tuple[int, bytes], list[int]] = OrderedDict()
        self._max = max_requests
        self._sessions = 0

    def session_of(self, request: SimRequest, prompt_tokens: int) -> int:
        hashes = request.hashes
        blocks = min(prompt_tokens // request.hash_block_tokens, len(hashes))
        session = None
        for k in range(blocks, 0, -1):
            entry = self._ends.get((k, hashes[k - 1]))
            if entry is not None:
                if entry[1] == 0:  # not continued yet: this request does
                    entry[1] = 1
                    session = entry[0]
                break
        if session is None:
            session = self._sessions
            self._sessions += 1
        if blocks:
            key = (blocks, hashes[blocks - 1])
            if key not in self._ends:
                self._ends[key] = [session, 0]
                if len(self._ends) > self._max:
                    self._ends.popitem(last=False)
        return session


@_register
class SessionRouter(Router):
    """Sticky by conversation, as most gateways are: a conversation's first
    request goes to the least loaded engine, its later ones where it went."""

    name = "session"

    def __init__(self, num_engines: int, chunk_tokens: int) -> None:
        super().__init__(num_engines, chunk_tokens)
        self._conversations = ConversationTracker()
        self._engine_of: OrderedDict[int, int] = OrderedDict()
        self._start = 0

    def route(
        self, request: SimRequest, prompt_tokens: int, loads: Sequence[int]
    ) -> int:
        session = self._conversations.session_of(request, prompt_tokens)
        engine = self._engine_of.get(session)
        if engine is None:
            self._start += 1
            engine = least_loaded(loads, self._start)
            self._engine_of[session] = engine
            if len(self._engine_of) > 1 << 20:
                self._engine_of.popitem(last=False)
        return engine


@_register
class PrefixRouter(Router):
    """The engine that would finish the request first, by what its tiers hold.

    Cost of an engine: the prompt tokens it would compute (past the prefix its
    tiers hold), plus `shared_cost` per token it would load from a shared tier
    instead of its own, plus its queued prefill tokens. What each engine holds
    is learned only from the events its manager publishes (`PrefixIndex`).
    """

    name = "prefix"
    wants_events = True

    def __init__(
        self,
        num_engines: int,
        chunk_tokens: int,
        shared_tiers: Iterable[str] = (),
        shared_cost: float = 0.5,
    ) -> None:
        super().__init__(num_engines, chunk_tokens)
        self.index = PrefixIndex(shared_tiers)
        self.shared_cost = shared_cost
        self._start = 0

    def observe(self, engine: int, events: Iterable[OffloadingEvent]) -> None:
        index = self.index
        for event in events:
            # As vLLM's events name them: host memory by medium, others by name.
            tier = "CPU" if event.tier == CPUOffloadingManager.name else event.tier
            hashes = [offload_key_block_hash(key) for key in event.keys]
            if event.removed:
                index.on_removed(engine, hashes, tier)
            else:
                index.on_stored(engine, hashes, tier)

    def route(
        self, request: SimRequest, prompt_tokens: int, loads: Sequence[int]
    ) -> int:
        per = self.chunk_tokens // request.hash_block_tokens
        chunks = request.num_prompt_tokens // self.chunk_tokens
        hashes = request.hashes
        found = self.index.match([hashes[(c + 1) * per - 1] for c in range(chunks)])
        self._start += 1
        # Engines holding more than the shared prefix, and the least loaded of
        # the rest (for whom only load differs).
        candidates = {least_loaded(loads, self._start)}
        candidates.update(cast(int, e) for e in (*found.local, *found.reach))
        chunk = self.chunk_tokens

        def cost(engine: int) -> float:
            reach = found.reach_blocks(engine)
            local = min(found.local_blocks(engine), reach)
            computed = request.num_prompt_tokens - reach * chunk
            return computed + self.shared_cost * (reach - local) * chunk + loads[engine]

        return min(candidates, key=lambda e: (cost(e), loads[e], e))


def router_names() -> list[str]:
    return list(ROUTERS)


def make_router(
    name: str,
    num_engines: int,
    chunk_tokens: int,
    shared_tiers: Iterable[str] = (),
    shared_cost: float = 0.5,
) -> Router:
    """The router `name` (see `ROUTERS`); ValueError listing the known ones."""
    if name not in ROUTERS:
        raise ValueError(
            f"router {name!r} is not known; expected one of {', '.join(ROUTERS)}"
        )
    if name == PrefixRouter.name:
        return PrefixRouter(num_engines, chunk_tokens, shared_tiers, shared_cost)
    return ROUTERS[name](num_engines, chunk_tokens)
