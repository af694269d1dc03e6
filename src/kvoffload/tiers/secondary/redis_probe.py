"""One PING to a Redis tier's server at start-up, to say early whether it answers.

The tier itself connects on first use, so a server that is down, or a wrong host
or password, would first show as a warning at the first store; the probe says so
while the engine starts (serving starts anyway: a tier that does not answer
gives misses, as it would later). It waits at most `PROBE_TIMEOUT_S`, whatever
the tier's own `timeout_s`, so that a silent host cannot hold up start-up.
"""

from __future__ import annotations

import copy
import time

from kvoffload.tiers.secondary.redis_config import RedisTierConfig
from kvoffload.tiers.secondary.redis_link import REDIS_ERRORS, RedisLink

PROBE_TIMEOUT_S = 2.0


def probe_redis(
    config: RedisTierConfig, timeout_s: float = PROBE_TIMEOUT_S
) -> str | None:
    """None if the server answers a PING within `timeout_s` (or the tier's
    `timeout_s`, if shorter); otherwise why not, without the tier's secrets."""
    # The tier's config with the shorter timeout: a copy, as `replace` would
    # check the settings (and read the environment) again.
    probing = copy.copy(config)
    object.__setattr__(probing, "timeout_s", min(config.timeout_s, timeout_s))
    link = RedisLink(probing, time.monotonic)
    try:
        link.client.ping()
    except REDIS_ERRORS as exc:
        return link.redact(exc) or type(exc).__name__
    finally:
        link.close()
    return None
