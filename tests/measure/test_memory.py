"""Memory of a turn: held, peak and at-rest bytes from the tensors, the process peak in a fresh process; a short
context held raw as native holds it, and the measurements of the codec archiving from its first unit."""

from pathlib import Path

import pytest
import torch

from codeckv.cache import make_cache
from codeckv.measure.lockstep import lockstep
from codeckv.measure.memory import beside_native, memory_row, memory_row_isolated, memory_rows, modes_of
from codeckv.serve.limits import Limits
from codeckv.serve.service import memory_request
from codeckv.serve.tab_views import memory_views
from codeckv.tiers import TIERS


def test_modes_follow_what_attention_can_read():
    assert modes_of(TIERS["native"]) == ["native"]
    assert modes_of(TIERS["turbo-4"]) == ["codes", "view"]
    assert modes_of(TIERS["png"]) == ["view"] and modes_of(TIERS["pca-8x"]) == ["view"]


def test_on_the_codes_a_cache_holds_its_archive_and_at_rest_a_view_is_dropped(loaded, monkeypatch):
    monkeypatch.setattr("codeckv.cache.layers.SHORT_VIEW_TOKENS", 128)  # a view layer archives past 128 tokens
    rows = {(r["tier"], r["mode"]): r for r in beside_native(memory_rows(loaded, [TIERS["turbo-4"]], [320], 4))}
    native, codes, view = rows["native", "native"], rows["turbo-4", "codes"], rows["turbo-4", "view"]
    assert native["tokens"] == codes["tokens"] == view["tokens"] == 323, "the same tokens in every cache"
    assert native["held_bytes"] == native["archive_bytes"] == native["at_rest_bytes"]
    assert (codes["raw_until"], view["raw_until"], native["raw_until"]) == (32, 128, None)
    assert codes["held_vs_native"] < 0.2 and codes["peak_held_bytes"] >= codes["held_bytes"] >= codes["archive_bytes"]
    assert view["held_vs_native"] > 1, "a decoded view beside the archive holds more than native"
    assert view["at_rest_bytes"] == view["archive_bytes"] < 0.2 * native["held_bytes"], "at rest: the archive only"
    with pytest.raises(ValueError, match="allowed: view"):
        memory_row(loaded, TIERS["png"], "codes", 64)


def test_a_short_context_costs_no_more_than_native_in_any_tier(loaded):
    """27 tokens: a view tier (png, pca-8x, turbo-4's view) and turbo-4 on its codes (a 32-token unit) hold them
    raw, exactly native's bytes; jpeg-k2 on its codes has archived 24 of them and holds less."""
    tiers = [TIERS[name] for name in ("png", "jpeg-k2", "turbo-4", "pca-8x")]
    rows = beside_native(memory_rows(loaded, tiers, [24], 4))
    native = rows[0]
    for row in rows:
        if row["archived_tokens"]:
            assert row["held_vs_native"] < 1.0, (row["tier"], row["mode"])
        else:  # raw, token for token: native's bytes while it runs, at its peak and at rest
            held = (row["held_bytes"], row["peak_held_bytes"], row["at_rest_bytes"])
            assert held == (native["held_bytes"],) * 3, (row["tier"], row["mode"])
    archived = {(r["tier"], r["mode"]): r["archived_tokens"] for r in rows if r["archived_tokens"]}
    assert archived == {("jpeg-k2", "codes"): 24}, "past its own N (8 tokens) only jpeg-k2 on its codes archives"


def test_the_measurements_of_the_codec_archive_from_its_first_unit(tiny_gemma3):
    """Lockstep scoring (the quality measurements) feeds the codec itself: a cache made for a chat, whose view
    layers would hold these 48 tokens raw, archives from its first unit there."""
    config = tiny_gemma3.config
    chat_cache = make_cache(config, "turbo-4", materialization_free=False)
    windows = torch.randint(0, 128, (1, 48), generator=torch.Generator().manual_seed(0))
    _, (native, scores) = lockstep(tiny_gemma3, windows, [make_cache(config, "native"), chat_cache])
    assert set(chat_cache.raw_until.values()) == {0} and chat_cache.layers[2].archive_k.tokens == 32
    assert float(scores.kld.max()) > 0.0, "the archived tokens moved the predictions"


def test_an_isolated_row_measures_its_own_process_peak(loaded):
    row = memory_row_isolated(None, TIERS["turbo-4"], "codes", 512, 2)  # a turn large enough to grow the RSS
    assert row.process_peak_bytes > 0 and "VmHWM" in row.process_peak_source
    assert row.tokens == 513 and row.held_bytes > 0


@pytest.mark.parametrize("contexts, tiers, tokens, match", [
    ([], ["turbo-4"], 4, "at least one context"),
    (["1000"], ["turbo-4"], 4, "prompt tokens"),
    (["512"], ["nope"], 4, "nope"),
    (["512"], ["turbo-4"], 0, "new tokens"),
    (["4096", "8192"], ["turbo-4", "int8", "pca-8x"], 4, "allowed per request"),
])
def test_memory_requests_are_validated_before_any_work(loaded, contexts, tiers, tokens, match):
    with pytest.raises(ValueError, match=match):
        memory_request(loaded, contexts, tiers, tokens, limits=Limits())


def test_the_memory_tab_shows_and_writes_every_row(loaded, tmp_path):
    """The Memory tab's outputs from a real request: a chart each of held and peak bytes, a table row and a CSV row
    per (tier, attention mode) beside native's."""
    rows = memory_request(loaded, ["512"], ["turbo-4"], 2, limits=Limits())
    held, peak, table, path = memory_views(rows, tmp_path)
    assert [(r["tier"], r["mode"]) for r in rows] == [("native", "native"), ("turbo-4", "codes"), ("turbo-4", "view")]
    assert [row[1:3] for row in table["data"]] == [["native", "native"], ["turbo-4", "codes"], ["turbo-4", "view"]]
    assert len(held.data) > 0 and len(peak.data) > 0
    assert len(Path(path).read_text().splitlines()) == 1 + len(rows)
