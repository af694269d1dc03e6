"""Which engines hold which prefixes, learned only from the KV events they publish.

A KV-aware router keeps one `PrefixIndex` and feeds it every engine's event
batches: vLLM's `KVEventBatch` (`BlockStored`, `BlockRemoved`, `AllBlocksCleared`,
as kvoffload publishes them for its tiers through vLLM's connector events) with
`apply`, or the same facts through `on_stored` / `on_removed` / `on_cleared`.
To route a request it computes the request's block hashes as the engines do and
asks `match` how far each engine can serve the prefix.

A block is held by an engine in one or more of its tiers (`medium`, or for a
secondary tier its name in `ownership`), and counts until it has left all of
them. Tiers named in `shared_tiers` (a Redis tier, a shared directory) are one
store every engine reads: what any engine stores there, every engine can load.
Nothing here imports vLLM; events are read by their fields.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

BlockHash = Hashable
EngineId = Hashable


@dataclass(frozen=True)
class PrefixMatch:
    """How many leading blocks of a request each engine can serve.

    `shared`: held by a shared tier (every engine can load them). `local[e]`:
    held by engine `e`'s own tiers (only engines with more than 0). `reach[e]`:
    held by `e`'s own tiers or a shared one, wherever that is more than `shared`.
    """

    shared: int
    local: dict[EngineId, int]
    reach: dict[EngineId, int]

    def local_blocks(self, engine: EngineId) -> int:
        return self.local.get(engine, 0)

    def reach_blocks(self, engine: EngineId) -> int:
        return self.reach.get(engine, self.shared)


class PrefixIndex:
    """Block hashes per engine and tier, and of the shared tiers."""

    def __init__(self, shared_tiers: Iterable[str] = ()) -> None:
        self.shared_tiers = frozenset(shared_tiers)
        self._bit: dict[EngineId, int] = {}
        self._engines: list[EngineId] = []
        # Per engine: block hash -> bitmask of the engine's tiers holding it.
        self._held: list[dict[BlockHash, int]] = []
        # Block hash -> bitmask of the engines holding it in a tier of their own.
        self._holders: dict[BlockHash, int] = {}
        # Block hash -> bitmask of the shared tiers holding it.
        self._shared: dict[BlockHash, int] = {}
        self._tier_bits: dict[str, int] = {}

    # -- feeding -----------------------------------------------------------------

    def apply(self, engine: EngineId, batch: Any) -> None:
        """Apply one event batch of `engine` (a `KVEventBatch`, or anything with
        `events`): stored events carry `parent_block_hash`, removed ones only
        `block_hashes`, and a clear neither."""
        for event in batch.events:
            hashes = getattr(event, "block_hashes", None)
            if hashes is None:
                self.on_cleared(engine)
                continue
            tier = _tier(event)
            if hasattr(event, "parent_block_hash"):
                self.on_stored(engine, hashes, tier)
            else:
                self.on_removed(engine, hashes, tier)

    def on_stored(
        self, engine: EngineId, hashes: Iterable[BlockHash], tier: str
    ) -> None:
        """`engine` stored `hashes` in `tier` (a shared tier: every engine has them)."""
        if tier in self.shared_tiers:
            bit = self._tier_bit(tier)
            for h in hashes:
                self._shared[h] = self._shared.get(h, 0) | bit
            return
        index = self._engine(engine)
        held, tier_bit, engine_bit = self._held[index], self._tier_bit(tier), 1 << index
        holders = self._holders
        for h in hashes:
            tiers = held.get(h, 0)
            if not tiers:
                holders[h] = holders.get(h, 0) | engine_bit
            held[h] = tiers | tier_bit

    def on_removed(
        self, engine: EngineId, hashes: Iterable[BlockHash], tier: str
    ) -> None:
        """`hashes` left `tier` of `engine` (or the shared `tier`)."""
        if tier in self.shared_tiers:
            _drop_bits(self._shared, hashes, self._tier_bit(tier))
            return
        index = self._engine(engine)
        emptied = _drop_bits(self._held[index], hashes, self._tier_bit(tier))
        _drop_bits(self._holders, emptied, 1 << index)

    def on_cleared(self, engine: EngineId) -> None:
        """`engine` dropped everything it held (a cache reset)."""
        index = self._engine(engine)
        held = self._held[index]
        _drop_bits(self._holders, list(held), 1 << index)
        held.clear()

    # -- matching ----------------------------------------------------------------

    def match(self, hashes: Sequence[BlockHash]) -> PrefixMatch:
        """How far each engine can serve a request whose blocks are `hashes`."""
        everyone = (1 << len(self._engines)) - 1
        local_alive = reach_alive = everyone
        shared_depth: int | None = None
        local: dict[EngineId, int] = {}
        reach: dict[EngineId, int] = {}
        depth = 0
        for depth, h in enumerate(hashes):
            holders = self._holders.get(h, 0)
            in_shared = h in self._shared
            if shared_depth is None and not in_shared:
                shared_depth = depth
            self._record(local, local_alive & ~holders, depth)
            local_alive &= holders
            reachers = everyone if in_shared else holders
            self._record(reach, reach_alive & ~reachers, depth)
            reach_alive &= reachers
            if not reach_alive and shared_depth is not None:
                break
        else:
            depth = len(hashes)
            if shared_depth is None:
                shared_depth = depth
            self._record(local, local_alive, depth)
            self._record(reach, reach_alive, depth)
        reach = {e: d for e, d in reach.items() if d > shared_depth}
        return PrefixMatch(shared_depth, local, reach)

    def _record(self, out: dict[EngineId, int], dropped: int, depth: int) -> None:
        """Engines in the bitmask `dropped` serve `depth` blocks (if any)."""
        if not depth:
            return
        while dropped:
            low = dropped & -dropped
            out[self._engines[low.bit_length() - 1]] = depth
            dropped ^= low

    def engines(self) -> list[EngineId]:
        """Engines heard from, in the order first heard."""
        return list(self._engines)

    def __len__(self) -> int:
        """Distinct blocks held by any engine or shared tier."""
        return len(self._holders.keys() | self._shared.keys())

    # -- internals ---------------------------------------------------------------

    def _engine(self, engine: EngineId) -> int:
        index = self._bit.get(engine)
        if index is None:
            index = self._bit[engine] = len(self._engines)
            self._engines.append(engine)
            self._held.append({})
        return index

    def _tier_bit(self, tier: str) -> int:
        bit = self._tier_bits.get(tier)
        if bit is None:
            bit = self._tier_bits[tier] = 1 << len(self._tier_bits)
        return bit


def _tier(event: Any) -> str:
    """A tier's name in vLLM's events: its `ownership` (kvoffload's secondary
    tiers), else its medium (`CPU` for host memory, `GPU` for the device)."""
    owner = getattr(event, "ownership", None)
    if owner:
        return str(owner)
    medium = getattr(event, "medium", None)
    return str(medium) if medium else "GPU"


def _drop_bits(
    table: dict[BlockHash, int], hashes: Iterable[BlockHash], bit: int
) -> list[BlockHash]:
    """Clear `bit` of each hash's mask; returns the hashes left with none."""
    emptied = []
    for h in hashes:
        mask = table.get(h)
        if mask is None or not mask & bit:
            continue
        mask &= ~bit
        if mask:
            table[h] = mask
        else:
            del table[h]
            emptied.append(h)
    return emptied
