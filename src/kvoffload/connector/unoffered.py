"""Chunks a finished request had in the engine but never offered to the tiers.

With `offload_prompt_only` (the default) a request stores the chunks inside its
prompt. The chunk where its prompt ends fills up with the first tokens of its
answer (and longer answers fill more): the engine caches it, the tiers never see
it. In a chat the next turn's prompt carries that answer, so the engine serves
the chunk to the conversation's next turn from its prefix cache; the turn's own
stores start past that hit, and the tier holds the conversation's prompt chunks
up to the chunk that was never offered, and none after it. That is not the gap
"no store behind a gap" bets on (the tier giving up a chunk the engine still
had, `transfers.anchor_store`): nothing was given up, and the turn has the
chunk in its engine blocks. The connector remembers such chunks, so the turn
stores them with its own and its new chunks are reachable from the prompt's
start; a turn with no new whole chunk (the engine served them all) stores them
alone, so that a turn which finds them gone from the engine loads them (answers
of a chunk or more leave one such chunk per turn).

Memory is bounded: at most `MAX_REMEMBERED` keys, the oldest forgotten first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from kvoffload.connector.request_state import RequestState
from kvoffload.keys import OffloadKey

MAX_REMEMBERED = 8192


class UnofferedChunks:
    """Keys of whole chunks finished requests held past their store limit."""

    __slots__ = ("_keys",)

    def __init__(self) -> None:
        self._keys: OrderedDict[OffloadKey, None] = OrderedDict()

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def note_finished(self, state: RequestState) -> None:
        """Remember the whole chunks of `state` (its keys refreshed) past its
        store limit: its stores never offered them."""
        keys = self._keys
        for group in state.groups:
            first = min(state.store_limit // group.tokens_per_chunk, len(group.keys))
            for key in group.keys[first:]:
                keys[key] = None
                keys.move_to_end(key)
        while len(keys) > MAX_REMEMBERED:
            keys.popitem(last=False)

    def discard(self, keys: Iterable[OffloadKey]) -> None:
        """`keys` were stored: a gap there from now on is one the tier made."""
        pop = self._keys.pop
        for key in keys:
            pop(key, None)

    def clear(self) -> None:
        self._keys.clear()
