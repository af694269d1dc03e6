"""Turning chunk decisions into transfer jobs: loads into and stores from engine blocks.

A chunk of group g spans `blocks_per_chunk` engine blocks; its host blocks are
`slot * blocks_per_chunk + i`. A load may start in the middle of a chunk (the engine
already holds its first blocks) and end in the middle of one (the engine computes
the last prompt token itself).
"""

from __future__ import annotations

from collections.abc import Container, Sequence

from kvoffload.connector.config import GroupSpec
from kvoffload.connector.request_state import REUSED_BLOCK, GroupState, RequestState
from kvoffload.keys import OffloadKey
from kvoffload.tiers.base import OffloadingManager, PrepareStoreOutput
from kvoffload.worker.base import GroupTransfer


def plan_load(
    manager: OffloadingManager,
    state: RequestState,
    start_token: int,
    end_token: int,
    null_block: int | None = None,
) -> tuple[tuple[OffloadKey, ...], tuple[GroupTransfer, ...]] | None:
    """Pin the chunks covering tokens [start, end) of every group and map their blocks.

    Returns the pinned keys (for `complete_load`) and the per-group transfers, or
    `None`, pinning nothing, when a chunk is no longer readable.
    Engine blocks equal to `null_block` (outside a sliding window) are skipped.
    """
    spans: list[tuple[GroupState, int, int, int, int]] = []
    keys: list[OffloadKey] = []
    for group in state.groups:
        first_block = start_token // group.tokens_per_block
        end_block = end_token // group.tokens_per_block
        chunks = load_span(group, start_token, end_token)
        spans.append((group, first_block, end_block, chunks.start, len(keys)))
        keys.extend(group.keys[chunks.start : chunks.stop])
    slots = manager.prepare_load(keys, state.ctx)
    if slots is None:
        return None
    transfers: list[GroupTransfer] = []
    for group, first_block, end_block, first_chunk, key_offset in spans:
        per = group.blocks_per_chunk
        engine: list[int] = []
        host: list[int] = []
        for block in range(first_block, end_block):
            if group.block_ids[block] == null_block:
                continue
            chunk = block // per
            engine.append(group.block_ids[block])
            host.append(slots[key_offset + chunk - first_chunk] * per + block % per)
        transfers.append(GroupTransfer(group.index, tuple(engine), tuple(host)))
    return tuple(keys), tuple(transfers)


def load_tokens(
    state: RequestState, start_token: int, end_token: int
) -> dict[OffloadKey, int]:
    """The tokens of [start, end) that each chunk a load reads holds, per group."""
    out: dict[OffloadKey, int] = {}
    for group in state.groups:
        size = group.tokens_per_chunk
        span = load_span(group, start_token, end_token)
        for chunk in range(span.start, min(span.stop, len(group.keys))):
            first = max(chunk * size, start_token)
            out[group.keys[chunk]] = min((chunk + 1) * size, end_token) - first
    return out


def load_span(group: GroupState, start_token: int, end_token: int) -> range:
    """The chunks of `group` whose blocks a load of tokens [start, end) fills
    (whole blocks only: a partial last block is left to the engine)."""
    per = group.blocks_per_chunk
    first_block = start_token // group.tokens_per_block
    end_block = end_token // group.tokens_per_block
    return range(first_block // per, (end_block - 1) // per + 1)


def chunks_to_store(
    state: RequestState, offloadable_tokens: int, null_block: int | None = None
) -> list[tuple[GroupState, int]]:
    """(group, chunk index) of the whole chunks past each cursor within the limit.

    A chunk with a block equal to `null_block` or `REUSED_BLOCK` holds no data of
    the request any more (it left a sliding window before it could be stored, and
    maybe went to another request): it is skipped, not stored.
    """
    gone = {REUSED_BLOCK} if null_block is None else {REUSED_BLOCK, null_block}
    out: list[tuple[GroupState, int]] = []
    for group in state.groups:
        for c in range(group.store_cursor, group.whole_chunks(offloadable_tokens)):
            if gone.isdisjoint(group.chunk_blocks(c)):
                out.append((group, c))
    return out


def anchor_store(
    manager: OffloadingManager,
    state: RequestState,
    chunks: list[tuple[GroupState, int]],
    null_block: int | None = None,
    unoffered: Container[OffloadKey] = (),
) -> tuple[list[tuple[GroupState, int]], list[OffloadKey], int]:
    """Of `chunks` (from `chunks_to_store`), those worth storing; the held
    chunks right before them, to offer with them; and how many were skipped.

    A lookup walks the tier from the end of the engine's own hit, so a group's
    chunks that follow one the tier does not hold (`holds` is `False`; the
    request had it from the engine's cache) can hit only while the engine
    still keeps that chunk; once the engine gives it up, a later request
    recomputes it and stores it, and them, again. This is a bet on the regime
    where it arises: the tier gave up a chunk the engine had, so both are
    under pressure, and by the conversation's next turn the engine has most
    likely turned over too; storing them would evict chunks that can hit from
    the start of a prompt. They are skipped, and their cursor moves past them
    (measured in docs/policies.md, "No store behind a gap"). A chunk whose
    blocks left a sliding window is no gap: it was never to be stored. Nor is
    a run of chunks the tier never had because an earlier request held them
    past its store limit (`unoffered`: the chunk where its prompt ended and
    its answer began): the request has them in its engine blocks and stores
    them with its own (`connector.unoffered`), or alone when it has none (the
    engine served all its whole chunks).

    The chunks of the engine's hit that the tier holds right before a group's
    first stored one are its prefix in the tier: offered with the store, they
    are left out of it but rank it (victims come from below them, as below
    chunks it loaded; see `OffloadingManager.prepare_store`), so it cannot evict
    what its own chunks need to hit.
    """
    gone = {REUSED_BLOCK} if null_block is None else {REUSED_BLOCK, null_block}
    kept: list[tuple[GroupState, int]] = []
    prefix: list[OffloadKey] = []
    skipped = 0
    for group in state.groups:
        mine = [(g, c) for g, c in chunks if g is group]
        if not mine:
            # Nothing new (the engine served the whole prompt): the chunks the
            # tier never had right before the cursor are still worth storing.
            cursor = min(group.store_cursor, group.whole_chunks(state.store_limit))
            if cursor <= 0 or group.keys[cursor - 1] not in unoffered:
                continue
            filled = _never_offered(manager, group, cursor, unoffered, gone)
            if not filled:
                continue
            mine = [(group, c) for c in filled]
        first = mine[0][1]
        if first == 0:
            kept.extend(mine)
            continue
        held = manager.holds(group.keys[first - 1])
        if held is False and gone.isdisjoint(group.chunk_blocks(first - 1)):
            filled = _never_offered(manager, group, first, unoffered, gone)
            if filled is None:
                group.store_cursor = max(group.store_cursor, mine[-1][1] + 1)
                skipped += len(mine)
                continue
            mine = [(group, c) for c in filled] + mine
            first = filled[0]
        # Chunks the request loaded or stored rank its stores already.
        before = first - 1
        if first > state.engine_hit_tokens // group.tokens_per_chunk:
            before = -1
        run: list[OffloadKey] = []
        while before >= 0 and manager.holds(group.keys[before]) is True:
            run.append(group.keys[before])
            before -= 1
        prefix.extend(reversed(run))
        kept.extend(mine)
    return kept, prefix, skipped


def _never_offered(
    manager: OffloadingManager,
    group: GroupState,
    first: int,
    unoffered: Container[OffloadKey],
    gone: set[int],
) -> list[int] | None:
    """The chunks the tier lacks right before `first`, back to one it holds or
    to the start, if every one of them is `unoffered` and still in the request's
    engine blocks; `None` otherwise."""
    run: list[int] = []
    c = first - 1
    while c >= 0 and manager.holds(group.keys[c]) is False:
        if group.keys[c] not in unoffered or not gone.isdisjoint(group.chunk_blocks(c)):
            return None
        run.append(c)
        c -= 1
    run.reverse()
    return run


def store_transfers(
    chunks: list[tuple[GroupState, int]], prepared: PrepareStoreOutput
) -> tuple[GroupTransfer, ...]:
    """Engine blocks → host blocks for the chunks `prepare_store` allocated."""
    slot_of = dict(zip(prepared.keys_to_store, prepared.slots, strict=True))
    by_group: dict[int, tuple[list[int], list[int]]] = {}
    for group, chunk in chunks:
        slot = slot_of.get(group.keys[chunk])
        if slot is None:
            continue
        engine, host = by_group.setdefault(group.index, ([], []))
        per = group.blocks_per_chunk
        engine.extend(group.chunk_blocks(chunk))
        host.extend(range(slot * per, (slot + 1) * per))
    return tuple(
        GroupTransfer(index, tuple(engine), tuple(host))
        for index, (engine, host) in sorted(by_group.items())
    )


def transfer_slots(
    transfers: Sequence[GroupTransfer], groups: Sequence[GroupSpec]
) -> tuple[int, ...]:
    """The host slots whose blocks `transfers` copy, each once, in order."""
    slots = {
        block // groups[t.group].blocks_per_chunk
        for t in transfers
        for block in t.host_blocks
    }
    return tuple(sorted(slots))
