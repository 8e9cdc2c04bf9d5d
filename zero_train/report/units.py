"""How numbers read in the report: MB (1e6 bytes, like `zero-train estimate`), bytes/param, ratios."""

from __future__ import annotations

MB = 1e6


def mb(value: float | None) -> str:
    """Bytes as MB with 3 significant digits below 100 (e.g. 0.016 MB, 2.56 MB, 40.3 MB, 1,234 MB)."""
    if value is None:
        return "n/a"
    scaled = value / MB
    if abs(scaled) >= 100:
        return f"{scaled:,.0f} MB"
    if abs(scaled) >= 10:
        return f"{scaled:.1f} MB"
    if abs(scaled) >= 0.1 or scaled == 0:
        return f"{scaled:.2f} MB"
    if abs(scaled) < 0.001:
        return f"{value:,.0f} bytes"
    return f"{scaled:.3f} MB"


def ranks(world_size: int) -> str:
    """`1 rank`, `2 ranks`."""
    return f"{world_size} rank{'' if world_size == 1 else 's'}"


def per_param(value: float | None, num_params: int) -> str:
    """Bytes per parameter with two decimals (n/a when unknown)."""
    return "n/a" if value is None else f"{value / num_params:.2f}"


def ratio_text(value: float | None) -> str:
    """A ratio with two decimals (n/a when unknown)."""
    return "n/a" if value is None else f"{value:.2f}"


def percent(value: float | None) -> str:
    """A fraction as a whole percentage."""
    return "n/a" if value is None else f"{100 * value:.0f}%"
