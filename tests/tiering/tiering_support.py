"""Helpers for the tiering tests: chunk payloads, an engine stand-in, a held tier."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence

from kvoffload import (
    CPUOffloadingManager,
    LookupResult,
    OffloadKey,
    OffloadPolicy,
    ReqContext,
    RequestOffloadingContext,
    TierStats,
    make_offload_key,
)
from kvoffload.tiering import TieringManager
from kvoffload.tiers.secondary import (
    ArrayChunkBuffer,
    FileTier,
    FileTierConfig,
    SecondaryTier,
    TierJob,
    TierJobResult,
)
from kvoffload.worker import ChunkBuffer

SLOT = 256
FINGERPRINT = "test-model-layout"


def key(i: int, group: int = 0) -> OffloadKey:
    return make_offload_key(hashlib.sha256(i.to_bytes(8, "big")).digest(), group)


def keys(*ids: int) -> list[OffloadKey]:
    return [key(i) for i in ids]


def payload(k: OffloadKey, n: int = SLOT) -> bytes:
    """The bytes the engine computed for chunk `k` (deterministic)."""
    return hashlib.shake_128(k).digest(n)


class Clock:
    """A manual monotonic clock."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Engine:
    """The device side of a `TieringManager`: writes chunks, loads and checks them."""

    def __init__(self, manager: TieringManager, buffer: ChunkBuffer) -> None:
        self.m = manager
        self.buffer = buffer

    def store(
        self, ids_or_keys: Sequence[OffloadKey], ctx: ReqContext, complete: bool = True
    ) -> tuple[OffloadKey, ...]:
        out = self.m.prepare_store(ids_or_keys, ctx)
        assert out is not None, "no room in the primary tier"
        for k, slot in zip(out.keys_to_store, out.slots, strict=True):
            n = self.buffer.chunk_nbytes(int.from_bytes(k[-4:], "big"))
            self.buffer.slot_view(slot)[:n] = payload(k, n)
        if complete:
            self.m.complete_store(out.keys_to_store, ctx)
        return out.keys_to_store

    def load(self, ks: Sequence[OffloadKey], ctx: ReqContext) -> list[bytes]:
        """Load readable chunks and return their bytes (after checking them)."""
        slots = self.m.prepare_load(ks, ctx)
        data = []
        for k, slot in zip(ks, slots, strict=True):
            n = self.buffer.chunk_nbytes(int.from_bytes(k[-4:], "big"))
            got = bytes(self.buffer.slot_view(slot)[:n])
            assert got == payload(k, n), f"wrong bytes loaded for {k.hex()[:12]}"
            data.append(got)
        self.m.complete_load(ks, ctx)
        return data

    def step(self) -> None:
        self.m.on_schedule_end()

    def settle(self, timeout_s: float = 10.0) -> None:
        """Step until no tier job is in flight."""
        wait_until(lambda: not self.m.has_pending_work(), self.step, timeout_s)

    def lookup_until_known(
        self, k: OffloadKey, ctx: ReqContext, timeout_s: float = 10.0
    ) -> LookupResult:
        """Look up, stepping while the answer is RETRY or HIT_PENDING."""
        result = self.m.lookup(k, ctx)
        deadline = time.monotonic() + timeout_s
        while result in (LookupResult.RETRY, LookupResult.HIT_PENDING):
            assert time.monotonic() < deadline, f"still {result} after {timeout_s}s"
            self.step()
            time.sleep(0.001)
            result = self.m.lookup(k, ctx)
        return result


def wait_until(
    cond: Callable[[], bool],
    step: Callable[[], None] = lambda: None,
    timeout_s: float = 10.0,
) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        step()
        time.sleep(0.001)


def make_manager(
    tiers: Sequence[SecondaryTier],
    num_chunks: int = 16,
    buffer: ChunkBuffer | None = None,
    clock: Clock | None = None,
    **primary_kwargs: object,
) -> tuple[TieringManager, Engine]:
    buf = buffer or ArrayChunkBuffer(num_chunks, SLOT)
    primary = CPUOffloadingManager(num_chunks, **primary_kwargs)  # type: ignore[arg-type]
    manager = TieringManager(primary, tiers, clock=clock or Clock())
    return manager, Engine(manager, buf)


class HeldTier(SecondaryTier):
    """A scripted in-memory tier: jobs wait until released; failures on demand.

    It records every call (`calls`) so that tests can check order and counts.
    """

    def __init__(
        self,
        buffer: ChunkBuffer,
        name: str = "held",
        medium: str = "storage",
        locality: str = "local",
        policy: OffloadPolicy = OffloadPolicy.CHUNK_LEVEL,
        max_inflight_chunks: int = 256,
        auto: bool = True,
    ) -> None:
        super().__init__(name, medium, locality, policy, max_inflight_chunks)  # type: ignore[arg-type]
        self.buffer = buffer
        self.auto = auto
        self.chunks: dict[OffloadKey, bytes] = {}
        self.fail_stores = False
        self.fail_loads = False
        self.held: list[tuple[str, TierJob]] = []
        self.calls: list[tuple[str, object]] = []
        self._done: list[TierJobResult] = []
        self.stats = TierStats()

    def lookup(self, k: OffloadKey, ctx: ReqContext) -> LookupResult:
        self.stats.lookups += 1
        return LookupResult.HIT if k in self.chunks else LookupResult.MISS

    def submit_store(self, job: TierJob) -> None:
        self.calls.append(("store", job.keys))
        self.held.append(("store", job))
        if self.auto:
            self.release()

    def submit_load(self, job: TierJob) -> None:
        self.calls.append(("load", job.keys))
        self.held.append(("load", job))
        if self.auto:
            self.release()

    def release(self, n: int | None = None) -> None:
        """Finish the first `n` held jobs (all by default)."""
        count = len(self.held) if n is None else n
        jobs, self.held = self.held[:count], self.held[count:]
        for kind, job in jobs:
            failed: list[OffloadKey] = []
            for k, slot in zip(job.keys, job.slots, strict=True):
                view = self.buffer.slot_view(slot)
                if kind == "store":
                    if self.fail_stores:
                        failed.append(k)
                    else:
                        self.chunks[k] = bytes(view)
                elif self.fail_loads or k not in self.chunks:
                    view[:8] = b"garbage!"
                    failed.append(k)
                else:
                    view[:] = self.chunks[k]
            self.stats.failures += len(failed)
            self._done.append(TierJobResult(job.job_id, tuple(failed)))

    def get_finished_jobs(self) -> list[TierJobResult]:
        out, self._done = self._done, []
        return out

    def on_new_request(self, ctx: ReqContext) -> RequestOffloadingContext:
        self.calls.append(("new", ctx.req_id))
        return RequestOffloadingContext(self.offload_policy)

    def on_request_finished(self, ctx: ReqContext) -> None:
        self.calls.append(("finished", ctx.req_id))

    def has_pending_work(self) -> bool:
        return bool(self.held or self._done)

    def drain(self) -> None:
        self.release()

    def reset_cache(self) -> None:
        self.calls.append(("reset", len(self.chunks)))
        self.chunks.clear()

    def get_stats(self) -> TierStats:
        return self.stats

    def stored_keys(self) -> list[OffloadKey]:
        return [k for kind, ks in self.calls if kind == "store" for k in ks]  # type: ignore[attr-defined]


def file_engine(
    path: object,
    capacity: int | str = "1MiB",
    num_chunks: int = 8,
    fingerprint: str = FINGERPRINT,
    slot: int = SLOT,
) -> tuple[TieringManager, Engine, FileTier]:
    """A manager over a fresh primary tier and a file tier on `path`."""
    buf = ArrayChunkBuffer(num_chunks, slot)
    tier = FileTier(FileTierConfig(str(path), capacity), buf, fingerprint)  # type: ignore[arg-type]
    manager, engine = make_manager([tier], num_chunks=num_chunks, buffer=buf)
    return manager, engine, tier


def chunk_files(path: object) -> list[str]:
    """Every file under `path` (recursively), as relative paths."""
    import os

    root = str(path)
    return sorted(
        os.path.relpath(os.path.join(d, f), root)
        for d, _, fs in os.walk(root)
        for f in fs
    )
