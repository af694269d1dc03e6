"""The per-run hint state behind `RetentionPolicy`: the 0s (`ZeroHints`) keep
the order of the per-chunk table they replace, checked against one over random
operations; a positive hint counts in the claim a chunk is under now
(`HintClaims`)."""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from kvoffload.keys import OffloadKey
from kvoffload.policies import create_policy
from kvoffload.policies.retention import RetentionPolicy
from kvoffload.policies.zero_hints import ZeroHints

from .support import always, k

_ops = st.lists(
    st.tuples(st.integers(0, 3), st.lists(st.integers(0, 24), max_size=8)),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops=_ops, ripe_back=st.integers(0, 4))
def test_zero_hints_keep_the_order_of_a_table_of_chunks_hinted_0(
    ops: list[tuple[int, list[int]]], ripe_back: int
) -> None:
    """Chunks hinted 0 (a chunk already hinted keeps its date; those in `skip`
    are left out), taken out one by one, in bulk or from the believed front:
    the believed chunks come oldest first, as from an insertion-ordered table."""
    zero, model = ZeroHints(), OrderedDict[OffloadKey, int]()
    skip = {k(i) for i in range(0, 25, 7)}
    for clock, (op, ids) in enumerate(ops, 1):
        keys = list(dict.fromkeys(k(i) for i in ids))
        if op == 0:
            fresh = [key for key in keys if key not in model and key not in skip]
            assert zero.add(keys, clock, skip) == len(fresh)
            model.update(dict.fromkeys(fresh, clock))
        elif op == 1:
            assert sorted(zero.pop_many(keys)) == sorted(
                model.pop(key) for key in keys if key in model
            )
        elif op == 2:
            for key in keys:
                assert zero.pop(key) == model.pop(key, None)
        else:
            ripe = clock - ripe_back
            believed = [key for key, stamp in model.items() if stamp <= ripe]
            taken = zero.first_evictable(len(keys), ripe, always)
            assert taken == believed[: len(keys)]
            assert zero.take(taken) == [model.pop(key) for key in taken]
        assert {key: zero.stamp(key) for key in zero.run_of} == dict(model)
        assert list(zero.believed(clock)) == list(model)


def test_a_chunk_that_took_a_deadline_again_counts_in_its_new_claim() -> None:
    """Scenario: room for two hinted chunks. At one instant a request holds 2
    and 1 for 60 s; 1 leaves the tier and comes back, and 3, then 1 again, are
    held for the same deadline by later requests. Past the bound the oldest
    claim holding chunks gives up its tail: that claim holds only 2 now (1 is
    under the newest claim, whatever claim it was under before it left), so 2
    stops counting, not 1."""
    policy = RetentionPolicy(create_policy("lru", 10), lambda: 100.0, 0.2)
    for i in (1, 2, 3):
        policy.insert(k(i))
    policy.retain([k(2), k(1)], 60)
    policy.remove(k(1))
    policy.insert(k(1))
    policy.retain([k(3)], 60)
    policy.retain([k(1)], 60)
    assert [policy.hint_of(k(i)) for i in (1, 2, 3)] == [60, None, 60]
    assert policy.num_hinted() == 2
