"""Redis URLs in errors and logs: the password never shows, the rest does."""

from __future__ import annotations

import pytest

from kvoffload.tiers.secondary.redis_url import redact_text, redact_url, shown_value


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://user:s3cret@cache:6379/0", "redis://user:***@cache:6379/0"),
        ("rediss://:s3cret@cache:6380/1", "rediss://:***@cache:6380/1"),
        # Read as a password by some clients: the whole user info goes.
        ("redis://s3cret@cache", "redis://***@cache"),
        (
            "redis+sentinel://app:p%40ss@s1,s2/cache/2",
            "redis+sentinel://app:***@s1,s2/cache/2",
        ),
        # Unescaped '/', '?', '#' or '@' in the password (base64 has '/').
        ("redis://user:s3/cr?e#t@cache:6379/0", "redis://user:***@cache:6379/0"),
        ("redis://:s3@cret@cache", "redis://:***@cache"),
        ("unix://:s3cret@/run/redis.sock?db=1", "unix://:***@/run/redis.sock?db=1"),
        ("redis://cache/0?db=1&password=s3cret", "redis://cache/0?db=1&password=***"),
        (
            "redis://cache/0?sentinel_password=s3cret&db=1",
            "redis://cache/0?sentinel_password=***&db=1",
        ),
        # Nothing to hide.
        ("redis://cache:6379/0", "redis://cache:6379/0"),
        ("unix:///run/redis@1.sock", "unix:///run/redis@1.sock"),
        ("user:s3cret@cache:6379", "user:***@cache:6379"),
    ],
)
def test_the_password_is_masked_and_the_rest_kept(url: str, shown: str) -> None:
    assert redact_url(url) == shown
    assert "s3" not in redact_url(url)


def test_a_value_that_is_not_a_string_is_shown_by_its_type() -> None:
    assert shown_value({"url": "redis://:s3cret@cache"}) == "a value of type dict"
    assert shown_value("redis://:s3cret@cache") == "'redis://:***@cache'"


def test_text_is_redacted_of_every_url_and_every_secret_given() -> None:
    text = (
        "Error connecting to 'redis://app:s3cret@cache:6379/0' (rediss://:s3%2F@c);"
        " AUTH s3cret-env failed; redis://cache:6379/0 kept"
    )
    shown = redact_text(text, ["s3cret-env"])
    assert shown == (
        "Error connecting to 'redis://app:***@cache:6379/0' (rediss://:***@c);"
        " AUTH *** failed; redis://cache:6379/0 kept"
    )
