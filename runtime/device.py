"""Which CUDA devices this machine has, and what they are (used by ``backend="auto"``).

Never raises for lack of a driver: `device_available` and `why_no_device`
answer cleanly ("no CUDA driver found", "no CUDA device"); `device_info`
raises `BackendError` with that reason.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import cuda_driver
from .cuda_driver import call, require_driver

DEFAULT_SM = "sm_90"  # the target compiled for when no device says otherwise


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One device's properties that code generation and launching care about."""

    index: int
    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    max_threads_per_block: int
    max_shared_per_block: int          # without opt-in (48 KiB)
    max_shared_per_block_optin: int    # with CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES raised
    warp_size: int
    total_memory: int
    driver_version: int                # e.g. 12040 for CUDA 12.4

    @property
    def sm(self) -> str:
        """The PTX target of this device: ``sm_86`` for compute capability 8.6; ``sm_90a`` for 9.0 (Hopper:
        the architecture-specific target, whose ``wgmma`` puts the tensor-core dots on the warpgroup tensor
        cores; measured on an H200 against the same kernels on ``sm_90``'s ``mma.sync``: attention 1.07-1.8x,
        FP8 GEMM 1.24x, f16 GEMM 3.1x faster, benchmarks/device_notes.md run 10). Code for ``sm_90a`` runs on
        compute capability 9.0 only, which is the device it is compiled for."""
        major, minor = self.compute_capability
        return "sm_90a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"

    def __str__(self) -> str:
        major, minor = self.compute_capability
        return (f"{self.name} (device {self.index}, compute capability {major}.{minor}, {self.sm_count} SMs, "
                f"{self.total_memory / 2**30:.0f} GiB, {self.max_shared_per_block_optin // 1024} KiB shared/block)")


def why_no_device() -> str:
    """Why CUDA cannot be used here (``"no CUDA driver found"``, ``"no CUDA device"``...); ``""`` if it can."""
    return cuda_driver.unavailable_reason() or ""


def device_available() -> bool:
    """True when a CUDA driver and at least one device are present."""
    return cuda_driver.unavailable_reason() is None


def device_count() -> int:
    """Number of CUDA devices (0 without a driver)."""
    return int(call("cuDeviceGetCount")) if device_available() else 0


def device_info(index: int = 0) -> DeviceInfo:
    """Properties of device `index`; `BackendError` saying why when there is none."""
    require_driver()
    device = call("cuDeviceGet", index)
    attr = cuda_driver.driver.CUdevice_attribute

    def get(name: str) -> int:
        return int(call("cuDeviceGetAttribute", getattr(attr, f"CU_DEVICE_ATTRIBUTE_{name}"), device))

    raw_name = call("cuDeviceGetName", 256, device)
    name = raw_name.split(b"\0", 1)[0].decode(errors="replace") if isinstance(raw_name, bytes) else str(raw_name)
    return DeviceInfo(
        index=index,
        name=name.strip(),
        compute_capability=(get("COMPUTE_CAPABILITY_MAJOR"), get("COMPUTE_CAPABILITY_MINOR")),
        sm_count=get("MULTIPROCESSOR_COUNT"),
        max_threads_per_block=get("MAX_THREADS_PER_BLOCK"),
        max_shared_per_block=get("MAX_SHARED_MEMORY_PER_BLOCK"),
        max_shared_per_block_optin=get("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"),
        warp_size=get("WARP_SIZE"),
        total_memory=int(call("cuDeviceTotalMem", device)),
        driver_version=int(call("cuDriverGetVersion")),
    )


def target_sm(index: int = 0) -> str:
    """The ``sm_XX`` to compile for: device `index`'s when present, else `DEFAULT_SM`."""
    return device_info(index).sm if device_available() else DEFAULT_SM
