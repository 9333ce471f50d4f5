"""Plotly figures shared by the app and the CLI: plots draws each figure, views builds the set of each view,
long_context the long-context ones, reasoning the word problems'.

    from codeckv.figures import quality_figures, sweep_figures, inspect_figures
    from codeckv.figures import ruler_heatmap_figure, ruler_bytes_figure, depth_figure   # long context
"""

from codeckv.figures.long_context import depth_figure, ruler_bytes_figure, ruler_heatmap_figure
from codeckv.figures.reasoning import reasoning_accuracy_figure, reasoning_curve_figure
from codeckv.figures.views import inspect_figures, quality_figures, sweep_figures, token_kld_figure, worst_tier

__all__ = ["depth_figure", "inspect_figures", "quality_figures", "reasoning_accuracy_figure",
           "reasoning_curve_figure", "ruler_bytes_figure", "ruler_heatmap_figure",
           "sweep_figures", "token_kld_figure", "worst_tier"]
