"""The bet on a loaded head: returns scored by the engine's hit (issue 22)."""

from __future__ import annotations

from kvoffload.connector.head_bets import MAX_PENDING, HeadBets
from kvoffload.keys import OffloadKey


def keys(conversation: int, n: int) -> list[OffloadKey]:
    return [OffloadKey(f"c{conversation}.{i}".encode()) for i in range(n)]


def test_no_return_seen_keeps_the_head() -> None:
    bets = HeadBets()
    bets.note_finished(keys(0, 8), 4, 8)
    assert not bets.tail_first()


def test_returns_the_engine_serves_the_head_of_favour_the_tail() -> None:
    """Scenario: conversations loaded 4 chunks and computed 4 more; each came
    back with the engine still holding its head (hit 5 of 10 chunks)."""
    bets = HeadBets()
    for c in range(3):
        bets.note_finished(keys(c, 8), 4, 8)
        bets.note_lookup(keys(c, 10), 5)
    assert bets.tail_first()


def test_returns_past_the_engine_favour_the_head() -> None:
    bets = HeadBets()
    for c in range(3):
        bets.note_finished(keys(c, 8), 4, 8)
        bets.note_lookup(keys(c, 10), 2)
    assert not bets.tail_first()


def test_a_return_the_engine_serves_whole_says_nothing() -> None:
    """Hits covering the whole earlier prompt are served either way: they do
    not outvote the one return that needed the head from the tier."""
    bets = HeadBets()
    bets.note_finished(keys(0, 8), 4, 8)
    bets.note_lookup(keys(0, 10), 1)
    for c in range(1, 6):
        bets.note_finished(keys(c, 8), 4, 8)
        bets.note_lookup(keys(c, 10), 8)
    assert not bets.tail_first()


def test_a_return_is_scored_once() -> None:
    bets = HeadBets()
    for c in (0, 2):
        bets.note_finished(keys(c, 8), 4, 8)
        bets.note_lookup(keys(c, 10), 1)
    bets.note_finished(keys(1, 8), 4, 8)
    for _ in range(3):
        bets.note_lookup(keys(1, 10), 6)
    assert not bets.tail_first()  # two for the head, one (not three) for the tail


def test_the_recent_workload_outweighs_the_old() -> None:
    bets = HeadBets()
    for c in range(20):
        bets.note_finished(keys(c, 8), 4, 8)
        bets.note_lookup(keys(c, 10), 0)
    for c in range(20, 30):
        bets.note_finished(keys(c, 8), 4, 8)
        bets.note_lookup(keys(c, 10), 6)
    assert bets.tail_first()


def test_a_shorter_return_counts_to_its_own_end() -> None:
    """A request sharing the head but ending before the earlier prompt did:
    the engine served all it has, so it says nothing."""
    bets = HeadBets()
    bets.note_finished(keys(0, 8), 4, 8)
    bets.note_lookup(keys(0, 6), 6)
    bets.note_finished(keys(1, 8), 4, 8)
    bets.note_lookup(keys(1, 6), 2)
    assert not bets.tail_first()


def test_nothing_to_bet_on_is_not_noted() -> None:
    """No loaded head, or no tail after it: no return can score it."""
    bets = HeadBets()
    bets.note_finished(keys(0, 8), 0, 8)
    bets.note_finished(keys(1, 8), 8, 8)
    bets.note_lookup(keys(0, 10), 5)
    bets.note_lookup(keys(1, 10), 9)
    assert not bets.tail_first()


def test_memory_is_bounded_oldest_first() -> None:
    bets = HeadBets()
    bets.note_finished(keys(0, 8), 4, 8)
    for c in range(1, MAX_PENDING + 1):
        bets.note_finished(keys(c, 8), 4, 8)
    bets.note_lookup(keys(0, 10), 6)  # forgotten: no score
    assert not bets.tail_first()
    bets.note_lookup(keys(MAX_PENDING, 10), 6)
    assert bets.tail_first()


def test_clear_forgets_scores_and_heads() -> None:
    bets = HeadBets()
    bets.note_finished(keys(0, 8), 4, 8)
    bets.note_lookup(keys(0, 10), 6)
    bets.note_finished(keys(1, 8), 4, 8)
    bets.clear()
    assert not bets.tail_first()
    bets.note_lookup(keys(1, 10), 6)
    assert not bets.tail_first()
