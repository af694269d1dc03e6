"""Start-up checks of a Redis tier's settings beyond their types.

Durations Redis and the platform accept and that leave the tier useful; the URL
and password read from environment variables (`url_env`, `password_env`), so that
no secret need be written into the config that an engine logs; and the redis-py
options, given in `options` or in the URL's query, that the tier can use with its
URL (TLS ones only with `rediss://`, Cluster ones only with `cluster`, none that
the tier sets itself). Each failure is a `ValueError` that names the key, the
value (a URL without its password, a secret never) and what is allowed.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from kvoffload.config import finite_seconds
from kvoffload.tiers.secondary.redis_sentinel import is_sentinel_url
from kvoffload.tiers.secondary.redis_url import redact_url, shown_value

# Redis refuses an expiry (`SET ... PX`, `PEXPIRE`) past 2**63 - 1 ms less its
# clock's Unix time in ms (about 2**63 - 2**41 today); 2**62 ms, about 146
# million years, is within that for any clock this side of the year 146,000,000.
MAX_TTL_S = float(2**62 // 1000)
# Redis counts expiry in whole ms; a shorter timeout fails every call.
MIN_SECONDS = 0.001
MAX_TIMEOUT_S = 300.0  # a server silent for longer is down, not slow
MAX_BACKOFF_S = 3600.0  # longer would keep a recovered server unused for hours
MAX_CACHE_S = 86400.0  # answers older than a day miss what other engines did
MAX_THREADS = 256
MAX_BATCH_BYTES = 1 << 40  # pipelined values of one batch; past it, one per job

TLS_SCHEMES = ("rediss://", "rediss+sentinel://")

# Settings the tier makes itself, or that the URL makes: given as options (or
# in the URL's query) they would override the tier's timeouts and retries, or
# be ignored in favour of the URL.
OWNED_OPTIONS = frozenset(
    {
        "socket_timeout",
        "socket_connect_timeout",
        "retry",
        "retry_on_timeout",
        "retry_on_error",
        "decode_responses",
        "single_connection_client",
        "cluster_error_retry_attempts",
        "connection_pool",
        "connection_pool_class",
        "connection_class",
        "url",
        "host",
        "port",
        "path",
        "unix_socket_path",
        "startup_nodes",
        "timeout",  # redis-py's old name of socket_timeout (URL query)
    }
)
# Taken by the tier itself, not by redis-py: the sentinels' connection settings.
SENTINEL_KWARGS = "sentinel_kwargs"


def safe_repr(value: object) -> str:
    """`repr(value)`, except for what has no printable repr (an int past
    Python's digit limit) or is too long to show."""
    if (
        isinstance(value, int)
        and not isinstance(value, bool)
        and value.bit_length() > 64
    ):
        return f"an int of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 200 else f"{text[:200]}... ({len(text)} characters)"


def check_seconds(
    name: str,
    value: object,
    minimum: float = MIN_SECONDS,
    maximum: float = math.inf,
    allow_none: bool = False,
) -> None:
    """`value` seconds between `minimum` and `maximum`: an int or float, not a
    bool, NaN or infinity."""
    if value is None and allow_none:
        return
    seconds = finite_seconds(value)
    if seconds is None or not minimum <= seconds <= maximum:
        allowed = f"a number of seconds from {minimum:g} to {maximum:g}"
        if allow_none:
            allowed += " or null"
        raise ValueError(f"{name}: {safe_repr(value)} must be {allowed}")


def check_count(name: str, value: object, minimum: int, maximum: int) -> None:
    if type(value) is not int or not minimum <= value <= maximum:
        raise ValueError(
            f"{name}: {safe_repr(value)} must be an int from {minimum} to {maximum}"
        )


def read_env(key: str, variable: object) -> str:
    """The value of the environment variable named by the setting `key`; an
    error naming both if it is unset or empty (the value is never shown)."""
    if not isinstance(variable, str) or not variable or "=" in variable:
        raise ValueError(
            f"{key}: {safe_repr(variable)} must be the name of an environment variable"
        )
    value = os.environ.get(variable)
    if not value:
        state = "is empty" if value == "" else "is not set"
        raise ValueError(
            f"{key}: the environment variable {variable!r} {state}; set it, or "
            f"remove {key!r} from the tier's settings"
        )
    return value


def resolve_url(url: object, url_env: object) -> object:
    """The URL: `url`, or the value of the variable `url_env` names (exactly
    one of them)."""
    if url_env is None:
        if url is None or url == "":
            raise ValueError(
                "url: required (or url_env, naming a variable that holds it)"
            )
        return url
    if url is not None and url != "":
        raise ValueError(
            f"url_env: {safe_repr(url_env)} and url ({shown_value(url)}) are both "
            "given; give the URL in one of them"
        )
    return read_env("url_env", url_env)


def url_password(url: str) -> str | None:
    """The password in a URL's user info or its query (`?password=`)."""
    netloc = url.partition("://")[2].partition("/")[0]
    userinfo, at, _ = netloc.rpartition("@")
    if at and ":" in userinfo:
        return unquote(userinfo.partition(":")[2]) or None
    return dict(url_query(url)).get("password") or None


def url_query(url: str) -> list[tuple[str, str]]:
    """The settings in a URL's query (redis-py reads them as options)."""
    return parse_qsl(urlsplit(url).query)


def check_url(url: str, cluster: bool) -> None:
    """A database number redis-py reads as one (it reads `/abc` as db 0), db 0
    for a Cluster, and query settings checked as options are."""
    if is_sentinel_url(url):
        if "?" in url:
            raise ValueError(
                f"url: {shown_value(url)}: a redis+sentinel:// URL takes no query; "
                "give options in 'options'"
            )
        return
    parts = urlsplit(url)
    query = url_query(url)
    db = dict(query).get("db")
    if db is not None and not (db.isascii() and db.isdigit()):
        raise ValueError(
            f"url: {shown_value(url)}: the database (db=) must be a number"
        )
    if not url.startswith("unix://"):
        path = parts.path.strip("/")
        if path and not (path.isascii() and path.isdigit()):
            raise ValueError(
                f"url: {shown_value(url)}: the path must be a database number "
                "(/0, /1, ...), not a name"
            )
        if cluster and (path not in ("", "0") or (db or "0") != "0"):
            raise ValueError(
                f"url: {shown_value(url)}: a Redis Cluster has database 0 only"
            )
    names = [name for name, _ in query if name != "password"]
    check_option_names(names, "url query", cluster, _tls(url))


def check_options(
    options: Mapping[str, Any], url: str, cluster: bool, password_env: object
) -> None:
    """Options the tier can hand to redis-py with this URL; a password in one
    place only."""
    names = list(options)
    check_option_names(names, "options", cluster, _tls(url))
    if SENTINEL_KWARGS in options:
        if not is_sentinel_url(url):
            raise ValueError(
                f"options: {SENTINEL_KWARGS} are the sentinels' settings; give "
                "them with a redis+sentinel:// URL only"
            )
        sentinel = options[SENTINEL_KWARGS]
        if not isinstance(sentinel, Mapping):
            raise ValueError(  # the type only: the value may hold a password
                f"options: {SENTINEL_KWARGS} is a {type(sentinel).__name__}; "
                "expected a mapping of the sentinels' connection settings"
            )
        inner = [k for k in sentinel if not isinstance(k, str)]
        if inner:
            raise ValueError(f"options: {SENTINEL_KWARGS} keys {inner!r} are not names")
        # TLS to the sentinels is their own (`ssl: true` here).
        check_option_names(list(sentinel), SENTINEL_KWARGS, False, None)
    given = [
        where
        for where, present in (
            ("url", url_password(url) is not None),
            ("options.password", "password" in options),
            ("password_env", password_env is not None),
        )
        if present
    ]
    if len(given) > 1:
        raise ValueError(
            f"password: given in {' and '.join(given)}; give it in one place"
        )


def _tls(url: str) -> str | None:
    """`None` for a URL with TLS, else the URL as errors show it."""
    return None if url.startswith(TLS_SCHEMES) else redact_url(url)


def check_option_names(
    names: Iterable[str], where: str, cluster: bool, plain_url: str | None
) -> None:
    """Each of `names` one the client the tier makes takes, and not one the
    tier (or the URL) sets itself; with `plain_url` (a URL without TLS), no
    TLS option (`ssl_*`). `ssl` itself is for the sentinels only: the URL's
    scheme turns TLS on."""
    for name in sorted(names):
        if name in OWNED_OPTIONS:
            raise ValueError(
                f"{where}: {name!r} is set by the tier or its url (timeouts: "
                f"timeout_s); not allowed: {sorted(OWNED_OPTIONS)}"
            )
        tls_option = name == "ssl" or name.startswith("ssl_")
        if where != SENTINEL_KWARGS and tls_option and (name == "ssl" or plain_url):
            shown = f" with the url {plain_url!r}" if plain_url else ""
            raise ValueError(
                f"{where}: {name!r}{shown}: TLS is turned on by the url's scheme, "
                f"{TLS_SCHEMES[0]} (or {TLS_SCHEMES[1]}), and TLS options need it"
            )
    try:
        from kvoffload.tiers.secondary.redis_link import check_client_option_names
    except ImportError:  # no redis-py: the tier cannot be made anyway
        return
    check_client_option_names(names, cluster, where)


def secrets_of(
    url: str, options: Mapping[str, Any], password: str | None
) -> tuple[str, ...]:
    """Every secret in a tier's settings, as given and percent-decoded: the
    URL's password, `password` (from `password_env`), and option values whose
    name says password (the sentinels' too)."""
    found: list[object] = [password, url_password(url)]
    netloc = url.partition("://")[2].partition("/")[0]
    userinfo, at, _ = netloc.rpartition("@")
    if at:
        found.append(userinfo.partition(":")[2] or userinfo)
    sentinel = options.get(SENTINEL_KWARGS)
    for source in (options, sentinel if isinstance(sentinel, Mapping) else {}):
        found += [v for k, v in source.items() if "password" in str(k)]
    texts = {str(s) for s in found if isinstance(s, str | bytes) and s}
    return tuple(sorted(texts | {unquote(t) for t in texts}, key=len, reverse=True))
