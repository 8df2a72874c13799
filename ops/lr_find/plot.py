"""The LR range test's plot: loss and smoothed loss against the LR on a log axis (:mod:`smolforge.svg_plot`)."""
from __future__ import annotations

import math
from collections.abc import Sequence

from smolforge.svg_plot import Band, Layout, Mark, Series, line_chart, padded

from .arithmetic import fmt_lr

__all__ = ["svg_plot"]

LAYOUT = Layout(width=640, height=340, left=60, right=20, top=30, bottom=44, kind="lr-find", standalone=True,
                legend_col=190, legend_chars=None)
LOSS_COLOR, SMOOTHED_COLOR = "#9db4d0", "#1d3557"


def svg_plot(lrs: Sequence[float], losses: Sequence[float], smoothed: Sequence[float],
             marks: Sequence[tuple[str, float, str]] = (), band: tuple[str, float, float] | None = None,
             title: str = "LR range test") -> str:
    """A standalone SVG: loss and smoothed loss against the LR (log axis), vertical lines at ``marks``
    (label, LR, colour) and a shaded ``band`` (label, low LR, high LR).

    >>> svg = svg_plot([1e-3, 1e-2, 1e-1], [3.0, 2.0, 9.0], [2.5, 4.7, 5.5], marks=[("suggested", 1e-3, "#2a9d8f")])
    >>> svg.startswith("<svg") and svg.count('class="series"') == 2 and svg.count('class="mark"') == 1
    True
    """
    raw = [(lr, loss) for lr, loss in zip(lrs, losses) if math.isfinite(loss)]
    ys = [y for _, y in raw] or [0.0, 1.0]
    top = max(smoothed) if smoothed else max(ys)  # a blow-up past the smoothed curve is clipped at the top
    series = [Series("loss", raw, LOSS_COLOR, width=1.2, markers=False),
              Series("smoothed", list(zip(lrs, smoothed)), SMOOTHED_COLOR, width=2.2, markers=False)]
    return line_chart(title, series, xlabel="learning rate (log scale)", ylabel="loss", log_x=True,
                      x_range=(lrs[0], lrs[-1] if len(lrs) > 1 else lrs[0] * 10),
                      y_range=padded(min(ys), max(top, min(ys) + 1e-6), 0.06),
                      marks=[Mark(*mark) for mark in marks], band=Band(*band) if band else None,
                      x_format=fmt_lr, layout=LAYOUT)
