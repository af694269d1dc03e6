"""The reused-block guard: table entries of unstored chunks whose engine block the
engine has handed to someone else are voided, never stored from.

vLLM frees a running request's sliding-window blocks once they leave the window,
without telling the connector, and may allocate them to any request in any group
(the groups share one block pool over the same bytes). A block the engine
allocates afresh therefore voids every entry naming it in a live request's
chunks that may still be stored. The guard keeps, per engine block, the groups
whose unstored chunks name it, so each fresh block costs one lookup, however
many requests are live and however long their unstored spans.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvoffload.connector.config import GroupSpec
from kvoffload.connector.request_state import REUSED_BLOCK, GroupState, RequestState


class ReuseGuard:
    """Which groups' unstored chunks name each engine block.

    A group's indexed positions are `GroupState.guarded`: its table from the store
    cursor's chunk up to the last chunk the request may ever store
    (`RequestState.store_limit`). Call `release` before a table is replaced or
    cleared and when the request finishes, and `sync` after its table grew or its
    cursor moved. A table that came whole with this step's allocation
    (`on_new_table`) is indexed at the end of the step: nothing in it is stale.
    """

    def __init__(self, groups: Sequence[GroupSpec], null_block: int | None) -> None:
        self._specs = tuple(groups)
        self._null = null_block
        self._holders: dict[int, GroupState | list[GroupState]] = {}
        # Blocks allocated afresh since the last step plan, and the requests whose
        # whole table came with this step's allocation.
        self._fresh: set[int] = set()
        self._new_tables: dict[str, RequestState] = {}

    # -- what the engine did -----------------------------------------------------

    def note_allocated(self, tables: Sequence[Sequence[int]], hit_tokens: int) -> None:
        """Blocks past the first `hit_tokens` of a table are allocated afresh (the
        engine's prefix-cache hits before them keep their KV).

        Block ids name engine memory whatever the group: vLLM's groups share one
        block pool over the same bytes, so a block freed from one group's table
        may come back in another's.
        """
        fresh = self._fresh
        if not hit_tokens:  # the common case: blocks appended to a running request
            for ids in tables:
                fresh.update(ids)
            return
        for spec, ids in zip(self._specs, tables, strict=True):
            fresh.update(ids[hit_tokens // spec.tokens_per_block :])

    def on_new_table(self, state: RequestState) -> None:
        """The request's whole table came with this step's allocation (released
        beforehand): index it once this step's fresh blocks are voided."""
        self._new_tables[state.req_id] = state

    def void_reused(self) -> None:
        """Void the entries naming this step's fresh blocks in unstored chunks.

        Call before any table grows by this step's blocks: a block given to a
        request late in the step voids entries of one early in it.
        """
        fresh, self._fresh = self._fresh, set()
        fresh.discard(self._null)
        holders = self._holders
        for block in fresh:
            held = holders.pop(block, None)
            if held is None:
                continue
            for group in held if isinstance(held, list) else (held,):
                _void(group, block)

    def end_step(self) -> None:
        """Index the tables that came whole this step."""
        new, self._new_tables = self._new_tables, {}
        for state in new.values():
            if not state.finished:
                self.sync(state)

    # -- keeping the index -------------------------------------------------------

    def sync(self, state: RequestState) -> None:
        """Index the positions of the request's unstored chunks, after its table
        grew (in place) or its store cursors moved. Call it only after this
        step's `void_reused`."""
        limit = state.store_limit
        for group in state.groups:
            per = group.blocks_per_chunk
            stop = min(len(group.block_ids), limit // group.tokens_per_chunk * per)
            start = group.store_cursor * per
            have = group.guarded
            if start >= stop and not have:
                continue  # nothing unstored, as in decode past a stored prompt
            want = range(min(start, stop), stop)
            if want == have:
                continue
            # Between releases a table only grows in place, so the positions in
            # both ranges still name the blocks indexed: move the difference.
            self._drop(group, range(have.start, min(have.stop, want.start)))
            self._drop(group, range(max(have.start, want.stop), have.stop))
            self._add(group, range(want.start, min(want.stop, have.start)))
            self._add(group, range(max(want.start, have.stop), want.stop))
            group.guarded = want

    def release(self, state: RequestState) -> None:
        """Forget the request's table (about to be replaced or cleared, or the
        request is finished)."""
        self._new_tables.pop(state.req_id, None)
        for group in state.groups:
            self._drop(group, group.guarded)
            group.guarded = range(0)

    def _add(self, group: GroupState, positions: range) -> None:
        holders, ids, null = self._holders, group.block_ids, self._null
        for block in ids[positions.start : positions.stop]:
            if block in (REUSED_BLOCK, null):
                continue
            held = holders.get(block)
            if held is None:
                holders[block] = group
            elif isinstance(held, list):
                held.append(group)
            else:
                holders[block] = [held, group]

    def _drop(self, group: GroupState, positions: range) -> None:
        holders = self._holders
        for block in group.block_ids[positions.start : positions.stop]:
            held = holders.get(block)
            if held is group:
                del holders[block]
            elif isinstance(held, list):
                for i, other in enumerate(held):
                    if other is group:
                        del held[i]
                        break
                if len(held) == 1:
                    holders[block] = held[0]


def _void(group: GroupState, block: int) -> None:
    """Mark every indexed entry of `group` naming `block` as reused."""
    ids, span = group.block_ids, group.guarded
    start, stop = span.start, min(span.stop, len(ids))
    while True:
        try:
            start = ids.index(block, start, stop)
        except ValueError:
            return
        ids[start] = REUSED_BLOCK
