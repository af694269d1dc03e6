"""Telling a `ChunkObserver` which chunks of a live request are loaded or stored."""

from __future__ import annotations

from collections.abc import Sequence

from kvoffload.connector.base import ChunkObserver
from kvoffload.connector.request_state import GroupState, RequestState
from kvoffload.connector.transfers import load_span
from kvoffload.keys import OffloadKey


def observe_load(
    observer: ChunkObserver, state: RequestState, start: int, end: int
) -> None:
    """The chunks covering tokens [start, end) of every group are loaded."""
    for group in state.groups:
        chunks = load_span(group, start, end)
        span = range(chunks.start, min(chunks.stop, len(group.keys)))
        if span:
            observer(state.req_id, group.index, [(c, group.keys[c]) for c in span])


def observe_store(
    observer: ChunkObserver,
    req_id: str,
    chunks: Sequence[tuple[GroupState, int]],
    stored: Sequence[OffloadKey],
) -> None:
    """Of `chunks` (group, chunk index), those whose keys are in `stored`."""
    new = set(stored)
    by_group: dict[int, list[tuple[int, OffloadKey]]] = {}
    for group, c in chunks:
        if group.keys[c] in new:
            by_group.setdefault(group.index, []).append((c, group.keys[c]))
    for index, pairs in by_group.items():
        observer(req_id, index, pairs)
