"""Whether a request's stores may evict the head it loaded: a bet on the engine.

A request that loaded its head (chunks past the engine's own hit) from the host
tier and then computes its tail stores the tail. When the tier is full and its
policy would give up that loaded head before anything else, there are two
answers, and each is right in one regime:

- *keep the head* (refuse the store): right when the engine has let the head
  go by the time the conversation comes back. The next turn loads the head
  from the tier and recomputes the tail; evicting the head would have cost the
  head and stranded the tail behind the gap.
- *store the tail over the head* (what vLLM's own connector does): right when
  the engine still holds the head at the return. The head comes from the
  engine, the lookup starts past it, and the tail hits in the tier; keeping the
  head would have kept a copy nobody asks for and lost the tail.

Which regime holds depends on how soon conversations come back against how
fast the engine turns its blocks over, which only the running workload shows.
So the connector measures it: when a request that loaded a head finishes, it
notes where its head and its prompt end; when a later request looks up the
same prefix, its engine hit says which answer would have won. A return whose
engine hit covers the whole prompt says nothing (either answer serves it), nor
does one that never comes. The bet is on the tail while the tail's wins,
decayed so that the recent workload counts most, outweigh the head's; until
the first informative return it stays on the head (docs/policies.md, "Inside a
real engine": the own-prefix rule).

The engine's hit does not depend on what the host tier chose, so the measure
is the same whichever answer is in force. Memory is bounded: at most
`MAX_PENDING` finished requests wait for their return; the oldest go first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from kvoffload.connector.request_state import RequestState
from kvoffload.keys import OffloadKey

MAX_PENDING = 4096
"""Finished requests remembered until a later request shares their head."""

DECAY = 0.9
"""Weight of the earlier outcomes at each new one: the last ten or so count."""


class HeadBets:
    """Measures which answer recent returns favoured; says which to take now."""

    __slots__ = ("_head", "_pending", "_tail")

    def __init__(self) -> None:
        # Key of a loaded head's last chunk -> (chunks to the head's end,
        # chunks to the prompt's end), for one group's keys.
        self._pending: OrderedDict[OffloadKey, tuple[int, int]] = OrderedDict()
        self._head = 0.0
        self._tail = 0.0

    def note_finished(
        self, keys: Sequence[OffloadKey], head_chunks: int, prompt_chunks: int
    ) -> None:
        """A request finished that loaded its chunks up to `head_chunks` and
        computed the rest of its prompt, up to `prompt_chunks` (of `keys`)."""
        prompt_chunks = min(prompt_chunks, len(keys))
        if not 0 < head_chunks < prompt_chunks:
            return
        pending = self._pending
        key = keys[head_chunks - 1]
        pending[key] = (head_chunks, prompt_chunks)
        pending.move_to_end(key)
        if len(pending) > MAX_PENDING:
            pending.popitem(last=False)

    def note_lookup(self, keys: Sequence[OffloadKey], engine_hit_chunks: int) -> None:
        """A request with `keys` found its first `engine_hit_chunks` in the engine:
        score the noted heads it shares."""
        pending = self._pending
        if not pending:
            return
        for key in keys:
            if key not in pending:
                continue
            head, prompt = pending.pop(key)
            prompt = min(prompt, len(keys))
            if engine_hit_chunks >= prompt:
                continue  # the engine served it all: either answer would do
            if engine_hit_chunks >= head:
                self._tail = self._tail * DECAY + 1.0
                self._head *= DECAY
            else:
                self._head = self._head * DECAY + 1.0
                self._tail *= DECAY

    def note_request_finished(self, state: RequestState) -> None:
        """`note_finished` for a finished request (its keys refreshed), by its
        first group, if it loaded a head."""
        if state.loaded_from_tiers and state.groups:
            group = state.groups[0]
            per = group.tokens_per_chunk
            head, prompt = (
                state.hit_tokens // per,
                state.request.num_prompt_tokens // per,
            )
            self.note_finished(group.keys, head, prompt)

    def note_request_scheduled(self, state: RequestState) -> None:
        """`note_lookup` for a request at its first schedule (its keys
        refreshed, its engine hit set), by its first group."""
        if state.groups:
            group = state.groups[0]
            self.note_lookup(
                group.keys, state.engine_hit_tokens // group.tokens_per_chunk
            )

    def tail_first(self) -> bool:
        """Whether a store may now evict its request's loaded head."""
        return self._tail > self._head

    def clear(self) -> None:
        self._pending.clear()
        self._head = self._tail = 0.0
