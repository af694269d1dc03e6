"""Page-locking existing host memory (the host pool) for asynchronous CUDA copies.

A pool shared between processes is an `mmap`, not memory from torch's pinned
allocator, so it is registered after the fact with `cudaHostRegister`. Pinning
only speeds copies up: when it fails, copies still work, synchronously.
"""

from __future__ import annotations

import ctypes
import logging

import torch

logger = logging.getLogger(__name__)

_PORTABLE = 1  # cudaHostRegisterPortable: pinned for every CUDA context
_CUDART_NAMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so")


def host_register(ptr: int, nbytes: int) -> bool:
    """Page-lock `nbytes` at `ptr`; `False` (with a warning) if CUDA refuses."""
    cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
    result = int(cudart.cudaHostRegister(ptr, nbytes, _PORTABLE))
    if result == 0:
        return True
    _clear_last_error()
    logger.warning(
        "cudaHostRegister of %s bytes of host pool failed (cudaError %s); copies "
        "will be synchronous and slower",
        nbytes,
        result,
    )
    return False


def host_unregister(ptr: int) -> None:
    """Undo `host_register`; a failure is logged, not raised."""
    cudart = torch.cuda.cudart()  # type: ignore[no-untyped-call]
    result = int(cudart.cudaHostUnregister(ptr))
    if result != 0:
        _clear_last_error()
        logger.warning(
            "cudaHostUnregister of the host pool failed (cudaError %s)", result
        )


def _clear_last_error() -> None:
    # torch checks cudaGetLastError after its kernel launches; a failed
    # registration left there would surface as an unrelated launch failure.
    for name in _CUDART_NAMES:
        try:
            ctypes.CDLL(name).cudaGetLastError()
            return
        except (OSError, AttributeError):
            continue
    logger.warning("could not load the CUDA runtime to clear a registration error")
