"""Which chunks live requests hold in the engine (`connector.held`), and what a
release leaves out of its touch because of them.

A released request names, per group, the chunks the engine served it from its
prefix cache and its last chunk. Chunks of that engine hit that a live request
of another conversation holds stay out of its touch; a live request holding the
released request's last chunk continues that conversation and does not count.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvoffload.connector.held import HeldChunks
from kvoffload.connector.request_state import GroupState
from kvoffload.keys import OffloadKey


def _key(name: str) -> OffloadKey:
    return OffloadKey(name.encode())


def _group(keys: list[str], blocks: int, blocks_per_chunk: int = 1) -> GroupState:
    """A group whose table holds `blocks` engine blocks."""
    return GroupState(
        index=0,
        tokens_per_block=4,
        blocks_per_chunk=blocks_per_chunk,
        hashes_per_chunk=blocks_per_chunk,
        keys=[_key(k) for k in keys],
        block_ids=list(range(10, 10 + blocks)),
    )


def _release(keys: list[str], engine_hit: int) -> tuple[list[str], int]:
    """A released request with `keys`, the first `engine_hit` of them the
    engine's own hit."""
    return keys, engine_hit


SYSTEM = ["s0", "s1"]  # a system prompt every conversation starts with


def _touched(held: HeldChunks, release: tuple[list[str], int]) -> list[str]:
    """The released request's keys less those left out of its touch."""
    names, hit = release
    keys = [_key(name) for name in names]
    left_out = held.held_elsewhere([(keys[:hit], keys[-1])])
    return [key.decode() for key in keys if key not in left_out]


def test_a_shared_hit_another_conversation_holds_is_left_out_until_it_ends() -> None:
    """Scenario: B (system prompt and b0) is released while C, another
    conversation, runs on the same system prompt: B's touch leaves the system
    prompt out, its own chunk in. Once C ends, nothing is left out."""
    held = HeldChunks()
    held.sync("C", [_group([*SYSTEM, "c0", "c1"], 4)])
    release = _release([*SYSTEM, "b0"], engine_hit=2)
    assert _touched(held, release) == ["b0"]
    held.drop("C")
    assert _touched(held, release) == [*SYSTEM, "b0"]


def test_only_the_engine_hit_is_left_out() -> None:
    """Chunks the released request loaded or computed itself (past its engine
    hit) are touched even while another conversation holds them."""
    held = HeldChunks()
    held.sync("C", [_group([*SYSTEM, "c0"], 3)])
    assert _touched(held, _release([*SYSTEM, "b0"], engine_hit=1)) == ["s1", "b0"]


def test_the_request_continuing_the_conversation_does_not_count() -> None:
    """A live request holding B's last chunk is B's next turn: the engine's copy
    of the system prompt leaves with it, so B's touch keeps it. A second holder
    of another conversation does count."""
    held = HeldChunks()
    b = [*SYSTEM, "b0"]
    held.sync("B2", [_group([*b, "b1"], 4)])
    assert _touched(held, _release(b, engine_hit=2)) == b
    held.sync("C", [_group([*SYSTEM, "c0"], 3)])
    assert _touched(held, _release(b, engine_hit=2)) == ["b0"]


def test_a_chunk_is_held_only_with_all_its_blocks_and_its_key() -> None:
    """Scenario: chunks of two blocks. C's table covers the first chunk and half
    the second: it holds only the first. A key not known yet (its tokens are not
    all computed) is not held either; both count once they are."""
    held = HeldChunks()
    c = _group([*SYSTEM], 3, blocks_per_chunk=2)
    held.sync("C", [c])
    release = _release([*SYSTEM, "b0"], engine_hit=2)
    assert _touched(held, release) == ["s1", "b0"]
    c.block_ids.append(99)
    c.keys = c.keys[:1]  # as if s1's last block were not full yet
    held.sync("C", [c])
    assert _touched(held, release) == ["s1", "b0"]
    c.keys.append(_key("s1"))
    held.sync("C", [c])
    assert _touched(held, release) == ["b0"]


def test_holders_are_counted() -> None:
    """Two conversations hold the system prompt: it stays out until both end,
    preempted (its table emptied) or finished alike."""
    held = HeldChunks()
    c = _group([*SYSTEM, "c0"], 3)
    held.sync("C", [c])
    held.sync("D", [_group([*SYSTEM, "d0"], 3)])
    release = _release([*SYSTEM, "b0"], engine_hit=2)
    assert held.holders(_key("s0")) == 2
    held.drop("D")
    assert _touched(held, release) == ["b0"]
    c.block_ids = []
    held.sync("C", [c])
    assert _touched(held, release) == [*SYSTEM, "b0"]
    assert held.holders(_key("s0")) == 0


def test_a_rewrite_lets_go_of_the_dropped_chunks() -> None:
    """C's tokens past its first chunk were replaced (a streaming session): it
    no longer holds the old second chunk, and holds the new one once known."""
    held = HeldChunks()
    c = _group(["s0", "x"], 2)
    held.sync("C", [c])
    assert held.holders(_key("x")) == 1
    c.keys = c.keys[:1]
    held.sync("C", [c])
    assert held.holders(_key("x")) == 0
    c.keys.append(_key("y"))
    held.sync("C", [c])
    assert (held.holders(_key("x")), held.holders(_key("y"))) == (0, 1)


def test_disabled_holds_nothing() -> None:
    """Without an engine prefix cache the engine drops KV with the request:
    every touch stays whole."""
    held = HeldChunks(enabled=False)
    held.sync("C", [_group([*SYSTEM, "c0"], 3)])
    assert _touched(held, _release([*SYSTEM, "b0"], engine_hit=2)) == [*SYSTEM, "b0"]


# A request's turn length in chunks and blocks in its table, as they change
# (slot s runs conversation s % 4: slots 0 and 4 take turns of one conversation).
# Keys chain: chunk i of conversation c after the shared system prompt.
_REQUEST = st.tuples(st.integers(0, 5), st.integers(0, 7))


def _keys_of(conversation: int, length: int) -> list[OffloadKey]:
    return [
        *(_key(s) for s in SYSTEM),
        *(_key(f"c{conversation}.{i}") for i in range(length)),
    ]


@settings(max_examples=150, deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(0, 5), _REQUEST | st.none()), max_size=30),
    released=st.tuples(st.integers(0, 3), st.integers(0, 5), st.integers(0, 7)),
)
def test_matches_a_walk_over_every_live_request(
    steps: list[tuple[int, tuple[int, int] | None]],
    released: tuple[int, int, int],
) -> None:
    """Whatever requests start, grow, shrink and end, the touch is the one a
    walk over every live request's held chunks gives (the rule's definition)."""
    held = HeldChunks()
    live: dict[str, list[OffloadKey]] = {}  # what each live request holds
    for slot, request in steps:
        req_id = f"r{slot}"
        if request is None:
            held.drop(req_id)
            live.pop(req_id, None)
            continue
        length, blocks = request
        group = _group([k.decode() for k in _keys_of(slot % 4, length)], blocks)
        held.sync(req_id, [group])
        live[req_id] = group.keys[: min(len(group.keys), blocks)]
    conversation, length, hit = released
    keys = _keys_of(conversation, length)
    hit = min(hit, len(keys))
    left_out = {
        key
        for holds in live.values()
        if keys[-1] not in holds
        for key in keys[:hit]
        if key in holds
    }
    assert held.held_elsewhere([(keys[:hit], keys[-1])]) == left_out
