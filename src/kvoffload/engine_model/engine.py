"""A small discrete-step inference engine that drives the connector as vLLM does.

Each step: deliver finished jobs, schedule running requests (chunked prefill, one
decode token each) and then waiting ones within a token budget, ask the connector
for its plan, advance the clock by the modeled step time, and sample tokens. The
device cache is paged with prefix caching; when blocks run out the most recently
started running request is preempted (never to admit a waiting one: that waits).
Loads are asynchronous: a request whose prefix is being loaded waits without
computing. With `async_scheduling`, job results reach the connector one step late,
as with vLLM's overlapped scheduler.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from kvoffload.connector import OffloadConnector, ScheduledRequest
from kvoffload.engine_model.device_cache import DeviceCache
from kvoffload.engine_model.request import RequestStatus, SimRequest
from kvoffload.engine_model.timing import TimeModel
from kvoffload.engine_model.worker import SimulatedWorker
from kvoffload.worker.base import JobResult, TransferJob

# Idle steps in a row that move the clock no further and meet no event: past this
# nothing can change any more (a deferral lasts four such ticks at most).
MAX_IDLE_WITHOUT_PROGRESS = 64


class SimClock:
    """The engine model's simulated time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class EngineConfig:
    """Shape and speed of the modeled engine.

    `device_blocks` is per group; `None` means unlimited device memory and no
    prefix cache (nothing is reused on the device). `macro_decode` lets quiet
    stretches of pure decoding advance several tokens per step (same outcome,
    fewer Python steps). `decode_model="delay"` (for long replays) takes a request
    out of the step loop once its first token is out: its decode runs alongside
    for `decode_step_s` per token, holding its blocks, and its decode KV reaches
    the connector when it finishes.
    """

    tokens_per_block: tuple[int, ...] = (16,)
    device_blocks: int | None = 4096
    max_batched_tokens: int = 8192
    max_running: int = 256
    async_scheduling: bool = False
    macro_decode: bool = True
    decode_model: Literal["steps", "delay"] = "steps"
    time_model: TimeModel = field(default_factory=TimeModel)

    def __post_init__(self) -> None:
        if not self.tokens_per_block or min(self.tokens_per_block) < 1:
            raise ValueError(
                f"tokens_per_block must be positive, got {self.tokens_per_block!r}"
            )
        if self.max_batched_tokens < 1 or self.max_running < 1:
            raise ValueError("max_batched_tokens and max_running must be >= 1")


class EngineModel:
    """Runs `SimRequest`s through a paged device cache and an optional connector."""

    def __init__(
        self,
        config: EngineConfig,
        connector: OffloadConnector | None = None,
        fail_job: Callable[[TransferJob], bool] | None = None,
        clock: SimClock | None = None,
        wakeup: Callable[[], float | None] | None = None,
    ) -> None:
        """`wakeup` gives the time of the next event the engine's connector waits
        for outside the worker (a modeled secondary tier's job or check), so
        that an idle engine jumps to it rather than polling."""
        self.config = config
        self.connector = connector
        self.clock = clock or SimClock()
        self.device = DeviceCache(config.tokens_per_block, config.device_blocks)
        self.worker = SimulatedWorker(
            config.time_model, list(config.tokens_per_block), self.clock, fail_job
        )
        self._arrivals: deque[SimRequest] = deque()
        self.waiting: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self.finished: list[SimRequest] = []
        self._by_id: dict[str, SimRequest] = {}
        self._late_results: list[JobResult] = []
        self._decoding: list[
            tuple[float, int, SimRequest, tuple[tuple[int, ...], ...]]
        ] = []
        self._decode_seq = 0
        self._stalled_idles = 0
        self._wakeup = wakeup
        self._horizon: float | None = None
        self.steps = 0

    # -- driving -----------------------------------------------------------------

    def add(self, requests: Iterable[SimRequest]) -> None:
        """Queue requests (in arrival order); `ValueError` for one the device
        could never hold, which would wait forever (vLLM refuses it too)."""
        ordered = sorted(requests, key=lambda r: r.arrival)
        for request in ordered:
            if not self.device.can_hold(request.max_kv_tokens):
                raise ValueError(
                    f"request {request.request_id} needs {request.max_kv_tokens:,} "
                    f"tokens of KV, more than the device's "
                    f"{self.config.device_blocks:,} blocks per group hold"
                )
        for request in ordered:
            self._arrivals.append(request)
            self._by_id[request.request_id] = request

    def run(
        self, requests: Iterable[SimRequest] = (), max_steps: int | None = None
    ) -> list[SimRequest]:
        """Run until every request finished (and its jobs drained)."""
        self.add(requests)
        while self.has_work() and (max_steps is None or self.steps < max_steps):
            self.step()
        return self.finished

    def has_work(self) -> bool:
        return bool(
            self._arrivals
            or self.waiting
            or self.running
            or self._late_results
            or self._decoding
        ) or (self.connector is not None and self.connector.has_pending_work())

    def abort(self, request_id: str) -> None:
        """Abort a request wherever it is; it stores only what it computed."""
        req = self._by_id[request_id]
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        elif req in self._arrivals:
            self._arrivals.remove(req)
            req.status = RequestStatus.DONE
            return
        else:
            return
        self._finish(req)

    def next_event_time(self) -> float | None:
        """When the engine next has something to do (`None`: nothing at all):
        now while requests wait or run, else its next arrival, transfer, decode
        or `wakeup` event. A fleet steps its engines in this order."""
        if not self.has_work():
            return None
        now = self.clock.now
        if self.waiting or self.running or self._late_results:
            return now
        return max(now, min(self._upcoming(), default=now))

    # -- one step ----------------------------------------------------------------

    def step(self, horizon: float | None = None) -> None:
        """One step. `horizon` is the time of the next event outside the engine
        (the next request a fleet may route here): an idle engine jumps no
        further, nor does a stretch of decode steps run past it."""
        self._horizon = horizon
        try:
            self._step()
        finally:
            self._horizon = None

    def _step(self) -> None:
        self.steps += 1
        self._admit_arrivals()
        self._deliver_results()
        scheduled, work = self._schedule()
        macro = self._macro_factor(work)
        if macro > 1:
            scheduled = self._extend_decode(scheduled, work, macro)
        decoded = self._take_decoded()
        scheduled += [item for item, _ in decoded]
        plan = self.connector.build_step(scheduled) if self.connector else None
        if self.connector is not None:
            # At schedule time, as vLLM's `build_connector_meta` does: tier work
            # this step's lookups started (promotions, existence checks) runs
            # during the forward pass, not after it.
            self.connector.on_schedule_end()
        if not scheduled and (plan is None or plan.empty):
            self._idle()
            return
        self._stalled_idles = 0
        start = self.clock.now
        if plan is not None and plan.wait_for:
            start = max(start, self.worker.finish_time(plan.wait_for))
        duration = self._step_seconds(work) * macro
        if not math.isfinite(start + duration):
            raise ValueError(
                f"engine model clock overflowed at step {self.steps}: the time "
                "model's costs are too large for this workload"
            )
        if plan is not None:
            for job in plan.loads:
                self.worker.submit(job, start)
            for job in plan.stores:
                self.worker.submit(job, start + duration)
        self.clock.now = start + duration
        for req, n in work:
            self._advance(req, n * macro, sampled=macro)
        for item, req in decoded:
            self._advance(req, item.num_scheduled_tokens, item.num_scheduled_tokens)

    def _upcoming(self) -> list[float]:
        """Times of the next events the engine does not cause itself: the next
        arrival, the next transfer completion, the next decode completion, the
        next `wakeup` event and the step's `horizon`."""
        events = [self._arrivals[0].arrival] if self._arrivals else []
        done = self.worker.next_completion()
        if done is not None:
            events.append(done)
        if self._decoding:
            events.append(self._decoding[0][0])
        if self._wakeup is not None:
            woken = self._wakeup()
            if woken is not None:
                events.append(woken)
        if self._horizon is not None:
            events.append(self._horizon)
        return events

    def _idle(self) -> None:
        """Nothing to compute: jump to the next arrival or job completion."""
        if not self.has_work() or self._late_results:
            return  # late results are delivered by the next step
        upcoming = self._upcoming()
        events = list(upcoming)
        if self.waiting and self.connector is not None:
            events.append(self.clock.now + self.connector.config.max_defer_s / 4)
        nxt = min(events, default=None)
        # Only an event from outside (arrival, transfer, decode) later than now
        # can unblock a waiting request; a deferral tick alone ends deferrals.
        stalled = not (upcoming and min(upcoming) > self.clock.now)
        self._stalled_idles = self._stalled_idles + 1 if stalled else 0
        if nxt is None or self._stalled_idles > MAX_IDLE_WITHOUT_PROGRESS:
            stuck = [r.request_id for r in self.waiting]
            raise RuntimeError(
                f"engine model cannot make progress at t={self.clock.now:g} s; "
                f"waiting: {stuck[:5]}"
            )
        self.clock.now = max(self.clock.now, nxt)
        if self.connector is not None:
            self.connector.on_schedule_end()

    def _admit_arrivals(self) -> None:
        while self._arrivals and self._arrivals[0].arrival <= self.clock.now:
            req = self._arrivals.popleft()
            self.waiting.append(req)
            if self.connector is not None:
                self.connector.on_new_request(req)

    def _deliver_results(self) -> None:
        if self.connector is None:
            return
        fresh = self.worker.get_finished()
        if self.config.async_scheduling:
            results, self._late_results = self._late_results, fresh
        else:
            results = fresh
        self.connector.on_job_results(results)
        done, failed = self.connector.take_load_results()
        for req_id in done:
            self._on_loaded(self._by_id[req_id], ok=True)
        for req_id in failed:
            self._on_loaded(self._by_id[req_id], ok=False)

    def _on_loaded(self, req: SimRequest, ok: bool) -> None:
        if req.status is not RequestStatus.LOADING:
            return  # aborted meanwhile
        req.status = RequestStatus.WAITING
        if ok:
            req.num_computed += req.loaded_tokens
            self.device.register(req, req.num_computed - req.loaded_tokens)
        else:
            req.loaded_tokens = 0

    # -- scheduling --------------------------------------------------------------

    def _schedule(self) -> tuple[list[ScheduledRequest], list[tuple[SimRequest, int]]]:
        budget = self.config.max_batched_tokens
        scheduled: list[ScheduledRequest] = []
        work: list[tuple[SimRequest, int]] = []
        for req in list(self.running):
            if budget <= 0:
                break
            if req not in self.running:
                continue  # preempted by an earlier request this step
            n = min(req.num_tokens - req.num_computed, budget)
            new_ids = self._grow(req, req.num_computed + n)
            if new_ids is None:
                continue
            scheduled.append(
                ScheduledRequest(req.request_id, req.num_computed, n, new_ids)
            )
            work.append((req, n))
            budget -= n
        for req in list(self.waiting):
            if budget <= 0 or len(self.running) >= self.config.max_running:
                break
            if req.status is RequestStatus.LOADING:
                continue
            item = self._admit(req, budget)
            if item is not None:
                scheduled.append(item[0])
                work.append((req, item[1]))
                budget -= item[1]
        return scheduled, work

    def _admit(
        self, req: SimRequest, budget: int
    ) -> tuple[ScheduledRequest, int] | None:
        """Move a waiting request to running (or to loading); None if it must wait."""
        if req.block_ids:  # its load landed: blocks are allocated already
            # Without room to go on it keeps them and waits (_grow preempts nothing).
            n = min(req.num_tokens - req.num_computed, budget)
            new_ids = self._grow(req, req.num_computed + n)
            if new_ids is None:
                return None
            self.waiting.remove(req)
            self.running.append(req)
            req.status = RequestStatus.RUNNING
            return ScheduledRequest(req.request_id, req.num_computed, n, new_ids), n
        hit_blocks, hit = self.device.prefix_hit(req)
        external = 0
        if self.connector is not None:
            found = self.connector.get_num_new_matched_tokens(req, hit)
            if found is None:
                return None  # deferred: ask again next step
            external = found
        n = 0 if external else min(req.num_tokens - hit, budget)
        if not self.device.admit(req, hit_blocks, hit + external + n):
            return None
        req.num_computed = hit
        if not req.scheduled_once:
            req.scheduled_once = True
            req.device_hit_tokens = hit
        req.loaded_tokens = external
        if self.connector is not None:
            self.connector.update_state_after_alloc(
                req.request_id, req.block_ids, hit, external
            )
        if external:
            req.status = RequestStatus.LOADING
            return None
        self.waiting.remove(req)
        self.running.append(req)
        req.status = RequestStatus.RUNNING
        ids = tuple(tuple(b) for b in req.block_ids)
        return ScheduledRequest(req.request_id, hit, n, ids, replace_block_ids=True), n

    def _grow(self, req: SimRequest, tokens: int) -> tuple[tuple[int, ...], ...] | None:
        """Allocate blocks so `req` holds `tokens`, or return None.

        Out of memory, a running `req` preempts the most recently started running
        requests, itself last (then None). Any other request (a waiting one whose
        load landed) preempts nothing and gets None: as in vLLM, a waiting request
        is admitted only into free memory.
        """
        while True:
            new = self.device.grow(req, tokens)
            if new is not None or req not in self.running:
                return new
            victim = self.running[-1]
            self._preempt(victim)
            if victim is req:
                return None

    def _preempt(self, req: SimRequest) -> None:
        self.running.remove(req)
        self._release(req)
        req.num_computed = 0
        req.status = RequestStatus.WAITING
        req.preemptions += 1
        self.waiting.insert(0, req)
        if self.connector is not None:
            self.connector.on_preempted([req.request_id])

    # -- time and progress -------------------------------------------------------

    def _macro_factor(self, work: list[tuple[SimRequest, int]]) -> int:
        """How many identical pure-decode steps can run back to back."""
        if not self.config.macro_decode or not work or any(n != 1 for _, n in work):
            return 1
        if any(r.num_computed < r.num_prompt_tokens for r, _ in work):
            return 1
        if any(r.status is not RequestStatus.LOADING for r in self.waiting):
            return 1
        factor = min(r.max_output_tokens - r.num_output for r, _ in work)
        one = self._step_seconds(work)
        horizon = self._upcoming()
        if horizon and one > 0:
            factor = min(factor, int((min(horizon) - self.clock.now) / one))
        if factor <= 1:
            return 1
        needs = [
            self.device.blocks_needed(r.block_ids, r.num_computed + factor)
            for r, _ in work
        ]
        total = [sum(group) for group in zip(*needs, strict=True)]
        return factor if self.device.fits(total) else 1

    def _extend_decode(
        self,
        scheduled: list[ScheduledRequest],
        work: list[tuple[SimRequest, int]],
        factor: int,
    ) -> list[ScheduledRequest]:
        """Grow each decoding request's blocks for `factor` tokens (known to fit)."""
        out: list[ScheduledRequest] = []
        for item, (req, _) in zip(scheduled, work, strict=True):
            extra = self._grow(req, req.num_computed + factor)
            assert extra is not None
            ids = tuple(a + b for a, b in zip(item.new_block_ids, extra, strict=True))
            req.lookahead = factor - 1
            out.append(
                ScheduledRequest(item.request_id, item.num_computed_tokens, factor, ids)
            )
        return out

    def _step_seconds(self, work: list[tuple[SimRequest, int]]) -> float:
        tm = self.config.time_model
        prefill = 0.0
        decoding = 0
        for req, n in work:
            if n == 1 and req.num_computed >= req.num_prompt_tokens:
                decoding += 1
            else:
                prefill += tm.prefill_seconds(n, req.num_computed)
        return tm.step_seconds(prefill, decoding)

    def _advance(self, req: SimRequest, n: int, sampled: int) -> None:
        req.lookahead = 0
        before = req.num_computed
        req.num_computed += n
        self.device.register(req, before)
        if req.num_computed < req.num_tokens:
            return
        req.num_output += sampled
        if req.first_token_time is None:
            req.first_token_time = self.clock.now
        if req.num_output >= req.max_output_tokens:
            if req in self.running:
                self.running.remove(req)
            self._finish(req)
        elif self.config.decode_model == "delay" and req in self.running:
            self._start_delayed_decode(req)

    def _start_delayed_decode(self, req: SimRequest) -> None:
        """Decode the rest off the step loop, holding blocks for all of it."""
        remaining = req.max_output_tokens - req.num_output
        tokens = req.num_computed + remaining
        if not self.device.fits(self.device.blocks_needed(req.block_ids, tokens)):
            return  # not enough memory: keep decoding step by step
        self.running.remove(req)
        new_ids = self._grow(req, tokens)
        assert new_ids is not None
        tm = self.config.time_model
        end = self.clock.now + remaining * (tm.decode_step_s + tm.decode_s_per_sequence)
        self._decode_seq += 1
        heapq.heappush(self._decoding, (end, self._decode_seq, req, new_ids))

    def _take_decoded(self) -> list[tuple[ScheduledRequest, SimRequest]]:
        """Requests whose delayed decode ended: their decode KV, as one scheduled item."""
        out: list[tuple[ScheduledRequest, SimRequest]] = []
        while self._decoding and self._decoding[0][0] <= self.clock.now:
            _, _, req, new_ids = heapq.heappop(self._decoding)
            n = req.max_output_tokens - req.num_output
            req.lookahead = n - 1
            out.append(
                (ScheduledRequest(req.request_id, req.num_computed, n, new_ids), req)
            )
        return out

    def _finish(self, req: SimRequest) -> None:
        req.finish_time = self.clock.now
        self.finished.append(req)
        if self.connector is not None:
            self.connector.request_finished(req.request_id)
        self._release(req)
        req.status = RequestStatus.DONE

    def _release(self, req: SimRequest) -> None:
        self.device.release(req)
