"""The word-problem verdicts (scripts/reasoning_table.py): a tier's accuracy against its reference, paired problem by
problem, and told apart only beyond twice that difference's standard error."""

import importlib.util
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("reasoning_table", ROOT / "scripts" / "reasoning_table.py")
reasoning_table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reasoning_table)


def test_the_paired_difference_is_the_flips_mean_and_its_standard_error():
    # one problem lost in 80: differences of -100 once and 0 otherwise, mean -1.25, sample sd sqrt(125), se 1.25
    assert reasoning_table.paired(1, 0, 80) == pytest.approx((-1.25, 1.25))
    diff, se = reasoning_table.paired(22, 2, 80)  # nvfp4-like: 20 problems net lost
    assert diff == pytest.approx(-25.0) and abs(diff) > 2 * se
    assert reasoning_table.paired(0, 0, 80) == (0.0, 0.0)
    assert math.isnan(reasoning_table.paired(1, 0, 1)[1]), "one problem: no error"
