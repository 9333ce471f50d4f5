"""codes_latency_table and `latency --contexts`: make_cache's default path against native, per context and tier."""

import pytest

from codeckv.cache import CODES, SHORT_VIEW
from codeckv.cache.kernel_ops import attention_compiled
from codeckv.cli import main
from codeckv.measure.latency import codes_latency_table
from codeckv.tiers import TIERS


def test_codes_latency_has_a_row_per_context_and_tier(loaded):
    rows = codes_latency_table(loaded, [40, 72], [TIERS["turbo-4"], TIERS["int8"]], max_new_tokens=4)
    assert [(r["tier"], r["context"]) for r in rows] == [("turbo-4", 40), ("int8", 40), ("turbo-4", 72), ("int8", 72)]
    for row in rows:
        assert row["native_decode_ms"] > 0 and row["codes_decode_ms"] > 0
        assert row["latency_ratio"] == pytest.approx(row["codes_decode_ms"] / row["native_decode_ms"], rel=0.02)
        assert 0 <= row["token_match"] <= 1
        tier = TIERS[row["tier"]]
        if attention_compiled(tier.key, tier.value, loaded.model.config.head_dim):
            assert list(row["attention"]) == [CODES], "the compiled kernel reads the codes at every length"
            assert row["resident_bytes"] < row["native_bytes"] / 2, "no view: the archive and the raw tail"
        else:
            assert list(row["attention"]) == [SHORT_VIEW], "a short context's decode steps read a decoded view"
            assert row["resident_bytes"] > row["native_bytes"], "held counts the short view (fp32, with growth room)"


def test_codes_latency_needs_a_timed_step(loaded):
    with pytest.raises(ValueError, match="no timed step"):
        codes_latency_table(loaded, [40], [TIERS["turbo-4"]], max_new_tokens=2)


def test_latency_cli_rejects_bad_contexts(capsys):
    assert main(["latency", "--contexts", "1k,4k"]) == 2
    assert "comma-separated positive token counts" in capsys.readouterr().err
    assert main(["latency", "--contexts", "1024", "--context", "512"]) == 2
