"""Per-request state of the scheduler-side connector.

Created on first sight of a request, it holds the request's keys per group as its
chunks fill, its engine block table, the store cursor per group, the chunks it hit,
its parsed parameters and its offload policy.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvoffload.connector.base import RequestInfo
from kvoffload.connector.config import ConnectorConfig
from kvoffload.keys import GROUP_INDEX_BYTES, OffloadKey
from kvoffload.tiers.base import OffloadPolicy, ReqContext

REUSED_BLOCK = -1
"""A table entry whose engine block was handed to another request before its chunk
was stored: the block holds someone else's KV now, so the chunk is never stored."""


@dataclass
class GroupState:
    """One KV-cache group of one request."""

    index: int
    tokens_per_block: int
    blocks_per_chunk: int
    hashes_per_chunk: int
    keys: list[OffloadKey] = field(default_factory=list)
    block_ids: list[int] = field(default_factory=list)
    store_cursor: int = 0
    """Chunks before the cursor were stored, skipped or offered already."""
    guarded: range = range(0)
    """Positions of `block_ids` the reused-block guard indexes (`ReuseGuard`)."""

    @property
    def tokens_per_chunk(self) -> int:
        return self.tokens_per_block * self.blocks_per_chunk

    def refresh_keys(self, block_hashes: Sequence[bytes]) -> bool:
        """Add the keys of chunks that became full since the last call; whether
        there were any."""
        step = self.hashes_per_chunk
        full = len(block_hashes) // step
        known = len(self.keys)
        if full <= known:
            return False
        suffix = self.index.to_bytes(GROUP_INDEX_BYTES, "big")
        for c in range(known, full):
            self.keys.append(OffloadKey(block_hashes[(c + 1) * step - 1] + suffix))
        return True

    def drop_keys_past(self, num_tokens: int) -> list[OffloadKey]:
        """Drop the keys of chunks not wholly within the first `num_tokens`
        tokens, and bring the store cursor back to the first of them (they are
        offered again under their new keys). Returns the keys dropped."""
        keep = num_tokens // self.tokens_per_chunk
        dropped = self.keys[keep:]
        del self.keys[keep:]
        self.store_cursor = min(self.store_cursor, keep)
        return dropped

    def chunk_blocks(self, chunk: int) -> list[int]:
        b = self.blocks_per_chunk
        return self.block_ids[chunk * b : (chunk + 1) * b]

    def whole_chunks(self, num_tokens: int) -> int:
        """The chunks within the first `num_tokens` that have keys and blocks."""
        return min(
            num_tokens // self.tokens_per_chunk,
            len(self.keys),
            len(self.block_ids) // self.blocks_per_chunk,
        )


@dataclass
class RequestState:
    """Everything the connector remembers about one live request."""

    request: RequestInfo
    ctx: ReqContext
    policy: OffloadPolicy
    groups: list[GroupState]
    load_job: int | None = None
    store_jobs: set[int] = field(default_factory=set)
    jobs_in_flight: int = 0
    """Its load and store jobs not completed yet (on every rank)."""
    hit_tokens: int = 0
    """Tokens the engine started from at first schedule: its own hit, plus what
    that schedule's load supplied once the load succeeded."""
    load_hit_tokens: int = 0
    """While the first schedule's load is in flight, where its hit ends; 0 else."""
    deferred_since: float | None = None
    """When the lookup first deferred the request; kept across its answers until
    it is admitted or preempted, so deferrals add up to at most `max_defer_s`."""
    engine_hit_tokens: int = 0
    """The engine's own prefix-cache hit at the first schedule: chunks neither
    loaded nor computed by the request."""
    load_failed: bool = False
    """A load for this request failed: it recomputes, and loads nothing more."""
    stored: set[OffloadKey] = field(default_factory=set)
    """Keys whose stores this request started (not those it found stored)."""
    cursors_started: bool = False
    prefix_touched: bool = False
    finished: bool = False
    store_limit: int = sys.maxsize
    """The most tokens its stores may ever cover: the prompt with
    `offload_prompt_only` (as it stands: a rewrite may extend it), and at most its
    `max_offload_tokens`."""

    @classmethod
    def create(
        cls,
        request: RequestInfo,
        policy: OffloadPolicy,
        ctx: ReqContext,
        config: ConnectorConfig,
    ) -> RequestState:
        groups = [
            GroupState(
                index=i,
                tokens_per_block=g.tokens_per_block,
                blocks_per_chunk=g.blocks_per_chunk,
                hashes_per_chunk=g.tokens_per_chunk // config.hash_block_tokens,
            )
            for i, g in enumerate(config.groups)
        ]
        return cls(
            request=request,
            ctx=ctx,
            policy=policy,
            groups=groups,
            store_limit=_store_limit(request, ctx, config),
        )

    @property
    def req_id(self) -> str:
        return self.ctx.req_id

    def refresh_keys(self) -> bool:
        """Add the keys of chunks that became full; whether any group gained one."""
        hashes = self.request.block_hashes
        grew = False
        for group in self.groups:
            grew |= group.refresh_keys(hashes)
        return grew

    def rewrite(
        self, num_kept_tokens: int, config: ConnectorConfig
    ) -> list[OffloadKey]:
        """The engine replaced the request's tokens past the first
        `num_kept_tokens`: drop the keys of chunks past them, bring the cursors
        back, and take the store limit and hits from the request as it is now.
        Its new prompt is touched once computed, like a new request's. Returns
        the keys dropped."""
        dropped: list[OffloadKey] = []
        for group in self.groups:
            dropped += group.drop_keys_past(num_kept_tokens)
        self.store_limit = _store_limit(self.request, self.ctx, config)
        self.hit_tokens = min(self.hit_tokens, num_kept_tokens)
        self.engine_hit_tokens = min(self.engine_hit_tokens, num_kept_tokens)
        self.prefix_touched = False
        return dropped

    def pass_hit(self, hit_tokens: int) -> None:
        """The request started from its first `hit_tokens`: count them as hit and,
        with `CHUNK_LEVEL`, start its stores past them (it did not compute them)."""
        self.hit_tokens = hit_tokens
        if self.policy is OffloadPolicy.CHUNK_LEVEL:
            for group in self.groups:
                chunks = hit_tokens // group.tokens_per_chunk
                group.store_cursor = max(group.store_cursor, chunks)

    @property
    def loaded_from_tiers(self) -> bool:
        """Its first schedule's load landed: it started past the engine's hit."""
        return self.hit_tokens > self.engine_hit_tokens

    def has_jobs(self) -> bool:
        return self.jobs_in_flight > 0

    def seen_keys(self) -> list[OffloadKey]:
        """The keys this request hit or offered, each group in prefix order."""
        out: list[OffloadKey] = []
        for group in self.groups:
            hit_chunks = self.hit_tokens // group.tokens_per_chunk
            out.extend(group.keys[: max(group.store_cursor, hit_chunks)])
        return out


def _store_limit(request: RequestInfo, ctx: ReqContext, config: ConnectorConfig) -> int:
    """`RequestState.store_limit` for the request as it is now."""
    limit = sys.maxsize
    if config.offload_prompt_only:
        limit = request.num_prompt_tokens
    cap = ctx.params.max_offload_tokens
    if cap is not None:
        limit = min(limit, cap)
    return limit
