"""The needle prompt has the asked length and the key at the asked depth; the grid marks retrieval per tier."""

import pytest

from codeckv.figures.plots import needle_figure
from codeckv.measure.needle import needle_grid, needle_key, needle_prompt, question_start
from codeckv.presses import SnapKVPress
from codeckv.tiers import TIERS, Tier


def test_prompt_length_and_key_position(loaded):
    key = needle_key(600, 0.5)
    ids = needle_prompt(loaded, 600, 0.5, key)
    text = loaded.tokenizer.decode(ids[0])
    assert abs(ids.shape[1] - 600) <= 25 and text.count(key) == 2
    assert 0.3 < text.index(key) / len(text) < 0.7, "depth 0.5: the key sits in the middle of the filler"
    at_end = loaded.tokenizer.decode(needle_prompt(loaded, 600, 1.0, key)[0])
    assert at_end.index(key) / len(at_end) > 0.8
    with pytest.raises(ValueError, match="too short"):
        needle_prompt(loaded, 20, 0.0, key)


def test_grid_native_retrieves_and_png_matches_it(loaded):
    grid = needle_grid(loaded, [TIERS["png"]], [300], [0.0, 1.0])
    assert grid.tiers == ["native", "png"] and len(grid.rows) == 4
    assert grid.retrieved("native").tolist() == [[1.0], [1.0]]
    assert grid.retrieved("png").tolist() == grid.retrieved("native").tolist(), "lossless answers like native"
    assert len(needle_figure(grid).data) == 2
    with pytest.raises(ValueError, match="context of 8192"):
        needle_grid(loaded, [TIERS["png"]], [9000], [0.0])


def test_a_press_answers_under_the_protocol_it_was_asked_for(loaded):
    """'once': the context before the question pressed once, the question not; 'chunked': every chunk pressed. A
    press that keeps everything answers as native does under either."""
    key = needle_key(300, 0.5)
    ids = needle_prompt(loaded, 300, 0.5, key)
    split = question_start(loaded, ids)
    assert "What is the pass key?" in loaded.tokenizer.decode(ids[0, split:])
    assert "What is the pass key?" not in loaded.tokenizer.decode(ids[0, :split]) and split > 250
    keeps_all = Tier("snapkv-0", "", press=SnapKVPress(0.0))
    for mode in ("once", "chunked"):
        grid = needle_grid(loaded, [keeps_all, TIERS["snapkv-50"]], [300], [0.5], press_mode=mode)
        rows = {row.tier: row for row in grid.rows}
        assert rows["snapkv-0"].answer == rows["native"].answer, mode
        assert rows["snapkv-50"].press_mode == rows["snapkv-0"].press_mode == mode and rows["native"].press_mode == ""
        assert rows["snapkv-50"].ratio_vs_bf16 < rows["native"].ratio_vs_bf16, "half the context evicted"
    with pytest.raises(ValueError, match="allowed: once, chunked"):
        needle_grid(loaded, [TIERS["snapkv-50"]], [300], [0.5], press_mode="never")


def test_the_cli_writes_each_cell_as_it_finishes_and_update_adds_only_new_cells(tmp_path, capsys):
    import csv

    from codeckv.cli import main

    out = tmp_path / "needle.csv"
    small = ["needle", "--depths", "0", "1", "--tiers", "png", "--out", str(out), "--charts", str(tmp_path / "c")]
    assert main([*small, "--lengths", "300"]) == 0
    first = list(csv.DictReader(out.open()))
    assert [(r["length"], r["depth"], r["tier"]) for r in first] == [("300", d, t) for d in ("0.0", "1.0")
                                                                     for t in ("png", "native")]
    assert main([*small, "--lengths", "300", "400", "--update"]) == 0
    rows = list(csv.DictReader(out.open()))
    assert rows[:4] == first, "the kept cells as they were, not measured again"
    assert [(r["length"], r["retrieved"]) for r in rows[4:]] == [("400", "True")] * 4
    table = capsys.readouterr().out
    assert "native      2/2      2/2" in table and "png      2/2      2/2" in table
