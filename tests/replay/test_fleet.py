"""Fleets in the planner: engines behind a router, each with its own tiers, and a
tier they share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvoffload.cli import main as kvoffload_main
from kvoffload.engine_model import SimRequest, TimeModel
from kvoffload.keys import make_offload_key
from kvoffload.replay import load_mooncake
from kvoffload.replay.cli import _auto_scale
from kvoffload.replay.fleet import FleetSettings, run_fleet
from kvoffload.replay.fleet_cli import rescaled
from kvoffload.replay.fleet_report import FleetResult
from kvoffload.replay.routers import (
    ConversationTracker,
    PrefixRouter,
    least_loaded,
    make_router,
)
from kvoffload.replay.runner import ReplaySettings, run_replay
from kvoffload.replay.synthetic import synthetic
from kvoffload.replay.tier_specs import parse_tier_spec
from kvoffload.replay.workload import Workload
from kvoffload.tiers.base import OffloadingEvent


def small_chat(n: int = 800) -> Workload:
    w = synthetic("synth-chat")
    actual = w.actual_prompt_tokens
    assert actual is not None
    return Workload(w.name, w.requests[:n], w.hash_block_tokens, actual[:n])


def fleet(
    w: Workload,
    engines: int,
    router: str = "round-robin",
    shared: str | None = None,
    host: int = 150,
    *tiers: str,
) -> FleetResult:
    settings = ReplaySettings(
        chunk_tokens=512,
        tiers=tuple(parse_tier_spec(t) for t in tiers),
    )
    spec = None if shared is None else parse_tier_spec(shared)
    return run_fleet(w, "lru", host, settings, FleetSettings(engines, router, spec))


@pytest.mark.parametrize("tiers", [(), ("file:2000",)])
def test_a_fleet_of_one_is_the_single_engine_replay(tiers: tuple[str, ...]) -> None:
    w = small_chat(500)
    settings = ReplaySettings(
        chunk_tokens=512, tiers=tuple(parse_tier_spec(t) for t in tiers)
    )
    single = run_replay(w, "lru", 150, settings)
    one = run_fleet(w, "lru", 150, settings, FleetSettings(1, "prefix"))
    for name in ("hit_chunks", "hit_ratio", "token_hit_ratio", "est_ttft_s",
                 "p90_ttft_s", "requests", "prompt_chunks"):  # fmt: skip
        assert getattr(one, name) == getattr(single, name), name
    assert one.tiers == (single.tiers or one.tiers[:1])  # host-only: no tier rows
    assert one.load_imbalance == 1.0 and one.per_engine[0].load_share == 1.0


def test_a_shared_tier_serves_an_engine_what_another_computed() -> None:
    """Round-robin sends a conversation's turns to different engines: on their
    own host tiers they miss what another engine stored; through a shared tier
    they find it."""
    w = small_chat()
    alone = fleet(w, 4)
    shared = fleet(w, 4, "round-robin", "redis:5000")
    assert shared.hit_ratio > alone.hit_ratio + 0.1
    tier = shared.tiers[-1]
    assert tier.name == "shared-redis" and tier.hit_ratio > 0.1
    assert sum(e.requests for e in shared.per_engine) == len(w)
    assert tier.read_gbps_peak is not None and tier.read_gbps_peak <= 2.5 + 1e-6


def test_session_and_prefix_routing_send_a_conversation_where_its_prefix_is() -> None:
    w = small_chat()
    spread = fleet(w, 4, host=300)
    for router in ("session", "prefix"):
        kept = fleet(w, 4, router, host=300)
        assert kept.hit_ratio > spread.hit_ratio + 0.05, router
    balanced = fleet(w, 4, "least-loaded")
    assert balanced.load_imbalance < 1.5
    assert sum(e.load_share for e in balanced.per_engine) == pytest.approx(1.0)


# -- routers --------------------------------------------------------------------


def request(i: int, hashes: list[bytes], block: int = 512) -> SimRequest:
    return SimRequest(f"r{i}", 0.0, len(hashes) * block + 1, 1, hashes, block)


def test_least_loaded_rotates_among_equals() -> None:
    assert least_loaded([3, 1, 1, 5], 0) == 1
    assert least_loaded([3, 1, 1, 5], 2) == 2
    assert [least_loaded([0, 0, 0], s) for s in range(4)] == [0, 1, 2, 0]
    rr = make_router("round-robin", 3, 512)
    assert [rr.route(request(0, []), 1, [9, 0, 0]) for _ in range(4)] == [0, 1, 2, 0]


def test_conversations_continue_the_prompt_they_extend_once() -> None:
    tracker = ConversationTracker()
    h = [bytes([i]) for i in range(10)]
    first = tracker.session_of(request(0, h[:3]), 3 * 512 + 100)
    assert tracker.session_of(request(1, h[:5]), 5 * 512) == first  # next turn
    assert tracker.session_of(request(2, h[:7]), 7 * 512) == first
    # Another request on the same first three blocks: they were continued.
    other = tracker.session_of(request(3, [*h[:3], b"x"]), 4 * 512)
    assert other != first
    assert tracker.session_of(request(4, [b"y"]), 100) not in (first, other)


def test_the_prefix_router_learns_from_events_and_weighs_load() -> None:
    router = PrefixRouter(3, 512)
    h = [bytes([i]) * 8 for i in range(6)]
    keys = tuple(make_offload_key(x, 0) for x in h)
    router.observe(2, [OffloadingEvent(keys[:4], "cpu", False, "cpu")])
    req = request(0, h)
    assert router.route(req, req.num_prompt_tokens, [0, 0, 0]) == 2
    # Busier by more than the 4 chunks it would not compute: another engine.
    assert router.route(req, req.num_prompt_tokens, [0, 0, 4 * 512 + 1]) != 2
    router.observe(2, [OffloadingEvent(keys[:4], "cpu", True, "cpu")])
    assert router.route(req, req.num_prompt_tokens, [5, 0, 0]) == 1


# -- the command line -----------------------------------------------------------


def test_a_fleet_from_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["replay", "--workload", "synth-chat", "--limit", "300", "--jobs", "1",
            "--capacity-chunks", "100", "--engines", "3", "--router", "session",
            "--router", "prefix", "--shared-tier", "file:2000:8", "--tier",
            "redis:500"]  # fmt: skip
    assert kvoffload_main(argv) == 0
    out = capsys.readouterr().out
    assert "over 3 engines" in out and "shared-file" in out
    assert "engines: prefix lru 100" in out
    assert kvoffload_main([*argv, "--json"]) == 0
    records = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    runs = [r for r in records if r.get("kind") == "fleet"]
    assert [r["router"] for r in runs] == ["session", "prefix"]
    for r in runs:
        assert len(r["per_engine"]) == 3
        assert [t["name"] for t in r["tiers"]] == ["cpu", "redis", "shared-file"]
    assert records[-1]["policy"] == "infinite"


def test_on_the_bundled_trace_a_shared_tier_recovers_what_one_engine_would_hit(
    bundled_trace: Path,
) -> None:
    """4 engines x 5,859 host chunks, round-robin, with a 50,000-chunk shared
    tier: at least 90% of the hit ratio of one engine with all that memory,
    with the default deferral bound."""
    scale = _auto_scale(load_mooncake(bundled_trace), TimeModel(), 0.5 * 4)
    w = rescaled(load_mooncake(bundled_trace), scale)
    shared = fleet(w, 4, "round-robin", "redis:50000", 5859)
    one = run_replay(w, "lru", 4 * 5859 + 50000, ReplaySettings(chunk_tokens=512))
    assert shared.hit_ratio >= 0.9 * one.hit_ratio
