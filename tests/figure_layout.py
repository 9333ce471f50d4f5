"""The layout check of every drawn plotly figure on a page: what a reader of a screenshot would trip on.

    problems = figure_layout_problems(page)      # [] when every figure reads cleanly

Per figure (each `.js-plotly-plot` that is displayed), from the boxes the browser really drew:
- every title, axis title, subplot title or other annotation, legend, colorbar and tick label lies inside
  the figure (nothing clipped at its edges);
- no two of the titles, axis titles, annotations, legends and colorbars overlap;
- no axis title, annotation or legend covers a tick label;
- the tick labels of one axis do not overlap each other.

The browser: headless Debian Chromium at CHROMIUM with FLAGS (design.md), never `playwright install`.
"""

from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run"]

CHECK = r"""
(root) => {
  const problems = [];
  const box = (el) => el.getBoundingClientRect();
  const overlap = (a, b) => Math.min(a.right, b.right) - Math.max(a.left, b.left) > 1
                          && Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > 1;
  const drawn = (el) => { const r = box(el); return r.width > 0 && r.height > 0; };
  const label = (el) => (el.textContent || el.getAttribute('class') || '?').trim().slice(0, 60);
  root.querySelectorAll('.js-plotly-plot').forEach((plot, index) => {
    if (!drawn(plot)) return;
    const frame = box(plot.querySelector('.main-svg'));
    const title = plot.querySelector('.gtitle');
    const name = `figure ${index} (${title ? label(title) : 'untitled'})`;
    const texts = [...plot.querySelectorAll('text')].filter(drawn);
    const classed = (pattern) => texts.filter((t) => pattern.test(t.getAttribute('class') || ''));
    const titles = classed(/^(gtitle|[xy]\d*title)$/);
    const notes = [...plot.querySelectorAll('.annotation-text-g')].filter(drawn);
    const blocks = [...plot.querySelectorAll('g.legend, g.colorbar')].filter(drawn);
    const ticks = [...plot.querySelectorAll('g.xtick > text, g.ytick > text, g[class^="x"][class$="tick"] > text,'
                                            + ' g[class^="y"][class$="tick"] > text')].filter(drawn);
    const named = [...titles, ...notes, ...blocks];
    for (const el of [...named, ...ticks]) {
      const r = box(el);
      if (r.left < frame.left - 1 || r.right > frame.right + 1 || r.top < frame.top - 1 || r.bottom > frame.bottom + 1)
        problems.push(`${name}: "${label(el)}" is cut off at the figure's edge`);
    }
    for (let i = 0; i < named.length; i++)
      for (let j = i + 1; j < named.length; j++)
        if (!named[i].contains(named[j]) && !named[j].contains(named[i]) && overlap(box(named[i]), box(named[j])))
          problems.push(`${name}: "${label(named[i])}" overlaps "${label(named[j])}"`);
    for (const el of named)
      for (const tick of ticks)
        if (!el.contains(tick) && overlap(box(el), box(tick)))
          problems.push(`${name}: "${label(el)}" covers the tick label "${label(tick)}"`);
    const axes = new Map();
    for (const tick of ticks) {
      const key = tick.parentNode.parentNode;
      if (!axes.has(key)) axes.set(key, []);
      axes.get(key).push(tick);
    }
    for (const group of axes.values())
      for (let i = 0; i < group.length; i++)
        for (let j = i + 1; j < group.length; j++)
          if (overlap(box(group[i]), box(group[j])))
            problems.push(`${name}: tick labels "${label(group[i])}" and "${label(group[j])}" overlap`);
  });
  return problems;
}
"""


def figure_layout_problems(page, selector: str = "body") -> list[str]:
    """Every layout problem of the figures drawn under `selector` (a playwright page), as sentences."""
    return page.locator(selector).evaluate(CHECK)
