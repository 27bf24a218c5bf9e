"""Test helpers for users and for RedFuser's own suite: tolerances, strategies, the fuzzer."""
