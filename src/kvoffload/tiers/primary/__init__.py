"""The primary tier: host memory, the only tier that exchanges data with the device."""

from kvoffload.tiers.primary.manager import CPUOffloadingManager
from kvoffload.tiers.primary.reuse_filter import ReuseFilter

__all__ = ["CPUOffloadingManager", "ReuseFilter"]
