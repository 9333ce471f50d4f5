"""Memory of a turn: held, peak and at-rest bytes from the tensors, the process peak in a fresh process."""

import pytest

from codeckv.measure.memory import beside_native, memory_row, memory_row_isolated, memory_rows, modes_of
from codeckv.serve.limits import Limits
from codeckv.serve.service import memory_request
from codeckv.tiers import TIERS


def test_modes_follow_what_attention_can_read():
    assert modes_of(TIERS["native"]) == [TIERS["native"]]
    assert modes_of(TIERS["turbo-4"]) == ["codes", "view"]
    assert modes_of(TIERS["png"]) == ["view"] and modes_of(TIERS["pca-8x"]) == ["view"]


def test_on_the_codes_a_cache_holds_its_archive_and_at_rest_a_view_is_dropped(loaded):
    rows = {(r["tier"], r["mode"]): r for r in beside_native(memory_rows(loaded, [TIERS["turbo-4"]], [320], 4))}
    native, codes, view = rows["native", "native"], rows["turbo-4", "codes"], rows["turbo-4", "view"]
    assert native["tokens"] == codes["tokens"] == view["tokens"] == 323, "the same tokens in every cache"
    assert native["held_bytes"] == native["archive_bytes"] == native["at_rest_bytes"]
    assert codes["held_vs_native"] < 0.2 and codes["peak_held_bytes"] >= codes["held_bytes"] >= codes["archive_bytes"]
    assert view["held_vs_native"] > 1, "a decoded view beside the archive holds more than native"
    assert view["at_rest_bytes"] == view["archive_bytes"] < 0.2 * native["held_bytes"], "at rest: the archive only"
    with pytest.raises(ValueError, match="allowed: view"):
        memory_row(loaded, TIERS["png"], "codes", 64)


def test_an_isolated_row_measures_its_own_process_peak(loaded):
    row = memory_row_isolated(None, TIERS["turbo-4"], "codes", 128, 2)
    assert row.process_peak_bytes > 0 and "VmHWM" in row.process_peak_source
    assert row.tokens == 129 and row.held_bytes > 0


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
