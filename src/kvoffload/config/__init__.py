"""Configuration parsed once at the edge: the shape of config mappings, sizes,
seconds and per-request parameters."""

from kvoffload.config.request_params import ALL_TIERS, RequestParams, TierSelector
from kvoffload.config.seconds import finite_seconds
from kvoffload.config.shapes import MAX_INT, config_mapping, is_count, kind, shown
from kvoffload.config.sizes import parse_size

__all__ = [
    "ALL_TIERS",
    "MAX_INT",
    "RequestParams",
    "TierSelector",
    "config_mapping",
    "finite_seconds",
    "is_count",
    "kind",
    "parse_size",
    "shown",
]
