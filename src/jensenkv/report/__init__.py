"""Paper tables and figures from the results store.

``python -m jensenkv.report.table1`` writes results/table1.{csv,md,tex} and results/figures/*.png;
``jensenkv.report.figures`` holds the plotting functions the notebooks reuse.
"""
