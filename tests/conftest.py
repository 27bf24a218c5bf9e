"""Suite-wide set-up: hypothesis profiles and the ``gpu`` marker.

Hypothesis profiles (pick one with ``HYPOTHESIS_PROFILE``, read by
`redfuser.config.hypothesis_profile`):

- ``ci`` (default): 25 examples per property, no deadline — the quick run of
  every push (the interpreter's first call of a shape can be slow, so a
  per-example deadline would only make the suite flaky);
- ``fuzz``: 2500 examples per property — a long hunt, run by hand:
  ``HYPOTHESIS_PROFILE=fuzz python -m pytest -q tests/test_interpreter_props.py``.

Tests marked ``@pytest.mark.gpu`` need a CUDA device. The test list is the same
on every machine: without a device they are reported as skipped, with the
reason, never silently dropped.
"""
from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, settings

from helpers import DEFAULT_CHANGING
from redfuser import config as redfuser_config

@pytest.fixture(autouse=True, scope="session")
def _isolated_compile_cache(tmp_path_factory):
    """The suite compiles into a cache folder of its own, never the user's ~/.cache/redfuser, and runs with
    RedFuser's defaults: the variables of `redfuser.config` that change them for a user's own runs
    (`helpers.DEFAULT_CHANGING`) are cleared. A ``REDFUSER_CACHE=0`` or ``REDFUSER_AUTOTUNE=1`` left in the caller's
    environment failed the tests of the cache; tests that want another setting set it themselves."""
    mp = pytest.MonkeyPatch()
    mp.setenv("REDFUSER_CACHE_DIR", str(tmp_path_factory.mktemp("redfuser-cache")))
    for name in DEFAULT_CHANGING:
        mp.delenv(name, raising=False)
    yield
    mp.undo()


settings.register_profile(
    "ci",
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "fuzz",
    max_examples=2500,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
PROFILES = ("ci", "fuzz")


def pytest_configure(config: pytest.Config) -> None:
    """Load the hypothesis profile ``HYPOTHESIS_PROFILE`` names; another name is a usage error naming the
    variable and the profiles (hypothesis's own said only ``Profile 'long' is not registered``, in a
    traceback from this file)."""
    profile = redfuser_config.hypothesis_profile()
    if profile not in PROFILES:
        raise pytest.UsageError(f"HYPOTHESIS_PROFILE={profile!r} is not a profile of this suite: use one of "
                                f"{', '.join(PROFILES)} (tests/conftest.py; the fuzz command's --profile is another "
                                "setting)")
    settings.load_profile(profile)


@functools.cache
def cuda_device_count() -> tuple[int, str]:
    """``(number of CUDA devices, why none)``; never raises, also without a driver installed."""
    try:
        from cuda.bindings import driver
    except Exception as exc:  # cuda-python missing or broken: no device usable
        return 0, f"cuda-python is not importable ({type(exc).__name__})"
    try:
        result = driver.cuInit(0)
        err = result[0] if isinstance(result, tuple) else result
        if err != driver.CUresult.CUDA_SUCCESS:
            return 0, f"cuInit failed ({err.name})"
        err, count = driver.cuDeviceGetCount()
        if err != driver.CUresult.CUDA_SUCCESS:
            return 0, f"cuDeviceGetCount failed ({err.name})"
    except Exception as exc:  # no driver library at all (the usual case on CI machines)
        return 0, f"no CUDA driver ({type(exc).__name__})"
    return int(count), "" if count else "the CUDA driver reports no device"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``gpu``-marked tests, with the reason, when this machine has no CUDA device."""
    if not any(item.get_closest_marker("gpu") for item in items):
        return  # do not touch the driver when nothing needs it
    count, why = cuda_device_count()
    if count:
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA device: {why}")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)
