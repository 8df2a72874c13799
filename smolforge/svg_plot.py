"""Charts as SVG text, drawn one way for every plot smolforge writes: nice ticks, scales, axes, legends.

The report page (``smolforge.evals.report``), the ablation plots (``smolforge.ops.ablate.report``)
and the LR finder's plot (``smolforge.ops.lr_find.plot``) all draw through here. Pure Python, stdlib only
(the spine imports no ML or plotting library). A chart is one ``<svg>`` string that parses as XML
and needs no stylesheet and no script: colours and fonts are presentation attributes, so the same
chart reads alike inline in a page (whose CSS may still restyle its classes) and as a file of its own.

    >>> import xml.etree.ElementTree as ET
    >>> svg = line_chart("Loss <train>", [Series("loss", [(1, 2.0), (2, 1.5), (3, 1.2)])])
    >>> root = ET.fromstring(svg)
    >>> root.get("data-title"), len(root.findall(".//{http://www.w3.org/2000/svg}polyline"))
    ('Loss <train>', 1)
"""
from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["PALETTE", "escape", "fmt_number", "tag", "text", "nice_ticks", "padded", "thin", "Scale", "Layout",
           "Chart", "Series", "Mark", "Band", "Column", "line_chart", "bar_chart", "strip_chart"]

SVG_NS = "http://www.w3.org/2000/svg"
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")
MAX_POINTS = 600          # per series; longer curves are thinned evenly (first and last point kept)
MARKERS_UP_TO = 60        # series this short get a dot (with a tooltip) per point
LEGEND_ROW = 18           # pixels per legend row

Points = Sequence[tuple[float, float]]


# --------------------------------------------------------------------------- text and elements


def escape(value: Any) -> str:
    """``value`` as XML text or attribute value.

    >>> escape('a<b & "c"')
    'a&lt;b &amp; &quot;c&quot;'
    """
    return html.escape(str(value), quote=True)


def fmt_number(value: float) -> str:
    """Tick/label text: 3 significant digits, scientific for tiny or huge numbers.

    >>> fmt_number(0.0005), fmt_number(0.25), fmt_number(1500.0), fmt_number(0.0), fmt_number(-2.5e7)
    ('5e-04', '0.25', '1500', '0', '-2.5e+07')
    """
    if value == 0:
        return "0"
    if abs(value) < 1e-3 or abs(value) >= 1e6:
        return f"{value:.1e}".replace(".0e", "e")
    return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _attr(value: Any) -> str:
    # pixels to 2 decimals; a figure meant to be read back (data-*) is passed already formatted, as a string
    return f"{round(value, 2):g}" if isinstance(value, float) else escape(value)


def tag(name: str, *children: str, title: Any = None, **attrs: Any) -> str:
    """One element. Attribute names take ``_`` for ``-`` (``class_`` for ``class``); None drops one;
    values are escaped, floats rounded to 2 decimals. ``children`` are markup (escape text yourself,
    or use :func:`text`); ``title`` adds a tooltip.

    >>> tag("line", x1=1.234, x2=5, class_="mark", stroke_width=1.5, fill=None, title="a < b")
    '<line x1="1.23" x2="5" class="mark" stroke-width="1.5"><title>a &lt; b</title></line>'
    """
    names = "".join(f' {k.rstrip("_").replace("_", "-")}="{_attr(v)}"' for k, v in attrs.items() if v is not None)
    inner = (f"<title>{escape(title)}</title>" if title is not None else "") + "".join(children)
    return f"<{name}{names}>{inner}</{name}>" if inner else f"<{name}{names}/>"


def text(x: float, y: float, value: Any, *, size: int = 10, fill: str = "#555", anchor: str = "middle",
         **attrs: Any) -> str:
    """A ``<text>`` element holding ``value``, escaped.

    >>> text(10, 20, "p < 0.05", class_="note")
    '<text x="10" y="20" text-anchor="middle" font-size="10" fill="#555" class="note">p &lt; 0.05</text>'
    """
    return tag("text", escape(value), x=x, y=y, text_anchor=anchor, font_size=size, fill=fill, **attrs)


# --------------------------------------------------------------------------- ticks and scales


def _nice_step(raw: float, whole: bool = False) -> float:
    """The smallest 1, 2, 2.5 or 5 times a power of ten that is at least ``raw``; ``whole``: a whole number."""
    if whole and raw <= 1:
        return 1.0
    mag = 10.0 ** math.floor(math.log10(raw))
    multiples = (1, 2, 5, 10) if whole else (1, 2, 2.5, 5, 10)
    return next(m * mag for m in multiples if m * mag >= raw * (1 - 1e-9))


def _linear_ticks(lo: float, hi: float, n: int, whole: bool = False) -> list[float]:
    lo, hi = min(lo, hi), max(lo, hi)
    if hi == lo:
        return [float(lo)]
    step = _nice_step((hi - lo) / max(n, 1), whole)
    first = math.ceil(lo / step - 1e-9)
    ticks = []
    for i in range(first, first + 2 * max(n, 1) + 3):
        t = float(f"{i * step:.12g}")  # 0.3, not 0.30000000000000004
        if t > hi + step * 1e-9:
            break
        ticks.append(t)
    return ticks


def nice_ticks(lo: float, hi: float, n: int = 5, log: bool = False) -> list[float]:
    """About ``n`` round values covering [lo, hi], 1, 2, 2.5 or 5 times a power of ten apart.
    On a log scale the same rule picks whole decades: powers of ten, every one or every k-th.
    A single value is its own tick.

    >>> nice_ticks(0, 1), nice_ticks(0.2, 0.9, 3), nice_ticks(-3, 2)
    ([0.0, 0.2, 0.4, 0.6, 0.8, 1.0], [0.25, 0.5, 0.75], [-3.0, -2.0, -1.0, 0.0, 1.0, 2.0])
    >>> nice_ticks(1e-6, 1.0, 6, log=True), nice_ticks(4.0, 4.0)
    ([1e-06, 1e-05, 0.0001, 0.001, 0.01, 0.1, 1.0], [4.0])
    """
    if not log:
        return _linear_ticks(lo, hi, n)
    if lo <= 0 or hi <= 0:
        raise ValueError(f"a log scale needs positive bounds, got {lo} and {hi}")
    return [float(f"{10.0 ** e:.12g}") for e in _linear_ticks(math.log10(lo), math.log10(hi), n, whole=True)]


def padded(lo: float, hi: float, frac: float = 0.05, minimum: float = 0.0) -> tuple[float, float]:
    """[lo, hi] widened each side by ``frac`` of its span (at least ``minimum``); a single value by a
    tenth of itself (or by 1 around zero).

    >>> padded(0.0, 10.0), padded(2.0, 2.0), padded(0.0, 0.0), padded(1.0, 2.0, 0.0, minimum=0.5)
    ((-0.5, 10.5), (1.8, 2.2), (-1.0, 1.0), (0.5, 2.5))
    """
    span = hi - lo
    pad = max(span * frac if span > 0 else abs(lo) * 0.1 or 1.0, minimum)
    return lo - pad, hi + pad


def thin(points: Points, limit: int = MAX_POINTS) -> list[tuple[float, float]]:
    """At most ``limit`` points, evenly spaced along the series, the first and last kept.

    >>> thin([(i, i) for i in range(10)], 4)
    [(0, 0), (3, 3), (6, 6), (9, 9)]
    """
    if len(points) <= limit:
        return list(points)
    stride = (len(points) - 1) / (limit - 1)
    return [points[round(i * stride)] for i in range(limit)]


@dataclass(frozen=True)
class Scale:
    """Data to pixels along one axis: [lo, hi] onto [start, end] (a y axis runs upwards: start below end),
    linear or log10; ``clamp`` pins values outside [lo, hi] to its edges.

    >>> Scale(0, 10, 100, 200)(2.5), Scale(1e-3, 1e-1, 0, 100, log=True)(1e-2), Scale(0, 1, 300, 100, clamp=True)(2)
    (125.0, 50.0, 100.0)
    """

    lo: float
    hi: float
    start: float
    end: float
    log: bool = False
    clamp: bool = False

    def _t(self, value: float) -> float:
        return math.log10(value) if self.log else float(value)

    def __call__(self, value: float) -> float:
        lo, hi, v = self._t(self.lo), self._t(self.hi), self._t(value)
        if self.clamp:
            v = min(max(v, lo), hi)
        return self.start + (v - lo) / (hi - lo) * (self.end - self.start)

    def ticks(self, n: int = 5) -> list[float]:
        return nice_ticks(self.lo, self.hi, n, log=self.log)


# --------------------------------------------------------------------------- the chart being drawn


@dataclass(frozen=True)
class Layout:
    """A chart's size (pixels): the plot area is ``width`` x ``height`` less the margins; the legend, if
    any, goes below ``height`` and makes the SVG taller."""

    width: int = 560
    height: int = 300
    left: int = 64
    right: int = 16
    top: int = 28
    bottom: int = 40
    kind: str = "line-plot"            # the svg's CSS class beside "plot"
    standalone: bool = False           # a file of its own: white background, its own font
    legend_col: int = 170              # pixels per legend entry along a row
    legend_chars: int | None = 24      # legend labels cut to this length (None: never cut)


class Chart:
    """One SVG being drawn: its :class:`Layout`, its parts in drawing order and its legend entries.

    >>> chart = Chart("t", Layout(width=200, height=150, left=50, right=50, top=25, bottom=25))
    >>> (chart.x_min, chart.x_max, chart.y_top, chart.y_bottom), chart.y_scale(0, 10)(10)
    ((50, 150, 25, 125), 25.0)
    """

    def __init__(self, title: str, layout: Layout = Layout()) -> None:
        self.title, self.layout = title, layout
        self.parts: list[str] = []
        self.legend: list[tuple[str, str]] = []       # (label, colour)
        self.x_min, self.x_max = layout.left, layout.width - layout.right
        self.y_top, self.y_bottom = layout.top, layout.height - layout.bottom

    def x_scale(self, lo: float, hi: float, log: bool = False) -> Scale:
        return Scale(lo, hi, self.x_min, self.x_max, log=log)

    def y_scale(self, lo: float, hi: float, clamp: bool = False) -> Scale:
        return Scale(lo, hi, self.y_bottom, self.y_top, clamp=clamp)

    def add(self, *parts: str) -> None:
        self.parts.extend(parts)

    def frame(self) -> None:
        self.add(tag("rect", x=self.x_min, y=self.y_top, width=self.x_max - self.x_min,
                     height=self.y_bottom - self.y_top, class_="frame", fill="none", stroke="#bbb"))

    def y_grid(self, scale: Scale, n: int = 5, fmt: Callable[[float], str] = fmt_number) -> None:
        """A horizontal grid line and a label at each tick."""
        for t in scale.ticks(n):
            y = scale(t)
            self.add(tag("line", x1=self.x_min, x2=self.x_max, y1=y, y2=y, class_="grid", stroke="#eee"),
                     text(self.x_min - 6, y + 4, fmt(t), anchor="end", class_="tick"))

    def x_ticks(self, scale: Scale, n: int = 6, fmt: Callable[[float], str] = fmt_number, grid: bool = False) -> None:
        """A label under each tick, with a short tick mark or (``grid``) a vertical grid line."""
        for t in scale.ticks(n):
            x = scale(t)
            if grid:
                self.add(tag("line", x1=x, x2=x, y1=self.y_top, y2=self.y_bottom, class_="grid", stroke="#eee"))
            else:
                self.add(tag("line", x1=x, x2=x, y1=self.y_bottom, y2=self.y_bottom + 4, class_="axis",
                             stroke="#999"))
            self.add(text(x, self.y_bottom + 16, fmt(t), class_="tick"))

    def axis_labels(self, xlabel: str | None = None, ylabel: str | None = None) -> None:
        middle = (self.y_top + self.y_bottom) / 2
        if xlabel:
            self.add(text((self.x_min + self.x_max) / 2, self.y_bottom + 33, xlabel, size=11, fill="#333",
                          class_="label"))
        if ylabel:
            self.add(text(14, middle, ylabel, size=11, fill="#333", class_="label",
                          transform=f"rotate(-90 14 {middle:g})"))

    def _legend(self, per_row: int) -> list[str]:
        out = []
        for i, (label, color) in enumerate(self.legend):
            row, col = divmod(i, per_row)
            x, y = self.layout.left + col * self.layout.legend_col, self.layout.height + row * LEGEND_ROW
            shown = label if self.layout.legend_chars is None else label[:self.layout.legend_chars]
            out.append(tag("rect", x=x, y=y, width=12, height=12, fill=color)
                       + text(x + 16, y + 10, shown, size=11, fill="#333", anchor="start", class_="legend"))
        return out

    def svg(self) -> str:
        """The whole ``<svg>`` element: title, parts, legend."""
        lay = self.layout
        per_row = max(1, (lay.width - lay.left) // lay.legend_col)
        rows = math.ceil(len(self.legend) / per_row)
        height = lay.height + (rows * LEGEND_ROW + 4 if rows else 0)
        background = [tag("rect", width=lay.width, height=height, fill="#fff")] if lay.standalone else []
        heading = text(lay.width / 2, 18, self.title, size=13, fill="#222", font_weight=600, class_="ptitle")
        return tag("svg", *background, heading, *self.parts, *self._legend(per_row), title=self.title,
                   class_=f"plot {lay.kind}", data_title=self.title, xmlns=SVG_NS,
                   viewBox=f"0 0 {lay.width} {height}", width=lay.width, height=height, role="img",
                   font_family="sans-serif" if lay.standalone else None)


# --------------------------------------------------------------------------- line chart


@dataclass(frozen=True)
class Series:
    """One line: ``points`` are (x, y); ``color`` None takes the palette's next; ``markers`` None puts a
    dot per point on short series only."""

    name: str
    points: Points
    color: str | None = None
    width: float = 1.8
    markers: bool | None = None


@dataclass(frozen=True)
class Mark:
    """A dashed vertical line at ``x``, named in the legend."""

    label: str
    x: float
    color: str


@dataclass(frozen=True)
class Band:
    """A shaded span of x from ``lo`` to ``hi``, named in the legend."""

    label: str
    lo: float
    hi: float
    color: str = "#b7e4c7"


def _real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _x_extent(series: Sequence[Series], log: bool) -> tuple[float, float]:
    xs = [x for s in series for x, _ in s.points] or [1.0, 10.0]
    lo, hi = min(xs), max(xs)
    if hi == lo:
        return (lo, lo * 10) if log else (lo - 1, hi + 1)
    return lo, hi


def _draw_series(chart: Chart, series: Series, color: str, xs: Scale, ys: Scale, fmt: Callable[[float], str]) -> None:
    points = thin(series.points)
    parts = []
    if len(points) > 1:
        coords = " ".join(f"{_attr(xs(x))},{_attr(ys(y))}" for x, y in points)
        parts.append(tag("polyline", points=coords, fill="none", stroke=color, stroke_width=series.width))
    if len(points) <= MARKERS_UP_TO if series.markers is None else series.markers:
        parts += [tag("circle", cx=xs(x), cy=ys(y), r=2.8, fill=color, title=f"{series.name} @ {fmt(x)}: {y:.4g}")
                  for x, y in points]
    chart.add(tag("g", *parts, title=series.name, class_="series", data_series=series.name))
    chart.legend.append((series.name, color))


def _draw_band(chart: Chart, band: Band, xs: Scale, fmt: Callable[[float], str]) -> None:
    lo, hi = xs(max(band.lo, xs.lo)), xs(min(band.hi, xs.hi))
    if hi > lo:
        chart.add(tag("rect", class_="band", x=lo, y=chart.y_top, width=hi - lo, height=chart.y_bottom - chart.y_top,
                      fill=band.color, fill_opacity=0.6, title=f"{band.label}: {fmt(band.lo)} - {fmt(band.hi)}"))


def _draw_mark(chart: Chart, mark: Mark, xs: Scale) -> None:
    if xs.lo <= mark.x <= xs.hi:
        x = xs(mark.x)
        chart.add(tag("line", class_="mark", x1=x, x2=x, y1=chart.y_top, y2=chart.y_bottom, stroke=mark.color,
                      stroke_width=1.6, stroke_dasharray="5 3", title=mark.label))
    chart.legend.append((mark.label, mark.color))


def line_chart(title: str, series: Sequence[Series], *, xlabel: str = "step", ylabel: str | None = None,
               log_x: bool = False, x_range: tuple[float, float] | None = None,
               y_range: tuple[float, float] | None = None, marks: Sequence[Mark] = (), band: Band | None = None,
               x_format: Callable[[float], str] = fmt_number, layout: Layout = Layout()) -> str:
    """Lines (one per series, thinned to 600 points; dots on short ones), optional vertical ``marks``
    and a shaded ``band``, a legend below. Points that are not finite numbers are left out.

    The axes span the data (y padded by 5%) unless ``x_range`` / ``y_range`` say otherwise; a
    ``y_range`` clips what lies outside it. ``log_x``: a log10 x axis with decade ticks.

    >>> svg = line_chart("LR", [Series("loss", [(1e-3, 2.0), (1e-2, 1.0), (1e-1, 3.0)])], log_x=True,
    ...                  marks=[Mark("suggested", 1e-3, "#2a9d8f")], band=Band("window", 1e-3, 1e-2))
    >>> svg.count('class="series"'), svg.count('class="mark"'), svg.count('class="band"'), svg.count("<circle")
    (1, 1, 1, 3)
    """
    cleaned = (replace(s, points=[(x, y) for x, y in s.points if _real(x) and _real(y) and (x > 0 or not log_x)])
               for s in series)
    series = [s for s in cleaned if s.points]
    chart = Chart(title, layout)
    xs = chart.x_scale(*(x_range or _x_extent(series, log_x)), log=log_x)
    ys_data = [y for s in series for _, y in s.points] or [0.0, 1.0]
    ys = chart.y_scale(*(y_range or padded(min(ys_data), max(ys_data))), clamp=y_range is not None)
    if band:
        _draw_band(chart, band, xs, x_format)
    chart.y_grid(ys)
    chart.x_ticks(xs, fmt=x_format, grid=log_x)
    chart.frame()
    chart.axis_labels(xlabel, ylabel)
    for i, s in enumerate(series):
        _draw_series(chart, s, s.color or PALETTE[i % len(PALETTE)], xs, ys, x_format)
    for mark in marks:
        _draw_mark(chart, mark, xs)
    if band:
        chart.legend.append((band.label, band.color))
    return chart.svg()


# --------------------------------------------------------------------------- grouped bar chart


def _bar_domain(bars: Sequence[tuple[str, Sequence[dict | None]]]) -> tuple[float, float]:
    scores = [s for _, row in bars for s in row if s]
    values = [0.0] + [s["value"] for s in scores] + [s["random"] for s in scores if s.get("random") is not None]
    lo, hi = min(values), max(values)
    if lo >= 0 and hi <= 1.0:
        return 0.0, 1.0  # scores: the axis is [0, 1] and error bars are clipped to it
    tops = [s["value"] + (s.get("stderr") or 0) for s in scores]
    hi, lo = max([hi, *tops]) * 1.08 if hi > 0 else 0.0, lo * 1.08 if lo < 0 else 0.0
    return (lo, hi) if hi > lo else (lo, lo + 1.0)


def _error_bar(cx: float, y_hi: float, y_lo: float, stderr: float) -> str:
    def line(x1: float, x2: float, y1: float, y2: float) -> str:
        return tag("line", x1=x1, x2=x2, y1=y1, y2=y2)

    return tag("g", line(cx, cx, y_hi, y_lo), line(cx - 4, cx + 4, y_hi, y_hi), line(cx - 4, cx + 4, y_lo, y_lo),
               class_="errbar", data_stderr=f"{stderr:.6g}", stroke="#222", stroke_width=1.2)


def _draw_bar(chart: Chart, ys: Scale, x: float, width: float, color: str, name: str, group: str,
              score: dict) -> None:
    v, err = score["value"], score.get("stderr")
    y_top, y_base = ys(max(v, 0.0)), ys(min(v, 0.0))
    tip = f"{name} {group}: {v:.3f}" + (f" ± {err:.3f}" if err is not None else "")
    chart.add(tag("rect", class_="bar", x=x + 1, y=y_top, width=max(width - 2, 1), height=max(y_base - y_top, 0.5),
                  fill=color, data_series=name, data_group=group, data_value=f"{v:.6g}", title=tip))
    cx = x + width / 2
    if err is not None and err > 0:
        chart.add(_error_bar(cx, ys(v + err), ys(v - err), err))
    chart.add(text(cx, min(y_top, ys(v + (err or 0))) - 4, f"{v:.2f}", fill="#333", class_="value"))


def _draw_group(chart: Chart, ys: Scale, x: float, bar_w: float, group: str,
                scores: Sequence[tuple[str, dict | None]]) -> None:
    baseline = None
    for b, (name, score) in enumerate(scores):
        if score:
            _draw_bar(chart, ys, x + b * bar_w, bar_w, PALETTE[b % len(PALETTE)], name, group, score)
            baseline = score["random"] if score.get("random") is not None else baseline
    if baseline is not None:
        y = ys(baseline)
        chart.add(tag("line", class_="baseline", data_random=f"{baseline:.6g}", x1=x - 4,
                      x2=x + bar_w * len(scores) + 4, y1=y, y2=y, stroke="#444", stroke_width=1.5,
                      stroke_dasharray="5 3", title=f"random baseline {baseline:.3f}"))


def bar_chart(title: str, groups: Sequence[str], bars: Sequence[tuple[str, Sequence[dict | None]]],
              width: int = 760, height: int = 320) -> str:
    """Grouped bars with ±1 stderr error bars and a dashed random baseline per group.

    ``groups`` are the categories (tasks); ``bars`` is ``[(series name, [score per group])]`` where a
    score is ``{"value", "stderr", "random"}`` (the last two optional) or None.

    >>> svg = bar_chart("Scores", ["facts/acc"], [("sft", [{"value": 0.5, "stderr": 0.1, "random": 0.125}])])
    >>> svg.count('class="bar"'), svg.count('class="errbar"'), svg.count('class="baseline"')
    (1, 1, 1)
    """
    chart = Chart(title, Layout(width=width, height=height, left=56, bottom=56, kind="bar-plot"))
    ys = chart.y_scale(*_bar_domain(bars), clamp=True)
    chart.y_grid(ys)
    chart.frame()
    group_w = (chart.x_max - chart.x_min) / max(len(groups), 1)
    bar_w = min(48.0, group_w * 0.8 / max(len(bars), 1))
    for g, group in enumerate(groups):
        chart.add(text(chart.x_min + (g + 0.5) * group_w, chart.y_bottom + 16, group, size=11, fill="#333",
                       class_="label"))
        scores = [(name, row[g] if g < len(row) else None) for name, row in bars]
        _draw_group(chart, ys, chart.x_min + g * group_w + (group_w - bar_w * max(len(bars), 1)) / 2, bar_w, group,
                    scores)
    chart.add(text(chart.x_min, chart.y_bottom + 36, "bars: score ± 1 stderr; dashed: random baseline",
                   anchor="start", fill="#777", font_style="italic", class_="note"))
    if len(bars) > 1:
        chart.legend += [(name, PALETTE[i % len(PALETTE)]) for i, (name, _) in enumerate(bars)]
    return chart.svg()


# --------------------------------------------------------------------------- strip chart (repeated measurements)


@dataclass(frozen=True)
class Column:
    """One category of a strip chart: its measurements (one per seed), their mean and spread (either
    None to leave it out) and a note shown under the label."""

    label: str
    values: Sequence[float]
    mean: float | None = None
    sd: float | None = None
    note: str = ""


def _draw_column(chart: Chart, ys: Scale, cx: float, column: Column, color: str) -> None:
    m, sd = column.mean, column.sd
    if m is not None and sd is not None:
        chart.add(tag("line", class_="spread", x1=cx, x2=cx, y1=ys(m - sd), y2=ys(m + sd), stroke=color,
                      stroke_width=2))
    if m is not None:
        tip = f"{column.label}: mean {m:.4f}" + (f" ± {sd:.4f}" if sd is not None else "")
        chart.add(tag("line", class_="mean", x1=cx - 22, x2=cx + 22, y1=ys(m), y2=ys(m), stroke=color, stroke_width=3,
                      title=tip))
    for j, value in enumerate(column.values):
        x = cx - 12 + 24 * j / max(len(column.values) - 1, 1)
        chart.add(tag("circle", class_="seed", cx=x, cy=ys(value), r=4, fill=color, fill_opacity=0.6,
                      title=f"{column.label} seed #{j}: {value:.4f}"))
    chart.add(text(cx, chart.y_bottom + 18, column.label, size=11, fill="#222"))
    if column.note:
        chart.add(text(cx, chart.y_bottom + 34, column.note, size=11, fill=color, font_weight=600))


def strip_chart(title: str, columns: Sequence[Column], layout: Layout = Layout(kind="strip-plot")) -> str:
    """Side by side, per column: a dot per measurement (``class="seed"``), the mean as a bar
    (``class="mean"``) and ± one sd as a line (``class="spread"``), the label and note below.

    >>> svg = strip_chart("acc", [Column("base", [0.5, 0.52], 0.51, 0.014), Column("lr", [0.4], 0.4, None, "worse")])
    >>> svg.count('class="seed"'), svg.count('class="mean"'), svg.count('class="spread"'), "worse" in svg
    (3, 2, 1, True)
    """
    values = [v for column in columns for v in column.values] or [0.0]
    chart = Chart(title, layout)
    ys = chart.y_scale(*padded(min(values), max(values), 0.15, minimum=0.01))
    chart.y_grid(ys)
    chart.frame()
    slot = (chart.x_max - chart.x_min) / max(len(columns), 1)
    for i, column in enumerate(columns):
        _draw_column(chart, ys, chart.x_min + slot * (i + 0.5), column, PALETTE[i % len(PALETTE)])
    return chart.svg()
