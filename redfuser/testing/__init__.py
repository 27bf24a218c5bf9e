"""Test helpers for users and for RedFuser's own suite: tolerances, strategies, the fuzzer."""
from .tolerance import assert_close, tolerance

__all__ = ["assert_close", "tolerance"]
