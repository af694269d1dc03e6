"""The resolved configuration in words, secrets masked, and the probe of remote tiers.

One line for host memory and one per secondary tier (its path or endpoint,
capacity and policies): logged once when the engine starts (`log_start_up`) and
printed by `kvoffload check-config`. A Redis tier's server is asked once whether it
answers (`probe_remote_tiers`); one that does not is a warning, and serving starts
anyway, as a tier that fails later gives misses.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kvoffload.config.sizes import format_size
from kvoffload.integrations.vllm.config import KVOffloadSettings
from kvoffload.tiers.secondary import parse_tier_config
from kvoffload.tiers.secondary.config import FileTierConfig, MemoryTierConfig
from kvoffload.tiers.secondary.redis_config import RedisTierConfig
from kvoffload.tiers.secondary.redis_url import redact_text, redact_url

logger = logging.getLogger(__name__)

TierConfig = FileTierConfig | MemoryTierConfig | RedisTierConfig
Probe = Callable[[RedisTierConfig], "str | None"]


def describe(settings: KVOffloadSettings) -> list[str]:
    """Host memory's line, then one line per secondary tier, in their order."""
    lines = [_host_line(settings)]
    for mapping in settings.secondary_tiers:
        lines.append(describe_tier(parse_tier_config(mapping)))
    return lines


def _host_line(settings: KVOffloadSettings) -> str:
    if settings.chunk_tokens is not None:
        chunk = f"chunks of {settings.chunk_tokens} tokens"
    else:
        blocks = settings.blocks_per_chunk or 1
        chunk = f"chunks of {blocks} engine block{'s' if blocks > 1 else ''}"
    parts = [
        f"host memory 'cpu': {format_size(settings.cpu_bytes_to_use)}",
        f"eviction {settings.eviction_policy}",
        chunk,
        "prompt chunks only" if settings.offload_prompt_only else "prompt and output",
        f"max_defer_s {settings.max_defer_s:g}",
        f"max_hinted_share {settings.max_hinted_share:g}",
    ]
    if settings.store_threshold > 1:
        parts.append(f"stored once seen by {settings.store_threshold} requests")
    if settings.model_tag is not None:
        parts.append(f"model_tag {settings.model_tag!r}")
    return ", ".join(parts)


def describe_tier(config: TierConfig) -> str:
    """`tier 'name' (type, locality): where, how much, which policies`."""
    head = f"tier {config.name!r} ({_type(config)}, {config.locality})"
    policy = config.offload_policy.value
    if isinstance(config, FileTierConfig):
        parts = [
            config.path,
            f"capacity {format_size(config.capacity_bytes)}",
            f"eviction {config.eviction_policy}",
            policy,
            f"written {config.write}",
        ]
        if config.rescan_interval_s:
            parts.append(f"rescan every {config.rescan_interval_s:g} s")
        if config.fsync:
            parts.append("fsync")
        parts.append(f"file_mode {config.file_mode:04o}")
    elif isinstance(config, RedisTierConfig):
        parts = [_endpoint(config), "eviction by the server", policy]
        parts.append("no ttl" if config.ttl_s is None else f"ttl {config.ttl_s:g} s")
        parts.append(f"timeout {config.timeout_s:g} s")
        parts.append(f"key_prefix {config.key_prefix!r}")
    else:
        parts = [
            f"capacity {config.capacity_chunks} chunks",
            f"eviction {config.eviction_policy}",
            policy,
        ]
    return f"{head}: {', '.join(parts)}"


def _type(config: TierConfig) -> str:
    if isinstance(config, FileTierConfig):
        return "file"
    if isinstance(config, RedisTierConfig):
        return "redis cluster" if config.cluster else "redis"
    return "memory"


def _endpoint(config: RedisTierConfig) -> str:
    """The URL without its password, and where secrets came from."""
    text = redact_url(config.url)
    if config.url_env is not None:
        text += f" (url from ${config.url_env})"
    if config.password_env is not None:
        text += f" (password from ${config.password_env})"
    return text


def probe_remote_tiers(settings: KVOffloadSettings, probe: Probe) -> list[str]:
    """Asks each Redis tier's server once (`probe`); a warning for each that
    does not answer, naming the tier and its endpoint without a password."""
    warnings = []
    for mapping in settings.secondary_tiers:
        config = parse_tier_config(mapping)
        if not isinstance(config, RedisTierConfig):
            continue
        reason = probe(config)
        if reason is not None:
            # Masked again here: whatever the probe's text quotes.
            reason = redact_text(reason, config.secrets())
            warnings.append(
                f"tier {config.name!r}: {redact_url(config.url)} does not answer "
                f"({reason}); serving starts anyway: its lookups miss and its "
                "stores drop until it does"
            )
    return warnings


def probe_redis_tier(config: RedisTierConfig) -> str | None:
    # Imported here: redis-py is needed only when a Redis tier is configured.
    from kvoffload.tiers.secondary.redis_probe import probe_redis

    return probe_redis(config)


def log_start_up(settings: KVOffloadSettings, probe: Probe = probe_redis_tier) -> None:
    """The configuration, one line for host memory and one per tier, then a
    warning for each remote tier that does not answer `probe`."""
    if settings.config_file is not None:
        logger.info("kvoffload: settings read from %s", settings.config_file)
    for line in describe(settings):
        logger.info("kvoffload: %s", line)
    for warning in probe_remote_tiers(settings, probe):
        logger.warning("kvoffload: %s", warning)
