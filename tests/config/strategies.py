"""Hypothesis strategies for fuzzing configuration and per-request parameters:
JSON-like values, and values JSON cannot carry (int keys, 5,000-digit ints)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

# No '.' or ':': an eviction policy with one is imported by name, and arbitrary
# module imports (some print, one opens a browser) have no place in a test.
TEXT = st.text(st.characters(blacklist_characters=".:", codec="utf-8"), max_size=12)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([2**63, -(2**63), 2**64])
    # Built, not listed: hypothesis shows a strategy's values with repr(), which
    # raises for an int of 5,000 digits (and is slow for long strings).
    | st.sampled_from([5000, -5000, 400]).map(lambda d: 10 ** abs(d) * (d // abs(d)))
    | st.floats()
    | TEXT
    | st.sampled_from([("9", 5000, ""), ("0", 5000, "1"), ("1", 60, "GiB")]).map(
        lambda s: s[0] * s[1] + s[2]
    )
    | st.integers(100, 100_000).map("x".__mul__)
)
KEYS_ANY = TEXT | st.integers() | st.none() | st.tuples(st.integers())
JSONISH = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner)
        | st.dictionaries(KEYS_ANY, inner, max_size=3)
    ),
    max_leaves=8,
)


def either(*good: object) -> st.SearchStrategy[Any]:
    """A plausible value of a setting, or anything at all."""
    return st.sampled_from(good) | JSONISH


CAPS = ("max_offload_tokens", "max_load_tokens")
SELECTORS = ("kv_load_tiers", "kv_store_tiers")
TIER_NAMES = frozenset({"file", "redis"})
ENTRIES = st.sampled_from(
    [
        *("file", "redis", "disk", "cpu", "storage", "local", "remote"),
        *("cpu:local", "storage:remote", "cpu:nowhere", "", " file ", "file,redis"),
    ]
)
PARAMS = st.fixed_dictionaries(
    {},
    optional={
        **{cap: st.integers(-3, 10**6) | JSONISH for cap in CAPS},
        **{
            name: st.lists(ENTRIES | JSONISH, max_size=4)
            | ENTRIES
            | st.lists(ENTRIES, max_size=3).map(",".join)
            | JSONISH
            for name in SELECTORS
        },
        "kv_retention_s": st.floats(-10, 1e6)
        | st.integers(-3, 10**6)
        | st.sampled_from([0, 0.0, -0.0, 10**400, float("inf"), float("nan")])
        | JSONISH,
        "do_remote_prefill": st.booleans(),  # another connector's: not ours
    },
).flatmap(
    lambda known: st.dictionaries(KEYS_ANY, JSONISH, max_size=2).map(
        lambda unknown: {**unknown, **known}
    )
)
