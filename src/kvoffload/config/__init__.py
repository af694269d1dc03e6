"""Configuration parsed once at the edge: the shape of config mappings, sizes,
seconds and per-request parameters, every error of a config at once, and config
files and `${NAME}` references to the environment."""

from kvoffload.config.errors import ConfigError, ErrorList, messages_of
from kvoffload.config.request_params import ALL_TIERS, RequestParams, TierSelector
from kvoffload.config.seconds import finite_seconds
from kvoffload.config.shapes import MAX_INT, config_mapping, is_count, kind, shown
from kvoffload.config.sizes import parse_size

__all__ = [
    "ALL_TIERS",
    "MAX_INT",
    "ConfigError",
    "ErrorList",
    "RequestParams",
    "TierSelector",
    "config_mapping",
    "finite_seconds",
    "is_count",
    "kind",
    "messages_of",
    "parse_size",
    "shown",
]
