"""Per-request state of the tiering manager: writes in flight, parked cascades.

A request's secondary tiers are told it finished only when no cascade for it can
follow: its own primary writes and the promotions its lookups started have ended
(both cascade when they land), and the chunks it parked for a request-level
cascade have been written (or failed).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kvoffload.keys import OffloadKey
from kvoffload.tiers.base import ReqContext


@dataclass
class RequestState:
    ctx: ReqContext
    request_level_tiers: tuple[int, ...]
    """Indices of the tiers that want every chunk of this request."""
    writing: int = 0
    """Chunks this request is writing into the primary tier."""
    parked: int = 0
    """Chunks waiting for their primary write before a request-level cascade."""
    promoting: int = 0
    """Chunks this request's lookups are promoting into the primary tier."""
    finished: bool = False
    promoted: dict[OffloadKey, int] = field(default_factory=dict)
    """Chunks this request's lookups found in a secondary tier (by index) and
    promoted: their first load counts as that tier's hit tokens."""

    @property
    def finalizable(self) -> bool:
        return (
            self.finished
            and self.writing == 0
            and self.parked == 0
            and self.promoting == 0
        )


class RequestTracker:
    """Request states, the writer of each in-flight primary chunk, parked keys."""

    def __init__(self) -> None:
        self._states: dict[str, RequestState] = {}
        self._writer: dict[OffloadKey, str] = {}
        self._parked: dict[OffloadKey, list[str]] = {}

    def __len__(self) -> int:
        return len(self._states)

    def add(
        self, ctx: ReqContext, request_level_tiers: tuple[int, ...]
    ) -> RequestState:
        state = self._states.get(ctx.req_id)
        if state is None:
            state = self._states[ctx.req_id] = RequestState(ctx, request_level_tiers)
        else:  # a repeated on_new_request (preemption) keeps in-flight counts
            state.ctx, state.request_level_tiers = ctx, request_level_tiers
            state.finished = False
        return state

    def get(self, req_id: str) -> RequestState | None:
        return self._states.get(req_id)

    def pop(self, req_id: str) -> RequestState | None:
        return self._states.pop(req_id, None)

    def writing_started(self, req_id: str, keys: Sequence[OffloadKey]) -> None:
        state = self._states[req_id]
        for key in keys:
            if key not in self._writer:
                self._writer[key] = req_id
                state.writing += 1

    def writer(self, key: OffloadKey) -> str | None:
        """The request writing `key` into the primary tier, if any."""
        return self._writer.get(key)

    def writing_done(self, keys: Iterable[OffloadKey]) -> dict[str, list[OffloadKey]]:
        """Forget the writers of `keys`; returns the keys each request finished."""
        done: dict[str, list[OffloadKey]] = {}
        for key in keys:
            req_id = self._writer.pop(key, None)
            if req_id is None:
                continue
            self._states[req_id].writing -= 1
            done.setdefault(req_id, []).append(key)
        return done

    def park(self, req_id: str, key: OffloadKey) -> None:
        waiting = self._parked.setdefault(key, [])
        if req_id not in waiting:
            waiting.append(req_id)
            self._states[req_id].parked += 1

    def take_parked(self, key: OffloadKey) -> list[str]:
        """The requests waiting for `key`'s primary write, no longer waiting."""
        waiting = self._parked.pop(key, [])
        for req_id in waiting:
            self._states[req_id].parked -= 1
        return waiting

    def drop_in_flight(self) -> None:
        """Forget every in-flight write, promotion, parked key and promoted
        chunk (the primary tier resets)."""
        self._writer.clear()
        self._parked.clear()
        for state in self._states.values():
            state.writing = state.parked = state.promoting = 0
            state.promoted.clear()

    def finalizable(self) -> list[RequestState]:
        return [s for s in self._states.values() if s.finalizable]
