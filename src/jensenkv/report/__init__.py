"""Paper tables and figures from the results store.

``python -m jensenkv.report.table1`` writes results/table1.{csv,md,tex} and results/figures/*.png;
``jensenkv.report.figures`` holds the plotting functions the notebooks reuse. Every report writes through
``jensenkv.report.publish``: committed files only from a store holding the whole experiment (else
``<out>/partial/`` with a one-line why), all of a report's files or none.
"""
