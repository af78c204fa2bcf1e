"""Fitted per-(layer, head) correction strengths.

``strengths_file``: the file format (foundation layer: the attention config and the resolve step read it).
``fit``: ``python -m jensenkv.calibration``, which generates calibration videos and fits the strengths (a command
line: it sits above ``run``). This package's namespace exports the file format only, so reading a file imports
nothing of the fit.
"""
from jensenkv.calibration.strengths_file import (CALIBRATION_FORMAT, Calibration, calibration_identity,
                                                 check_calibration, digest, fail_calibration, load_calibration,
                                                 prompt_key, strength_label)

__all__ = ["CALIBRATION_FORMAT", "Calibration", "calibration_identity", "check_calibration", "digest",
           "fail_calibration", "load_calibration", "prompt_key", "strength_label"]
