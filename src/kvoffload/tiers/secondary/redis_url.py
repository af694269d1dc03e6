"""Redis, Sentinel and Cluster URLs as they may appear in errors and logs.

A URL can carry the password (`redis://user:secret@host:6379/0`, or a
`?password=` query parameter, which redis-py also reads); start-up errors and
log lines show it through `redact_url` only, and any other text (an exception
of redis-py's, which may echo the URL or a setting) through `redact_text`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MASK = "***"

# A URL inside free text: a scheme, then everything up to a space.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")
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


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with every URL in it redacted (`redact_url`) and every one of
    `secrets` (the longest first) replaced by `***`."""
    text = _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)
    for secret in sorted(secrets, key=len, reverse=True):
        if secret:
            text = text.replace(secret, MASK)
    return text


def shown_value(value: object) -> str:
    """A config value that may hold a Redis password, as an error shows it: a
    string as a URL without its password, anything else (a tier's mapping
    where a list of them belongs, say) by its type only."""
    if isinstance(value, str):
        text = repr(redact_url(value))
        # Short, as every config message shows values (`kvoffload.config.shown`).
        return text if len(text) <= 100 else f"{text[:48]}...{text[-48:]}"
    return f"a value of type {type(value).__name__}"


def _mask_value(match: re.Match[str]) -> str:
    return f"{match.group(1)}{MASK}"
