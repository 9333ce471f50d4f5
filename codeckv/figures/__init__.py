"""Plotly figures shared by the app and the CLI: plots draws each figure, views builds the set of each view.

    from codeckv.figures import quality_figures, sweep_figures, inspect_figures
"""

from codeckv.figures.views import inspect_figures, quality_figures, sweep_figures, token_kld_figure, worst_tier

__all__ = ["inspect_figures", "quality_figures", "sweep_figures", "token_kld_figure", "worst_tier"]
