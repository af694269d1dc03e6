"""Which chunks live requests hold in the engine, counted as requests change.

With an engine prefix cache, a chunk a live request holds in its engine blocks is
served by the engine to every request with that prefix, for as long as any such
request runs: its host copy is insurance. When a finished request's release
falls due (`releases`), the chunks of its engine hit that a live request of
another conversation holds are left out of its touch: a system prompt shared by
every conversation would otherwise be refreshed at every release and take room
in the tier that the engine never asks for. A live request that holds the released
request's last chunk continues its conversation, and the engine's copy leaves
with it: such a holder does not count.

The holders are counted per chunk and kept up to date as a request's keys and
engine blocks change (`sync`) and when it ends or is preempted (`drop`), so the
cost is per chunk a request gains or loses, not a walk over every live request
at each release. A request holds the chunks whose keys it knows and whose
blocks are all in its table: a prefix of its keys, per group.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvoffload.connector.request_state import GroupState
from kvoffload.keys import OffloadKey


class HeldChunks:
    """Live holders per chunk; `enabled=False` (no engine prefix cache) counts
    nothing and leaves every touch whole."""

    def __init__(self, enabled: bool = True) -> None:
        self._enabled = enabled
        self._holders: dict[OffloadKey, int] = {}
        # Per live request, per group: the keys counted for it (a prefix of its
        # keys, kept here because a rewrite drops keys from the request).
        self._counted: dict[str, list[list[OffloadKey]]] = {}

    def holders(self, key: OffloadKey) -> int:
        """Live requests that hold the chunk in the engine."""
        return self._holders.get(key, 0)

    def sync(self, req_id: str, groups: Sequence[GroupState]) -> None:
        """The request's keys or engine blocks changed: count what it holds now."""
        if not self._enabled:
            return
        counted = self._counted.get(req_id)
        if counted is None:
            counted = self._counted[req_id] = [[] for _ in groups]
        holders = self._holders
        for group, have in zip(groups, counted, strict=True):
            held = min(len(group.keys), len(group.block_ids) // group.blocks_per_chunk)
            known = len(have)
            if held > known:
                gained = group.keys[known:held]
                for key in gained:
                    holders[key] = holders.get(key, 0) + 1
                have.extend(gained)
            elif held < known:
                self._let_go(have[held:])
                del have[held:]

    def drop(self, req_id: str) -> None:
        """The request holds nothing any more (it finished, or was preempted)."""
        counted = self._counted.pop(req_id, None)
        if counted is not None:
            for have in counted:
                self._let_go(have)

    def _let_go(self, keys: Sequence[OffloadKey]) -> None:
        holders = self._holders
        for key in keys:
            left = holders[key] - 1
            if left:
                holders[key] = left
            else:
                del holders[key]

    def held_elsewhere(
        self, engine_hit: Iterable[tuple[Sequence[OffloadKey], OffloadKey]]
    ) -> set[OffloadKey]:
        """Of a released request's engine hit (per group: the chunks, and the
        request's last chunk there), those a live request of another
        conversation holds.

        Every live request holding the released one's last chunk of a group
        holds its whole prefix there (keys chain the tokens before them), so a
        hit chunk has a holder of another conversation exactly when it has more
        holders than that last chunk."""
        held: set[OffloadKey] = set()
        holders = self._holders
        if holders:
            for keys, tail in engine_hit:
                continuing = holders.get(tail, 0)
                held.update(key for key in keys if holders.get(key, 0) > continuing)
        return held
