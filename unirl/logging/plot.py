"""Line charts drawn with Pillow: axes with round ticks, tick labels, axis labels, a title,
a legend, shaded bands and gaps where a value is missing.

Pillow is already a dependency; matplotlib would add ~40 MB (and its font cache on first
use) for four line charts, so this file draws them itself. ``line_chart`` returns a PIL image;
``stack`` puts several charts one under another.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from PIL import Image, ImageDraw, ImageFont

# a palette readable by most colour-blind viewers (Okabe–Ito)
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")


@dataclass(kw_only=True)
class Series:
    """One line: ``ys[i]`` at ``xs[i]`` (``None`` or non-finite leaves a gap); ``low`` /
    ``high`` shade a band around it; ``markers`` draws a dot at each point (few points, e.g.
    evals); ``dashed`` for a second line of the same colour."""

    label: str
    xs: Sequence[float]
    ys: Sequence[float | None]
    low: Sequence[float | None] | None = None
    high: Sequence[float | None] | None = None
    color: str | None = None
    markers: bool = False
    dashed: bool = False


def _finite(v: float | None) -> bool:
    return v is not None and math.isfinite(v)


def nice_ticks(low: float, high: float, count: int = 6) -> list[float]:
    """Round tick values (steps of 1, 2 or 5 times a power of ten) covering ``[low, high]``
    with about ``count`` ticks; the first is <= ``low`` and the last >= ``high``."""
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError(f"nice_ticks: range [{low}, {high}] is not finite")
    if high < low:
        low, high = high, low
    if high == low:
        pad = abs(low) * 0.1 or 1.0
        low, high = low - pad, high + pad
    raw = (high - low) / max(count - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.floor(low / step + 1e-9)
    digits = max(0, -math.floor(math.log10(step))) + 3  # drops float noise (0.35000000000000003)
    ticks = []
    k = first
    while True:
        value = round(k * step, digits) + 0.0  # + 0.0: no -0.0
        ticks.append(value)
        if value >= high - step * 1e-9:
            return ticks
        k += 1


def tick_label(value: float, step: float) -> str:
    """A tick's text with as many decimals as the step needs (``0.25``, ``1e+04``)."""
    if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
        return f"{value:.2g}"
    decimals = 0
    while decimals < 6 and abs(step * 10**decimals - round(step * 10**decimals)) > 1e-6:
        decimals += 1
    return f"{value:.{decimals}f}"


def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    return ImageFont.load_default(size=size)


def _text_size(draw: ImageDraw.ImageDraw, text: str, font: object) -> tuple[int, int]:
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)  # type: ignore[arg-type]
    return int(right - left), int(bottom - top)


def _segments(
    points: list[tuple[float, float | None]],
) -> list[list[tuple[float, float]]]:
    """Runs of consecutive finite points (a missing value ends a run)."""
    runs: list[list[tuple[float, float]]] = [[]]
    for x, y in points:
        if _finite(y) and math.isfinite(x):
            runs[-1].append((x, float(y)))  # type: ignore[arg-type]
        elif runs[-1]:
            runs.append([])
    return [r for r in runs if r]


def _blend(color: str, alpha: float) -> tuple[int, int, int]:
    """``color`` mixed with white (a band under its line)."""
    r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return tuple(round(255 - alpha * (255 - c)) for c in (r, g, b))  # type: ignore[return-value]


def line_chart(
    series: Sequence[Series],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    size: tuple[int, int] = (900, 420),
) -> Image.Image:
    """An RGB image of ``size`` (width, height) with every series on shared axes. A chart
    with no finite value says so in its plot area instead of raising."""
    width, height = size
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    font, small, big = _font(13), _font(12), _font(16)

    colors = [s.color or PALETTE[i % len(PALETTE)] for i, s in enumerate(series)]
    xs = [float(x) for s in series for x in s.xs if math.isfinite(x)]
    ys = [
        float(v)  # type: ignore[arg-type]
        for s in series
        for seq in (s.ys, s.low or (), s.high or ())
        for v in seq
        if _finite(v)
    ]

    left, right, top, bottom = 78, width - 20, 40, height - 56
    tw, _ = _text_size(draw, title, big)
    draw.text(((width - tw) / 2, 10), title, fill="black", font=big)
    xw, _ = _text_size(draw, xlabel, font)
    draw.text(((left + right - xw) / 2, height - 22), xlabel, fill="black", font=font)
    yw, yh = _text_size(draw, ylabel, font)
    label = Image.new("RGB", (yw + 4, yh + 6), "white")
    ImageDraw.Draw(label).text((2, 0), ylabel, fill="black", font=font)
    rotated = label.rotate(90, expand=True)
    image.paste(rotated, (6, int((top + bottom - rotated.height) / 2)))

    if not xs or not ys:
        draw.rectangle((left, top, right, bottom), outline="#888888")
        msg = "no data yet"
        mw, mh = _text_size(draw, msg, font)
        draw.text(
            ((left + right - mw) / 2, (top + bottom - mh) / 2), msg, fill="#888888", font=font
        )
        return image

    xticks = nice_ticks(min(xs), max(xs), 8)
    yticks = nice_ticks(min(ys), max(ys), 6)
    x0, x1, y0, y1 = xticks[0], xticks[-1], yticks[0], yticks[-1]

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * (right - left)

    def py(y: float) -> float:
        return bottom - (y - y0) / (y1 - y0) * (bottom - top)

    for ticks, horizontal in ((yticks, True), (xticks, False)):
        step = ticks[1] - ticks[0]
        for t in ticks:
            text = tick_label(t, step)
            w, h = _text_size(draw, text, small)
            if horizontal:
                draw.line((left, py(t), right, py(t)), fill="#e6e6e6")
                draw.line((left - 5, py(t), left, py(t)), fill="black")
                draw.text((left - 8 - w, py(t) - h / 2 - 2), text, fill="black", font=small)
            else:
                draw.line((px(t), top, px(t), bottom), fill="#e6e6e6")
                draw.line((px(t), bottom, px(t), bottom + 5), fill="black")
                draw.text((px(t) - w / 2, bottom + 8), text, fill="black", font=small)

    for s, color in zip(series, colors):  # bands first, under every line
        if s.low is None or s.high is None:
            continue
        pairs = [
            (float(x), float(lo), float(hi))  # type: ignore[arg-type]
            for x, lo, hi in zip(s.xs, s.low, s.high, strict=True)
            if _finite(lo) and _finite(hi)
        ]
        if len(pairs) > 1:
            outline = [(px(x), py(hi)) for x, _, hi in pairs]
            outline += [(px(x), py(lo)) for x, lo, _ in reversed(pairs)]
            draw.polygon(outline, fill=_blend(color, 0.22))

    draw.rectangle((left, top, right, bottom), outline="black")
    for s, color in zip(series, colors):
        for run in _segments(list(zip(s.xs, s.ys, strict=True))):
            points = [(px(x), py(y)) for x, y in run]
            if s.dashed:
                for a, b in itertools.pairwise(points):
                    _dashed(draw, a, b, color)
            elif len(points) > 1:
                draw.line(points, fill=color, width=2, joint="curve")
            if s.markers or len(points) == 1:
                for x, y in points:
                    draw.ellipse((x - 3.5, y - 3.5, x + 3.5, y + 3.5), fill=color)

    _legend(draw, list(zip(series, colors)), (left + 10, top + 8), small)
    return image


def _dashed(
    draw: ImageDraw.ImageDraw, a: tuple[float, float], b: tuple[float, float], color: str
) -> None:
    length = math.dist(a, b)
    dash = 7.0
    n = max(int(length // dash), 1)
    for i in range(0, n, 2):
        t0, t1 = i / n, min((i + 1) / n, 1.0)
        start = (a[0] + (b[0] - a[0]) * t0, a[1] + (b[1] - a[1]) * t0)
        end = (a[0] + (b[0] - a[0]) * t1, a[1] + (b[1] - a[1]) * t1)
        draw.line((*start, *end), fill=color, width=2)


def _legend(
    draw: ImageDraw.ImageDraw,
    entries: list[tuple[Series, str]],
    origin: tuple[int, int],
    font: object,
) -> None:
    """A boxed key in the plot's top-left corner: a line sample and the label per series."""
    if not entries:
        return
    sizes = [_text_size(draw, s.label, font) for s, _ in entries]
    row = max(h for _, h in sizes) + 6
    x, y = origin
    box_w = 34 + max(w for w, _ in sizes) + 8
    draw.rectangle((x, y, x + box_w, y + row * len(entries) + 6), fill="white", outline="#999999")
    for i, (s, color) in enumerate(entries):
        cy = y + 6 + i * row + row / 2 - 2
        if s.dashed:
            _dashed(draw, (x + 6, cy), (x + 28, cy), color)
        else:
            draw.line((x + 6, cy, x + 28, cy), fill=color, width=2)
        if s.markers:
            draw.ellipse((x + 13.5, cy - 3.5, x + 20.5, cy + 3.5), fill=color)
        draw.text((x + 34, cy - sizes[i][1] / 2 - 2), s.label, fill="black", font=font)  # type: ignore[arg-type]


def stack(charts: Sequence[Image.Image]) -> Image.Image:
    """Charts one under another on a white sheet as wide as the widest."""
    width = max(c.width for c in charts)
    sheet = Image.new("RGB", (width, sum(c.height for c in charts)), "white")
    y = 0
    for chart in charts:
        sheet.paste(chart, (0, y))
        y += chart.height
    return sheet
