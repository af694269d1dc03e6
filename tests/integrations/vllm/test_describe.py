"""The start-up log: the resolved configuration once, one line for host memory
and one per tier, secrets masked, and a warning per remote tier that does not
answer (the probe is injected here; tests/tiers/secondary/test_redis_probe.py
runs the real one against redis-server)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from kvoffload.integrations.vllm.config import KVOffloadSettings
from kvoffload.integrations.vllm.describe import describe, log_start_up
from kvoffload.tiers.secondary import RedisTierConfig

SECRET = "l0g-Secret"


def test_one_line_for_host_memory_and_one_per_tier() -> None:
    settings = KVOffloadSettings.from_extra_config(
        {
            "cpu_bytes_to_use": "64GiB",
            "block_size": 256,
            "eviction_policy": "split",
            "secondary_tiers": [
                {"type": "file", "path": "/nvme/kv", "capacity": "1.5TiB"},
                {"type": "memory", "capacity_chunks": 100, "name": "ram2"},
            ],
        }
    )
    assert describe(settings) == [
        "host memory 'cpu': 64 GiB, eviction split, chunks of 256 tokens, prompt "
        "chunks only, max_defer_s 10, max_hinted_share 0.35",
        "tier 'file' (file, local): /nvme/kv, capacity 1.5 TiB, eviction lru, "
        "chunk_level, written through, file_mode 0600",
        "tier 'ram2' (memory, local): capacity 100 chunks, eviction lru, chunk_level",
    ]


def test_the_log_names_the_file_and_masks_every_secret(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("redis")
    monkeypatch.setenv("KV_PW", SECRET)
    path = tmp_path / "kv.json"
    path.write_text(
        json.dumps(
            {
                "cpu_bytes_to_use": "1GiB",
                "secondary_tiers": [
                    {"type": "redis", "url": "redis://app:${KV_PW}@cache:6380/0"},
                    {
                        "type": "redis",
                        "name": "shared",
                        "url": "rediss://app@cache2:6380/0",
                        "password_env": "KV_PW",
                        "options": {"ssl_ca_certs": "/etc/ca.pem"},
                    },
                ],
            }
        )
    )
    settings = KVOffloadSettings.from_extra_config({"config_file": str(path)})
    asked: list[str] = []

    def probe(config: RedisTierConfig) -> str | None:
        asked.append(config.name)
        return None if config.name == "redis" else f"refused by {SECRET}"

    with caplog.at_level(logging.INFO, logger="kvoffload"):
        log_start_up(settings, probe)
    lines = [record.getMessage() for record in caplog.records]
    assert asked == ["redis", "shared"], "each remote tier probed once"
    assert lines[0] == f"kvoffload: settings read from {path}"
    assert lines[2].startswith(
        "kvoffload: tier 'redis' (redis, remote): redis://app:***@cache:6380/0,"
    )
    assert lines[3].startswith(
        "kvoffload: tier 'shared' (redis, remote): rediss://***@cache2:6380/0 "
        "(password from $KV_PW)"
    )
    assert len(lines) == 5
    assert caplog.records[4].levelno == logging.WARNING
    assert lines[4].startswith("kvoffload: tier 'shared': rediss://***@cache2:6380/0")
    assert "does not answer (refused by ***)" in lines[4]
    assert all(SECRET not in line for line in lines)
