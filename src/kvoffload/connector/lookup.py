"""How many tokens past the engine's own prefix hit the tiers can supply.

Walk each group's keys in prefix order from the chunk holding the first token the
engine lacks: `HIT` counts, `HIT_PENDING` counts and defers, `RETRY` defers, `MISS`
stops. A prefix counts only as far as every group can serve it, at least one whole
chunk past the engine's hit, capped by `max_load_tokens` and by the last prompt
token (which the engine must compute itself). The request defers only when the
chunks in flight, once readable, would raise that answer through the same clamps.
Deferrals last at most `max_defer_s` in all, from the first one until the request
is admitted, however often the engine asks; then the request proceeds with what is
readable.

No convoy: when the first chunk a request would load is being loaded into the
engine by another request, the request waits for that load (it lands in the
engine's own prefix cache) instead of loading the same chunks again. On a single
host link its own load would queue behind that one, so waiting is never slower
than loading.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvoffload.connector.base import Clock
from kvoffload.connector.config import ConnectorConfig
from kvoffload.connector.request_state import RequestState
from kvoffload.keys import OffloadKey
from kvoffload.tiers.base import OffloadingManager, PrefixLookup


class LookupPlanner:
    """Answers `get_num_new_matched_tokens` for one request at a time."""

    def __init__(
        self,
        config: ConnectorConfig,
        manager: OffloadingManager,
        clock: Clock,
        loading: Mapping[OffloadKey, int],
    ):
        self._config = config
        self._loading = loading
        self._manager = manager
        self._clock = clock
        self._all_offloaded = all(g.offloaded for g in config.groups)

    def num_loadable_tokens(
        self, state: RequestState, num_computed_tokens: int
    ) -> int | None:
        """Tokens to load past `num_computed_tokens`, or `None` to be asked again.

        `None` only while waiting may give the request more than it gets now:
        chunks in flight (or a tier that could not answer yet) lie within what it
        could load, clamped as the answer is, or another request is loading the
        first chunk it would load. Never past its deferral bound.
        """
        cap = state.ctx.params.max_load_tokens
        if cap == 0 or not self._all_offloaded or state.load_failed:
            return 0
        state.refresh_keys()
        firsts = [num_computed_tokens // g.tokens_per_chunk for g in state.groups]
        # All groups in one call: a promotion for one group must not evict what
        # another group counted.
        founds = self._manager.lookup_prefixes(
            [g.keys[first:] for g, first in zip(state.groups, firsts, strict=True)],
            state.ctx,
        )
        now = self._clamp(
            state,
            num_computed_tokens,
            _hit_end(state, firsts, founds, in_flight=False),
            cap,
        )
        bound = self._clamp(
            state,
            num_computed_tokens,
            _hit_end(state, firsts, founds, in_flight=True),
            cap,
        )
        # The chunk at `first` holds the token at `num_computed_tokens`, so another
        # request's load of it serves this one only if its bound is past that token.
        must_wait = bound > now or (bound > 0 and self._being_loaded(state, firsts))
        if must_wait and self._may_defer(state):
            return None
        return now

    def _being_loaded(self, state: RequestState, firsts: list[int]) -> bool:
        """Whether another request is loading a first chunk of this one into an
        engine that keeps it in its own prefix cache."""
        return self._config.engine_prefix_caching and any(
            first < len(g.keys) and g.keys[first] in self._loading
            for g, first in zip(state.groups, firsts, strict=True)
        )

    def _clamp(
        self, state: RequestState, computed: int, hit_end: int, cap: int | None
    ) -> int:
        align = self._config.block_alignment
        # The engine computes at least the last known token itself.
        end = min(hit_end, state.request.num_tokens - 1)
        external = (end - computed) // align * align if end > computed else 0
        if cap is not None:
            external = min(external, cap // align * align)
        if external < self._config.min_chunk_tokens:
            return 0
        return external

    def _may_defer(self, state: RequestState) -> bool:
        """Whether the request may wait now: for `max_defer_s` from its first
        deferral, however often it is asked meanwhile (vLLM asks every step while
        it cannot schedule the request), and never again until it is admitted
        or preempted (`RequestState.deferred_since`)."""
        now = self._clock()
        if state.deferred_since is None:
            state.deferred_since = now
        return now - state.deferred_since < self._config.max_defer_s


def _hit_end(
    state: RequestState,
    firsts: list[int],
    founds: list[PrefixLookup],
    *,
    in_flight: bool,
) -> int:
    """Where the prefix every group can serve ends: what is readable now, or, with
    `in_flight`, also what is in flight (all of a group's keys where its tier
    could not answer yet)."""
    ends = []
    for group, first, found in zip(state.groups, firsts, founds, strict=True):
        if not in_flight:
            chunks = first + found.ready
        elif found.retry:
            chunks = len(group.keys)
        else:
            chunks = first + found.present
        ends.append(chunks * group.tokens_per_chunk)
    return min(ends)
