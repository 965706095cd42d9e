"""Diagnostics that observe training without changing any gradient."""

from .webagent_headroom import HeadroomProbe, measure_headroom

__all__ = ["HeadroomProbe", "measure_headroom"]
