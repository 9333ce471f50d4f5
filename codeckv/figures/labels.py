"""Where a chart's point labels go: a greedy placement that keeps every label clear of the others, the markers
and the plot's edge, or leaves the label out; and how many rows its legend takes (the Pareto chart,
codeckv/figures/plots.py, drawn with a plot area of PLOT_AREA_PX so that the placement's pixels are the drawn ones)."""

from __future__ import annotations

LABEL_OFFSETS = [(0, -30), (0, 30), (60, -24), (60, 24), (-60, -24), (-60, 24), (80, 0), (-80, 0),
                 (0, -55), (0, 55), (90, -45), (-90, -45), (90, 45), (-90, 45), (130, 0), (-130, 0),
                 (0, -80), (0, 80), (120, -70), (-120, -70), (120, 70), (-120, 70),
                 (0, -110), (0, 110), (170, 0), (-170, 0), (160, -100), (-160, -100)]  # pixels, nearest first
LABEL_CHAR_PX, LABEL_HEIGHT_PX, MARKER_PX = 9.0, 24.0, 18.0  # a 14 px label's character and line (with room), a marker
LABEL_MARGIN_PX = 12.0  # rendered boxes differ from the estimate: a clear place keeps this much more room
PLOT_AREA_PX = (1200, 420)  # the app's full-width chart: a 1330 px gr.Plot less the margins, and the drawn height
LEGEND_CHAR_PX, LEGEND_ENTRY_PX = 8.5, 50.0  # a 16 px legend entry's character, and its symbol and gaps


def legend_rows(names: list[str], width: float = PLOT_AREA_PX[0]) -> int:
    """Rows a horizontal legend of these entries takes across `width` pixels: plotly wraps it into columns as wide
    as its widest entry (estimated from the text)."""
    widest = max((LEGEND_CHAR_PX * len(name) + LEGEND_ENTRY_PX for name in names), default=width)
    columns = max(1, int(width // widest))
    return -(-len(names) // columns)


def place_labels(xs: list[float], ys: list[float], labels: list[str], x_range: tuple[float, float],
                 y_range: tuple[float, float], width: float = PLOT_AREA_PX[0],
                 height: float = PLOT_AREA_PX[1]) -> list[tuple[int, int] | None]:
    """A label offset per point (pixels), chosen greedily so no label box covers another label, a marker or
    the plot's edge (the nearest such offset); None where no offset is clear: on a crowded chart that point is
    named by its hover and its family's legend entry instead of a label over another.

    The boxes are estimated from the text (LABEL_CHAR_PX per character) on a plot area of width x height
    pixels showing x_range x y_range (PLOT_AREA_PX: the app's full-width chart).
    """
    def pixels(x: float, y: float) -> tuple[float, float]:
        (x0, x1), (y0, y1) = x_range, y_range
        return (x - x0) / (x1 - x0 or 1.0) * width, height - (y - y0) / (y1 - y0 or 1.0) * height

    def box(cx: float, cy: float, w: float, h: float) -> tuple[float, float, float, float]:
        return cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2

    def covered(a, b) -> float:
        return max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))

    points = [pixels(x, y) for x, y in zip(xs, ys)]
    taken = [box(px, py, MARKER_PX, MARKER_PX) for px, py in points]
    offsets = []
    for (px, py), label in zip(points, labels):
        w = LABEL_CHAR_PX * len(label) + 12

        def cost(offset, px=px, py=py, w=w) -> float:
            rect = box(px + offset[0], py + offset[1], w + LABEL_MARGIN_PX, LABEL_HEIGHT_PX + LABEL_MARGIN_PX)
            outside = (max(0.0, -rect[0]) + max(0.0, rect[2] - width) + max(0.0, -rect[1])
                       + max(0.0, rect[3] - height)) * LABEL_HEIGHT_PX
            return sum(covered(rect, other) for other in taken) + outside

        best = min(LABEL_OFFSETS, key=cost)  # min keeps the first (nearest) of equally clear offsets
        if cost(best) > 0:
            offsets.append(None)
            continue
        offsets.append(best)
        taken.append(box(px + best[0], py + best[1], w, LABEL_HEIGHT_PX))
    return offsets
