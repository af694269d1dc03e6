"""Replays with secondary tiers behind host memory (`kvoffload replay --tier`), and
without them exactly as before."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvoffload.cli import main as kvoffload_main
from kvoffload.engine_model import TimeModel
from kvoffload.replay import load_mooncake
from kvoffload.replay.cli import _auto_scale
from kvoffload.replay.runner import ReplayResult, ReplaySettings, run_replay
from kvoffload.replay.synthetic import synthetic
from kvoffload.replay.tier_specs import parse_tier_spec
from kvoffload.replay.workload import Workload

# `kvoffload replay --workload synth-chat --limit 1500 --capacity-chunks 300 3000
#  --policy lru --policy split --json`, before secondary tiers came to the planner
# (`split` at 300 chunks since a batch store counts its own chunks toward the once
# segment's target: one chunk more hit, 2828 -> 2829).
BEFORE = {
    ("lru", 300): (2600, 0.27049521431543905, 0.29386183725458165, 7012, 6712,
                   0.31002996977579844, 0.6360079688914766),
    ("split", 300): (2829, 0.2943196004993758, 0.3197442836896967, 6783, 6483,
                     0.2927450811864635, 0.5817624133622417),
    ("lru", 3000): (5039, 0.5242405326674989, 0.5695268453560911, 4573, 1573,
                    0.1597341521113917, 0.269095029759967),
    ("split", 3000): (5081, 0.5286100707449022, 0.5742738442655883, 4531, 1531,
                      0.15775983906691982, 0.2676522642784107),
}  # fmt: skip
FIELDS = ("hit_chunks", "hit_ratio", "token_hit_ratio", "chunks_stored",
          "chunks_evicted", "est_ttft_s", "p90_ttft_s")  # fmt: skip


def test_without_tiers_every_figure_is_as_it_was(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["replay", "--workload", "synth-chat", "--limit", "1500", "--jobs", "1",
            "--capacity-chunks", "300", "3000", "--policy", "lru", "--policy",
            "split", "--json"]  # fmt: skip
    assert kvoffload_main(argv) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    runs = [r for r in records if r["policy"] in ("lru", "split")]
    assert len(runs) == 4
    for record in runs:
        expected = BEFORE[(record["policy"], record["capacity_chunks"])]
        assert tuple(record[f] for f in FIELDS) == expected
        assert record["prompt_chunks"] == 9612 and "tiers" not in record


def small_chat(n: int = 800) -> Workload:
    w = synthetic("synth-chat")
    actual = w.actual_prompt_tokens
    assert actual is not None
    return Workload(w.name, w.requests[:n], w.hash_block_tokens, actual[:n])


def replay(w: Workload, host: int, *tiers: str) -> ReplayResult:
    settings = ReplaySettings(
        chunk_tokens=512, tiers=tuple(parse_tier_spec(t) for t in tiers)
    )
    return run_replay(w, "lru", host, settings)


def test_a_file_tier_adds_hits_and_each_tier_reports_its_share() -> None:
    w = small_chat()
    host_only = replay(w, 200)
    tiered = replay(w, 200, "file:3000:5")
    assert tiered.hit_ratio > host_only.hit_ratio + 0.1
    cpu, file = tiered.tiers
    assert (cpu.name, file.name) == ("cpu", "file")
    assert cpu.hit_ratio + file.hit_ratio == pytest.approx(tiered.hit_ratio)
    chunk_bytes = 512 * TimeModel().kv_bytes_per_token
    assert file.bytes_loaded == file.chunks_loaded * chunk_bytes > 0
    assert file.bytes_stored == file.chunks_stored * chunk_bytes > 0
    for rate in (file.read_gbps_peak, file.write_gbps_peak):
        assert rate is not None and 0 < rate <= 5.0 + 1e-6
    assert file.read_gbps_mean is not None and file.read_gbps_mean < 5.0


def test_a_disk_written_back_holds_what_host_memory_does_not() -> None:
    """Written through, a disk holds host memory's chunks too; written back
    (`file:N:back`) it is written only what host memory is about to evict, and
    the two hold more distinct chunks: more hits, never more than one host
    memory of both sizes."""
    w = small_chat()
    through, back = replay(w, 200, "file:600"), replay(w, 200, "file:600:back")
    one = replay(w, 800)
    assert back.hit_ratio > through.hit_ratio + 0.01
    assert back.hit_ratio <= one.hit_ratio
    assert back.tiers[1].chunks_loaded > through.tiers[1].chunks_loaded


def test_a_slower_tier_costs_time_to_first_token() -> None:
    """The same chunks from a slower disk: more TTFT for the same hits; a disk
    slower than the stream of stores backs host memory up (its chunks stay
    pinned until their cascade ends), and stores to it are skipped."""
    w = small_chat()
    slow, fast, fastest = (replay(w, 200, f"file:3000:{g}") for g in (1, 4, 1000))
    assert slow.est_ttft_s > fast.est_ttft_s > fastest.est_ttft_s
    assert fast.hit_ratio == pytest.approx(fastest.hit_ratio, abs=0.005)
    assert slow.tiers[0].store_skipped > 0 == fast.tiers[0].store_skipped


def test_a_remote_tier_shared_by_nothing_still_serves_its_chunks() -> None:
    """A Redis tier answers lookups a round trip late (`RETRY`), then promotes."""
    w = small_chat()
    result = replay(w, 200, "redis:3000")
    redis = result.tiers[-1]
    assert redis.name == "redis" and redis.chunks_loaded > 0 and redis.hit_ratio > 0.1


def test_tiers_in_the_table_and_the_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["replay", "--workload", "synth-chat", "--limit", "300", "--jobs", "1",
            "--capacity-chunks", "100", "--tier", "file:1000", "--tier",
            "redis:2GiB:1.25"]  # fmt: skip
    assert kvoffload_main(argv) == 0
    out = capsys.readouterr().out
    # Each tier's link in the bandwidth table: its kind's default, or as given.
    assert re.search(r"^lru 100 +file +5 ", out, re.MULTILINE)
    assert re.search(r"^lru 100 +redis +1\.25 ", out, re.MULTILINE)
    assert kvoffload_main([*argv, "--json"]) == 0
    record = json.loads(capsys.readouterr().out.splitlines()[0])
    names = [t["name"] for t in record["tiers"]]
    assert names == ["cpu", "file", "redis"]
    assert record["tiers"][2]["capacity_chunks"] == 2 * 2**30 // (512 * 131072)


def test_on_the_bundled_trace_a_file_tier_serves_what_its_capacity_holds(
    bundled_trace: Path,
) -> None:
    """5,859 host chunks and a 50,000-chunk disk: the hit ratio of a 50,000-chunk
    LRU (the disk holds what host memory holds too), within 0.012 of the
    infinite cache (written back, within 0.01); its TTFT above host memory of
    55,859 chunks by at least the time the disk spends reading for a request.
    With the default deferral bound, long enough for a long prompt's chunks
    (see docs/fleet.md)."""
    scale = _auto_scale(load_mooncake(bundled_trace), TimeModel(), 0.5)
    w = load_mooncake(bundled_trace, time_scale=scale)
    tiered = replay(w, 5859, "file:50000")
    host = replay(w, 55859)
    assert tiered.hit_ratio == pytest.approx(0.366, abs=0.012)
    assert tiered.hit_ratio == pytest.approx(0.355, abs=0.003)  # LRU at 50,000
    # Written back, the disk holds what host memory does not: within 0.01 of
    # the infinite cache (0.3664), below host memory of both sizes (0.358).
    back = replay(w, 5859, "file:50000:back")
    assert 0.3664 - 0.01 <= back.hit_ratio <= host.hit_ratio
    file = tiered.tiers[1]
    read_s = file.bytes_loaded / (file.gbps or 1) / 1e9 / tiered.requests
    assert tiered.est_ttft_s - host.est_ttft_s > read_s > 0
