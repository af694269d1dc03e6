"""Reaching a Redis master through Redis Sentinel.

The tier's `url` names the sentinels and the service they watch:
`redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db]`
(`rediss+sentinel://` for TLS to the master; a sentinel's port defaults to
26379). The password is the master's; sentinels that need one of their own get
it from the tier's `options` (`sentinel_kwargs`). The client asks a sentinel for
the master on every new connection, so after a failover the next call after the
tier's back-off reaches the new master.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from kvoffload.tiers.secondary.redis_url import redact_url

SENTINEL_SCHEMES = ("redis+sentinel://", "rediss+sentinel://")
DEFAULT_SENTINEL_PORT = 26379


@dataclass(frozen=True)
class SentinelAddress:
    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    ssl: bool = False

    def master_kwargs(self) -> dict[str, Any]:
        """Connection settings of the master (and replicas) it names."""
        kwargs: dict[str, Any] = {"db": self.db}
        if self.username is not None:
            kwargs["username"] = self.username
        if self.password is not None:
            kwargs["password"] = self.password
        if self.ssl:
            kwargs["ssl"] = True
        return kwargs


def is_sentinel_url(url: str) -> bool:
    return url.startswith(SENTINEL_SCHEMES)


def parse_sentinel_url(url: str) -> SentinelAddress:
    """The sentinels, service and master settings of a `redis+sentinel://` URL;
    `ValueError` saying what is wrong otherwise."""
    scheme, sep, rest = url.partition("://")
    if not sep or f"{scheme}://" not in SENTINEL_SCHEMES:
        raise ValueError(
            f"url: {redact_url(url)!r} must start with one of {SENTINEL_SCHEMES}"
        )
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if not at:
        hosts, userinfo = netloc, ""
    try:
        sentinels = tuple(_host_port(part, url) for part in hosts.split(","))
    except ValueError:
        if at or "@" not in path:
            raise
        # The password holds a '/': what was taken for hosts is part of it.
        raise ValueError(
            f"url: {redact_url(url)!r}: a '/' in the password must be "
            "percent-encoded as %2F"
        ) from None
    parts = [p for p in path.split("/") if p]
    if not parts or len(parts) > 2:
        raise ValueError(
            f"url: {redact_url(url)!r} must end in /service or /service/db "
            "(the name the sentinels monitor)"
        )
    db = 0
    if len(parts) == 2:
        if not parts[1].isdigit():
            raise ValueError(
                f"url: {redact_url(url)!r}: db {parts[1]!r} is not a number"
            )
        db = int(parts[1])
    username: str | None = None
    password: str | None = None
    if userinfo:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    return SentinelAddress(
        sentinels,
        unquote(parts[0]),
        db,
        username,
        password,
        ssl=scheme == "rediss+sentinel",
    )


def _host_port(part: str, url: str) -> tuple[str, int]:
    host, colon, port = part.rpartition(":")
    if not colon:
        host, port = part, str(DEFAULT_SENTINEL_PORT)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"url: {redact_url(url)!r}: {part!r} is not a sentinel host:port"
        )
    return host, int(port)
