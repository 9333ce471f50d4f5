"""The README's long-context verdicts (scripts/ruler_table.py --versus): a tier told apart from native only where
the paired difference is beyond twice its standard error."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("ruler_table", ROOT / "scripts" / "ruler_table.py")
ruler_table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ruler_table)


def _rows(tier: str, scores: dict[str, list[float]]) -> list[dict]:
    return [{"task": task, "length": "2048", "sample": str(i), "tier": tier, "score": str(score)}
            for task, values in scores.items() for i, score in enumerate(values)]


def test_a_tier_is_told_apart_only_beyond_twice_the_paired_standard_error():
    rows = (_rows("native", {"niah_single_1": [100] * 4, "vt": [100] * 4})
            + _rows("turbo-3", {"niah_single_1": [100, 100, 0, 100], "vt": [100] * 4})
            + _rows("snapkv-50", {"niah_single_1": [0] * 4, "vt": [0] * 4}))
    table = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
             for line in ruler_table.versus(rows, "native", 2048).splitlines()[2:]}
    # turbo-3: niah_single_1 differs by -25 +- 25 (paired over 4 samples), vt by 0: the average by -12.5 +- 12.5
    assert table["`turbo-3`"] == ["4 (2 tasks)", "87.5 ± 12.5", "-12.5 ± 12.5", "no"]
    assert table["`snapkv-50`"] == ["4 (2 tasks)", "0.0 ± 0.0", "-100.0 ± 0.0", "yes"]
    assert table["`native`"][3] == "–"


def test_a_task_with_one_sample_gives_no_verdict():
    rows = _rows("native", {"vt": [100]}) + _rows("nvfp4", {"vt": [0]})
    line = ruler_table.versus(rows, "native", 2048).splitlines()[-1]
    assert line.endswith("| too few samples |"), line


def test_a_verdict_depends_on_the_haystack_only_beyond_twice_the_combined_error():
    native = {"niah_single_1": [100] * 4, "vt": [100] * 4}
    first = _rows("native", native) + _rows("nvfp4", {"niah_single_1": [0] * 4, "vt": [100, 0, 100, 100]})
    second = _rows("native", native) + _rows("nvfp4", {"niah_single_1": [100] * 4, "vt": [100, 100, 0, 100]})
    for row in first:
        row["haystack"] = "bible"
    line = ruler_table.haystacks(first, second, "native", 2048).splitlines()
    assert "native`, bible |" in line[0] and "native`, ? |" in line[0], line[0]  # a CSV without the column: "?"
    cells = [cell.strip() for cell in line[2].split("|")[1:-1]]
    # niah_single_1 loses 100 on the first haystack and nothing on the second; vt -25 +- 25 on both
    assert cells == ["`nvfp4`", "2", "-62.5 ± 12.5", "-12.5 ± 12.5", "+50.0 ± 17.7", "yes", "niah_single_1"]
