"""Redis, Sentinel and Cluster URLs as they may appear in errors and logs.

A URL can carry the password (`redis://user:secret@host:6379/0`, or a
`?password=` query parameter, which redis-py also reads); start-up errors and
log lines show it through `redact_url` only.
"""

from __future__ import annotations

import re

MASK = "***"

# `password=`, `sentinel_password=` and the like, up to the next parameter.
_SECRET_QUERY = re.compile(r"([?&][^=&#]*password[^=&#]*=)[^&#]*", re.IGNORECASE)


def redact_url(url: str) -> str:
    """`url` with its password replaced by `***`: `redis://user:***@host:6379/0`.

    Everything up to the last `@` counts as user info, not only what comes
    before the first `/`: a password with an unescaped `/`, `?`, `#` or `@`
    (base64 ones can hold a `/`) is hidden too. A URL whose path or query holds an `@` is
    then masked more than it needs to be, never less. A username is kept, the
    whole user info masked when it has no `:` (some clients read
    `redis://secret@host` as a password)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    userinfo, at, tail = rest.rpartition("@")
    if at and not rest.startswith("/"):  # `unix:///a@b.sock` has no user info
        user, colon, _ = userinfo.partition(":")
        shown = f"{user}:{MASK}" if colon and "/" not in user else MASK
        rest = f"{shown}@{tail}"
    return f"{scheme}{sep}{_SECRET_QUERY.sub(_mask_value, rest)}"


def shown_value(value: object) -> str:
    """A config value that may hold a Redis password, as an error shows it: a
    string as a URL without its password, anything else (a tier's mapping
    where a list of them belongs, say) by its type only."""
    if isinstance(value, str):
        return repr(redact_url(value))
    return f"a value of type {type(value).__name__}"


def _mask_value(match: re.Match[str]) -> str:
    return f"{match.group(1)}{MASK}"
