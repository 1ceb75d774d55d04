"""The per-minute chart: claims, finishes and takeovers drawn as SVG on the server.

The template draws what :func:`chart` computes: numbers only (coordinates, ticks), so no
stored text reaches the SVG. No script draws it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .values import MinuteCounts

WIDTH, HEIGHT = 640, 180
LEFT, RIGHT, TOP, BOTTOM = 44, 8, 10, 24
#: The series, by the field of MinuteCounts they plot, in drawing order.
SERIES = ("claims", "finishes", "takeovers")
MINUTE = 60_000


@dataclass(frozen=True, slots=True)
class Chart:
    """What the template draws: each series' polyline points, the y axis' top and ticks,
    and the x axis' minute labels (minutes before the last one)."""

    width: int
    height: int
    lines: list[tuple[str, str]]
    top: int
    yticks: list[tuple[float, int]]
    xticks: list[tuple[float, str]]
    last: dict[str, int]


def chart(minutes: Sequence[MinuteCounts], span: int = 60) -> Chart | None:
    """The chart of the last ``span`` minutes of ``minutes`` (None when there are none):
    minutes missing in between are drawn as zero."""
    if not minutes:
        return None
    by_minute = {m.minute // MINUTE: m for m in minutes}
    end = max(by_minute)
    first = end - span + 1
    rows = [by_minute.get(i) for i in range(first, end + 1)]
    top = max([1] + [getattr(r, s) for r in rows if r for s in SERIES])
    top = _nice(top)
    inner_w, inner_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(i: int) -> float:
        return round(LEFT + inner_w * i / max(1, span - 1), 1)

    def y(value: int) -> float:
        return round(TOP + inner_h * (1 - value / top), 1)

    lines = []
    for name in SERIES:
        points = " ".join(f"{x(i)},{y(getattr(r, name) if r else 0)}"
                          for i, r in enumerate(rows))
        lines.append((name, points))
    yticks = [(y(v), v) for v in (0, top // 2, top)]
    xticks = [(x(i), f"-{span - 1 - i} min" if i < span - 1 else "now")
              for i in range(0, span, 15)] + [(x(span - 1), "now")]
    last = {name: getattr(rows[-1], name) if rows[-1] else 0 for name in SERIES}
    return Chart(WIDTH, HEIGHT, lines, top, yticks, xticks, last)


def _nice(value: int) -> int:
    """The smallest of 1, 2, 5 times a power of ten at or above ``value``."""
    step = 1
    while True:
        for k in (1, 2, 5):
            if k * step >= value:
                return k * step
        step *= 10
