"""How many tokens past the engine's own prefix hit the tiers can supply.

Walk each group's keys in prefix order from the chunk holding the first token the
engine lacks: `HIT` counts, `HIT_PENDING` counts and defers, `RETRY` defers, `MISS`
stops. A prefix counts only as far as every group can serve it, at least one whole
chunk past the engine's hit, capped by `max_load_tokens` and by the last prompt
token (which the engine must compute itself). A deferral lasts at most
`max_defer_s`; then the request proceeds with what is readable.

No convoy: when the first chunk a request needs is being loaded into the engine by
another request, the request waits for that load (it lands in the engine's own
prefix cache) instead of loading the same chunks again. On a single host link its
own load would queue behind that one, so waiting is never slower than loading.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvoffload.connector.base import Clock
from kvoffload.connector.config import ConnectorConfig
from kvoffload.connector.request_state import RequestState
from kvoffload.keys import OffloadKey
from kvoffload.tiers.base import OffloadingManager


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
        """Tokens to load past `num_computed_tokens`, or `None` to be asked again."""
        cap = state.ctx.params.max_load_tokens
        if cap == 0 or not self._all_offloaded or state.load_failed:
            return 0
        state.refresh_keys()
        firsts = [num_computed_tokens // g.tokens_per_chunk for g in state.groups]
        must_wait = self._config.engine_prefix_caching and any(
            # another request is loading it into the engine
            first < len(g.keys) and g.keys[first] in self._loading
            for g, first in zip(state.groups, firsts, strict=True)
        )
        # All groups in one call: a promotion for one group must not evict what
        # another group counted.
        founds = self._manager.lookup_prefixes(
            [g.keys[first:] for g, first in zip(state.groups, firsts, strict=True)],
            state.ctx,
        )
        hit_end = min(
            (first + found.ready) * g.tokens_per_chunk
            for g, first, found in zip(state.groups, firsts, founds, strict=True)
        )
        must_wait = must_wait or any(found.must_wait for found in founds)
        external = self._clamp(state, num_computed_tokens, hit_end, cap)
        if must_wait and self._may_defer(state):
            return None
        state.deferred_since = None
        return external

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
        now = self._clock()
        if state.deferred_since is None:
            state.deferred_since = now
            return True
        return now - state.deferred_since < self._config.max_defer_s
