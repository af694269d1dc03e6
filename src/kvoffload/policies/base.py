"""The eviction-policy interface and its registry.

A policy orders the chunks a tier holds and picks victims; the tier manager owns
slots, pins and in-flight writes and tells the policy, through `evictable`, which
chunks it may not take. Policies are registered by name and can also be loaded
from an import path (`package.module:Class`), so out-of-tree policies plug in.
"""

from __future__ import annotations

import importlib
import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Container, Iterable, Iterator, Sequence, Set
from itertools import chain, filterfalse, groupby, islice
from operator import itemgetter
from typing import ClassVar, TypeVar

from kvoffload.config.shapes import shown
from kvoffload.keys import OffloadKey

Evictable = Callable[[OffloadKey], bool]


class StopEviction(Exception):
    """Raised by an `evictable` callback: neither this candidate nor any the
    policy would consider after it may be taken. `evict` lets it propagate,
    having changed nothing, as when it returns `None`."""


class StopList(StopEviction):
    """The `StopEviction` the tier manager raises at a storing request's own
    chunk (a store takes nothing its policy ranks above the request's own
    chunks). It ends the scan as `StopEviction` does, and a policy may learn
    from it, as from any choice it could not make: ARC moves its target away
    from T2 when T2's first choice was in use (`ARCPolicy._t2_in_use`). What
    the policy holds, and in what order, stays as it was."""


class Refusing:
    """An `Evictable` that refuses every key in some containers outright and
    asks `accept` about the rest. Called, it is the whole check; a policy that
    scans with `evictable_in` (or `first_evictable`) skips the refused keys in
    C instead, without a call per key. For a wrapper that sets keys aside
    (`RetentionPolicy`'s hinted chunks): they may fill the front of the wrapped
    policy's order, and every eviction would otherwise ask about each again.
    With a `tally` (an `itertools.count`), each key accepted advances it: the
    wrapper learns how many were, without a call of its own per key. With
    `watched` (`held`, `passed`), the keys in `held` are refused too, and each
    one a scan reads past is added to `passed`: the wrapper learns which of the
    keys it set aside the wrapped policy would have given up (runs of them are
    skipped in C as well)."""

    __slots__ = ("accept", "refused", "tally", "watched")

    def __init__(
        self,
        refused: Sequence[Container[OffloadKey]],
        accept: Evictable,
        tally: Iterator[int] | None = None,
        watched: tuple[Container[OffloadKey], set[OffloadKey]] | None = None,
    ):
        self.refused = tuple(refused)
        self.accept = accept
        self.tally = tally
        self.watched = watched

    def __call__(self, key: OffloadKey) -> bool:
        for keys in self.refused:
            if key in keys:
                return False
        watched = self.watched
        if watched is not None and key in watched[0]:
            watched[1].add(key)
            return False
        if not self.accept(key):
            return False
        if self.tally is not None:
            next(self.tally)
        return True


def evictable_in(
    keys: Iterable[OffloadKey], evictable: Evictable
) -> Iterator[OffloadKey]:
    """The keys of `keys` that `evictable` accepts, lazily, in order, asking it
    about each key once (a `Refusing` one only about the keys it does not refuse
    outright, which is the same answer)."""
    if isinstance(evictable, Refusing):
        for refused in evictable.refused:
            keys = filterfalse(refused.__contains__, keys)
        if evictable.watched is not None:
            keys = chain.from_iterable(_runs_not_held(keys, *evictable.watched))
        accepted = filter(evictable.accept, keys)
        tally = evictable.tally
        # (`zip` advances the tally only after a key is accepted.)
        return (
            accepted
            if tally is None
            else map(itemgetter(0), zip(accepted, tally, strict=False))
        )
    return filter(evictable, keys)


def _runs_not_held(
    keys: Iterable[OffloadKey], held: Container[OffloadKey], passed: set[OffloadKey]
) -> Iterator[Iterator[OffloadKey]]:
    """The runs of `keys` not in `held`, lazily; each run of held keys between
    them goes into `passed` as the scan reads past it (a scan that stops before
    a run never reads it)."""
    for is_held, run in groupby(keys, held.__contains__):
        if is_held:
            passed.update(run)
        else:
            yield run


def first_evictable(
    keys: Iterable[OffloadKey], n: int, evictable: Evictable
) -> list[OffloadKey]:
    """Up to `n` keys from `keys` (oldest first) that `evictable` accepts, the
    scan in C (only `evictable` runs per key in Python); an iterator `keys` is
    left just after the last one taken."""
    return list(islice(evictable_in(keys, evictable), n)) if n > 0 else []


class EvictionPolicy(ABC):
    """Orders resident chunks and chooses which to evict.

    Contract (checked by the contract suite for every registered policy):
    - `insert` adds a chunk that is not resident; `remove` drops one silently;
      `evicted_for` drops chunks the tier evicted in the policy's place (by
      default as `remove` does; a policy may learn that they were not its own
      choice).
    - `touch(keys, new)` takes one request's keys in prefix order and leaves the
      head most recently used. Keys in `new` were stored by that same request:
      their recency changes, but they do not count as reused. Unknown keys are
      ignored.
    - `evict(n, incoming, evictable)` is called before `incoming` (keys about to
      be inserted, in prefix order) are inserted, with `n >= 0` victims needed.
      It returns exactly `n` resident keys for which `evictable` is true and
      removes them, or returns `None` and changes nothing (all-or-nothing).
      It asks `evictable` about candidates in the order it would give them up,
      least valuable first, and lets `StopEviction` raised by `evictable`
      propagate, having changed nothing (the tier manager uses it to take
      victims only from chunks the policy ranks below a request's own; at a
      `StopList` a policy may move what it learns, not what it holds).
    - `clear` forgets everything, learned state included.
    """

    name: ClassVar[str] = ""
    chains_drain_from_tail: ClassVar[bool] = False
    """Whether the policy gives up a request's chunks tail first (its touch
    leaves the head most recent, and its order follows recency), so that a
    tier keeping whole chains (`tiers.primary.chains`) finds chain ends among
    its first candidates."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {shown(capacity)}")
        self.capacity = capacity

    @abstractmethod
    def __len__(self) -> int:
        """Number of resident chunks."""

    @abstractmethod
    def __contains__(self, key: object) -> bool:
        """Whether `key` is resident."""

    @abstractmethod
    def insert(self, key: OffloadKey) -> None:
        """Add a chunk that was not resident."""

    def insert_many(self, keys: Sequence[OffloadKey]) -> None:
        """`insert` each key, in order (policies may do it in one pass)."""
        for key in keys:
            self.insert(key)

    @abstractmethod
    def remove(self, key: OffloadKey) -> None:
        """Drop a chunk (a failed store, say); unknown keys are ignored."""

    def remove_many(self, keys: Sequence[OffloadKey]) -> None:
        """`remove` each key (policies may do it without a call per key)."""
        for key in keys:
            self.remove(key)

    def evicted_for(self, keys: Sequence[OffloadKey]) -> None:
        """The tier evicted `keys` in the policy's place (a wrapper's choice:
        `RetentionPolicy`'s believed 0s). They leave as with `remove_many`; a
        policy that learns from its own victims may weigh what each of them
        teaches by how few of the tier's evictions were its own (ARC)."""
        self.remove_many(keys)

    @abstractmethod
    def touch(
        self, keys: Sequence[OffloadKey], new: Set[OffloadKey] = frozenset()
    ) -> None:
        """Record one request's access to `keys` (prefix order, head ends MRU)."""

    @abstractmethod
    def evict(
        self, n: int, incoming: Sequence[OffloadKey], evictable: Evictable
    ) -> list[OffloadKey] | None:
        """Choose and remove `n` evictable chunks, or return `None` and change nothing."""

    @abstractmethod
    def clear(self) -> None:
        """Forget every chunk and all learned state."""

    def last_use(self, key: OffloadKey) -> int:
        """When resident `key` was last used, on the policy's clock of uses
        (`use_clock`); -1 for a key it does not hold or a policy without one."""
        return -1

    def latest_use(self, keys: Iterable[OffloadKey]) -> int:
        """The latest `last_use` of `keys`; -1 if none is held."""
        return max(map(self.last_use, keys), default=-1)

    @property
    def use_clock(self) -> int | None:
        """The policy's clock of uses now (it only grows), or `None` for a
        policy that keeps none: its order alone says what was used when."""
        return None

    def admit(self, keys: Sequence[OffloadKey]) -> Sequence[OffloadKey]:
        """The subset of new `keys` worth storing (policies that also do admission)."""
        return keys


_REGISTRY: dict[str, type[EvictionPolicy]] = {}

P = TypeVar("P", bound=type[EvictionPolicy])


def register_policy(name: str) -> Callable[[P], P]:
    """Class decorator: make a policy selectable by `name`."""

    def decorate(cls: P) -> P:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"eviction policy {name!r} is already registered")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorate


def policy_names() -> list[str]:
    """Names of the registered policies, sorted."""
    return sorted(_REGISTRY)


def get_policy_class(name: str) -> type[EvictionPolicy]:
    """The policy registered as `name`, or loaded from `module:Class` / `module.Class`.

    Raises `ValueError` naming `name` and the choices for anything else, a
    malformed import path included.
    """
    allowed = f"expected one of {policy_names()} or an import path 'module:Class'"
    if not isinstance(name, str) or not name:
        raise ValueError(
            f"eviction_policy: {shown(name)} is not a policy name; {allowed}"
        )
    if name in _REGISTRY:
        return _REGISTRY[name]
    if ":" in name or "." in name:
        module_name, sep, attr = name.partition(":")
        if not sep:
            module_name, _, attr = name.rpartition(".")
        try:
            obj = getattr(importlib.import_module(module_name), attr)
        # import_module raises TypeError for a relative name ('..x') and
        # ValueError for an empty one (':x'), neither naming the value.
        except (ImportError, AttributeError, TypeError, ValueError) as exc:
            raise ValueError(
                f"eviction_policy: cannot import {shown(name)} ({exc}); {allowed}"
            ) from exc
        if (
            isinstance(obj, type)
            and issubclass(obj, EvictionPolicy)
            and not inspect.isabstract(obj)
        ):
            return obj
        raise ValueError(
            f"eviction_policy: {shown(name)} is not a concrete EvictionPolicy subclass"
            " (one that implements every abstract method)"
        )
    raise ValueError(f"eviction_policy: unknown policy {shown(name)}; {allowed}")


def create_policy(name: str, capacity: int) -> EvictionPolicy:
    """Instantiate the policy `name` for a tier of `capacity` chunks."""
    return get_policy_class(name)(capacity)
