"""The quant package stands alone: it defines GroupSteps and never imports the correction module."""
from __future__ import annotations

import subprocess
import sys


def test_quant_does_not_import_correction():
    code = "import sys, jensenkv.quant; assert 'jensenkv.correction' not in sys.modules, sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_group_steps_is_one_class_everywhere():
    from jensenkv.correction import GroupSteps as from_correction
    from jensenkv.quant import GroupSteps as from_quant

    assert from_correction is from_quant
