"""Every error of a configuration at once, with "did you mean" for unknown keys.

A user who fixes one setting only to be told of the next, one start-up at a time,
loses minutes per round on a GPU server. So the checks of a configuration run
key by key into an `ErrorList`, which raises one `ConfigError` (a `ValueError`)
holding them all; with a single error, its text is that error's alone, as before.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from kvoffload.config.shapes import shown


class ConfigError(ValueError):
    """One or more configuration errors; `messages` lists each (a line each)."""

    def __init__(self, messages: Iterable[str]) -> None:
        self.messages: tuple[str, ...] = tuple(dict.fromkeys(messages))
        assert self.messages, "a ConfigError holds at least one error"
        if len(self.messages) == 1:
            text = self.messages[0]
        else:
            listed = "\n".join(f"  - {message}" for message in self.messages)
            text = f"{len(self.messages)} configuration errors:\n{listed}"
        super().__init__(text)


def messages_of(error: BaseException) -> tuple[str, ...]:
    """The errors `error` reports: each of a `ConfigError`'s, else its text."""
    if isinstance(error, ConfigError):
        return error.messages
    return (str(error),)


class ErrorList:
    """Collects the errors of independent checks; `raise_if_any` raises them
    together. A check is a `with errors.check():` block: a `ValueError` or
    `TypeError` raised in it is recorded (each of a `ConfigError`'s, prefixed
    with `where`) and the block is left, so the next check still runs."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def add(self, message: str) -> None:
        self.messages.append(message)

    @contextmanager
    def check(self, where: str = "") -> Iterator[None]:
        try:
            yield
        except (ValueError, TypeError) as error:
            self.messages.extend(f"{where}{m}" for m in messages_of(error))

    def __bool__(self) -> bool:
        return bool(self.messages)

    def raise_if_any(self) -> None:
        if self.messages:
            raise ConfigError(self.messages)


def suggestion(key: str, valid: Iterable[str]) -> str | None:
    """The valid key `key` was most likely meant to be (a typo), if any."""
    close = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.6)
    return close[0] if close else None


def unknown_key(where: str, key: str, valid: Iterable[str]) -> str:
    """The error for an unknown `key` in `where`: a suggestion when one is
    close, and the valid keys (names only: the list stays one line)."""
    names = sorted(valid)
    guess = suggestion(key, names)
    hint = f" (did you mean {guess!r}?)" if guess is not None else ""
    return f"{where}: unknown key {shown(key)}{hint}; valid keys: {names}"
