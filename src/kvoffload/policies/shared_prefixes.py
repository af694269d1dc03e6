"""Where the prefixes that requests share end, seen from the chunks they store.

A retention hint of 0 speaks for a request's own chunks, not for a prefix that
other requests share (a system prompt, say): `RetentionPolicy` hints 0 only the
chunks past the last one that `SharedPrefixes` saw end such a prefix.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence, Set
from itertools import compress, count

from kvoffload.keys import OffloadKey


class SharedPrefixes:
    """The chunks seen to end a shared prefix: those with two different first
    children. Both tables hold at most `capacity` chunks, the oldest out."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._children: OrderedDict[OffloadKey, OffloadKey] = OrderedDict()
        """A chunk's first child: the first chunk a request stored after it."""
        self._shared: OrderedDict[OffloadKey, None] = OrderedDict()
        """Chunks seen with two different children (bounded, oldest out)."""

    def clear(self) -> None:
        self._children.clear()
        self._shared.clear()

    def note_branch(self, keys: Sequence[OffloadKey], new: Set[OffloadKey]) -> None:
        """A request that found a prefix and stored what follows it branches
        there: the chunk before its first own one has that one as a child. A
        chunk with two different children ends a prefix requests share.
        `keys[0]` is not in `new`."""
        # The first stored key, found in C (keys[0] is not one).
        i = next(compress(count(), map(new.__contains__, keys)), 0)
        if not i:
            return
        parent, child = keys[i - 1], keys[i]
        first = self._children.get(parent)
        if first is None:
            self._children[parent] = child
            if len(self._children) > self.capacity:
                self._children.popitem(last=False)
        elif first != child and parent not in self._shared:
            self._shared[parent] = None
            if len(self._shared) > self.capacity:
                self._shared.popitem(last=False)

    def past_shared(self, keys: Sequence[OffloadKey]) -> Sequence[OffloadKey]:
        """`keys` after the last one that ends a prefix requests share (all of
        them if none does). Such chunks are few and near the front (block 0 on
        the bundled trace): each is looked for from the front, not the whole
        prompt walked from its end. (A request's keys are distinct: each
        chains its prefix's hash.)"""
        shared = self._shared
        if not shared:
            return keys
        found = shared.keys() & keys
        if not found:
            return keys
        return keys[max(map(keys.index, found)) + 1 :]
