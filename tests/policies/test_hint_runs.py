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
from kvoffload.policies.zero_hints import FOUND, OWN, ZeroHints

from .support import always, k

_ops = st.lists(
    st.tuples(st.integers(0, 3), st.lists(st.integers(0, 24), max_size=8)),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops=_ops, back=st.tuples(st.integers(0, 4), st.integers(0, 4)))
def test_zero_hints_keep_the_order_of_a_table_of_chunks_hinted_0(
    ops: list[tuple[int, list[int]]], back: tuple[int, int]
) -> None:
    """Chunks hinted 0 (a chunk already hinted keeps its date; those in `skip`
    are left out), taken out one by one, in bulk or from the believed front:
    the believed chunks come oldest first, each call's chunks from the end of
    its prefix back, as from an insertion-ordered table; each kind of 0 is
    believed from its own date."""
    zero, model = ZeroHints(), OrderedDict[OffloadKey, tuple[int, int]]()
    skip = {k(i) for i in range(0, 25, 7)}
    for clock, (op, ids) in enumerate(ops, 1):
        keys = list(dict.fromkeys(k(i) for i in ids))
        if op == 0:
            # Chunks the hinting request stored itself (`OWN`); none told on
            # every third call (then all are).
            own = None if clock % 3 == 0 else {k(i) for i in ids if i % 2 == clock % 2}
            fresh = [key for key in keys if key not in model and key not in skip]
            mine = [key for key in fresh if own is None or key in own]
            found = [key for key in fresh if key not in mine]
            assert zero.add(keys, clock, skip, own) == (len(mine), len(found))
            model.update(dict.fromkeys(reversed(mine), (clock, OWN)))
            model.update(dict.fromkeys(reversed(found), (clock, FOUND)))
        elif op == 1:
            assert sorted(zero.pop_many(keys)) == sorted(
                mark(*model.pop(key)) for key in keys if key in model
            )
        elif op == 2:
            for key in keys:
                popped = model.pop(key, None)
                assert zero.pop(key) == (None if popped is None else mark(*popped))
        else:
            ripe = (clock - back[0], clock - back[1])
            believed = [key for key, (at, of) in model.items() if at <= ripe[of]]
            taken = zero.first_evictable(len(keys), ripe, always)
            assert taken == believed[: len(keys)]
            assert zero.take(taken) == [mark(*model.pop(key)) for key in taken]
            if zero.all_believed(ripe):
                assert all(at <= ripe[of] for at, of in model.values())
        assert zero.marks == {key: mark(*entry) for key, entry in model.items()}
        assert list(zero.marks) == list(model)
        assert list(zero.believed((clock, clock))) == list(model)


def mark(stamp: int, kind: int) -> int:
    """What `ZeroHints` gives back for a 0 of `kind` dated `stamp`."""
    return stamp << 1 | kind


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
