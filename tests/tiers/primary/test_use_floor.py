"""A store spares the chunks used after its request's own, where the policy
keeps a clock of uses (`split`): CPUOffloadingManager's use floor."""

from __future__ import annotations

from kvoffload import CPUOffloadingManager, OffloadKey, ReqContext, make_offload_key


def keys(*ids: int) -> list[OffloadKey]:
    return [make_offload_key(i.to_bytes(8, "big"), 0) for i in ids]


def serve(m: CPUOffloadingManager, ids: list[int], name: str) -> None:
    """A request that stores its prompt's chunks and uses them."""
    ctx = ReqContext(name)
    out = m.prepare_store(keys(*ids), ctx)
    assert out is not None
    m.complete_store(out.keys_to_store, ctx)
    m.touch(keys(*ids), ctx)
    m.on_request_finished(ctx)


def served_after_a_reuse() -> CPUOffloadingManager:
    """Scenario: conversation a's first chunk was reused, then b, c and d
    were served (their chunks, each stored once, used after a's); the tier is
    full."""
    m = CPUOffloadingManager(4, "split")
    serve(m, [1], "a-turn-1")
    m.touch(keys(1), ReqContext("a-turn-2"))
    for i, name in ((11, "b"), (21, "c"), (31, "d")):
        serve(m, [i], name)
    return m


def test_a_store_spares_the_chunks_used_since_its_own() -> None:
    """a's next turn finds k(1) here but has not used it since (the engine held
    it): its store of k(2) would take b's chunk, the oldest stored once, though
    b, served after a, is likelier to return first. It is refused instead."""
    m = served_after_a_reuse()
    ctx = ReqContext("a-turn-3")
    assert m.lookup_prefix(keys(1, 2), ctx).present == 1
    assert m.prepare_store(keys(1, 2), ctx) is None
    assert m.lookup_prefix(keys(11, 21, 31, 1), ctx).ready == 4


def test_a_prefix_just_used_sets_no_floor() -> None:
    """Once the request has used its prefix (the connector touches a load
    before its store), nothing was used since: `split`'s own order decides."""
    m = served_after_a_reuse()
    ctx = ReqContext("a-turn-3")
    m.touch(keys(1), ctx)
    out = m.prepare_store(keys(1, 2), ctx)
    assert out is not None and out.evicted_keys == tuple(keys(11))


def test_a_prefix_used_beyond_two_capacities_of_uses_sets_no_floor() -> None:
    """Past about a round through the tier (two capacities of uses, here 8),
    the order of the uses says nothing of who returns first."""
    m = served_after_a_reuse()
    m.touch(keys(*range(100, 109)), ReqContext("elsewhere"))  # 9 more uses
    ctx = ReqContext("a-turn-3")
    out = m.prepare_store(keys(1, 2), ctx)
    assert out is not None and out.evicted_keys == tuple(keys(11))


def test_only_uses_from_before_the_request_arrived_set_a_floor() -> None:
    """A request that used its prefix after it arrived (a load, touched before
    its store) sets no floor, even if a batch served others in between: what
    they used tells nothing of who returns first."""
    m = CPUOffloadingManager(4, "split")
    serve(m, [1], "a-turn-1")
    m.touch(keys(1), ReqContext("a-turn-2"))
    ctx = ReqContext("a-turn-3")
    m.on_new_request(ctx)
    m.touch(keys(1), ctx)
    for i, name in ((11, "b"), (21, "c"), (31, "d")):
        serve(m, [i], name)
    out = m.prepare_store(keys(1, 2), ctx)
    assert out is not None and out.evicted_keys == tuple(keys(11))


def test_a_request_announced_on_arrival_keeps_the_floor_of_its_earlier_turn() -> None:
    """The same as the first scenario, the request announced before the others
    were served: the floor is its prefix's use before it arrived."""
    m = CPUOffloadingManager(4, "split")
    serve(m, [1], "a-turn-1")
    m.touch(keys(1), ReqContext("a-turn-2"))
    ctx = ReqContext("a-turn-3")
    m.on_new_request(ctx)
    for i, name in ((11, "b"), (21, "c"), (31, "d")):
        serve(m, [i], name)
    assert m.prepare_store(keys(1, 2), ctx) is None
    m.on_request_finished(ctx)
