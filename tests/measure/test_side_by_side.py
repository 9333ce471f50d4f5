"""Side-by-side streaming: both panels grow together, the final update carries the comparison."""

import math

import torch

from codeckv.measure.side_by_side import run_side_by_side, stream_side_by_side


def test_streaming_yields_progressively_longer_texts_on_both_sides(loaded, chat):
    updates = list(stream_side_by_side(loaded, chat, "turbo-4", max_new_tokens=6, stop_at_eos=False))
    generating = [u for u in updates if u.phase == "generating"]
    assert [len(u.native.token_ids) for u in generating] == list(range(1, 7)), "one native token per update"
    assert [len(u.codec.token_ids) for u in generating] == list(range(1, 7)), "codec advances in lockstep"
    for before, after in zip(generating, generating[1:]):
        assert len(after.native.text) >= len(before.native.text)
        assert len(after.codec.text) >= len(before.codec.text)
    assert generating[-1].native.text and generating[-1].codec.text
    assert [u.phase for u in updates[len(generating):]] == ["scoring", "scoring", "done"]
    assert all(u.results is None for u in updates[:-1])

    result = updates[-1].result
    assert result.tier == "turbo-4" and result.codec.token_ids == updates[-1].codec.token_ids
    assert result.native.prefill_s > 0 and result.codec.decode_ms > 0 and math.isfinite(result.latency_ratio)
    assert 0.0 <= result.token_match <= 1.0
    assert len(result.token_nll_native) == len(result.token_nll_codec) == len(result.scored_tokens) == 5
    on_cpu = loaded.model.device.type == "cpu"
    assert result.codec.peak_memory_source.startswith("cache resident bytes" if on_cpu else "cuda")
    assert result.codec.resident_bytes >= result.codec.archive_bytes > 0
    element = torch.finfo(loaded.model.dtype).bits // 8
    assert result.native.archive_bytes * 2 == result.native.bf16_bytes * element, "native holds its dtype's bytes"
    torch.testing.assert_close(
        torch.tensor(result.nll_native), torch.tensor(result.token_nll_native).mean(), msg="mean of per-token NLL"
    )


def test_run_side_by_side_returns_the_comparison(loaded):
    cmp = run_side_by_side(loaded, "The three primary colours are", "png", max_new_tokens=6, stop_at_eos=False)
    assert cmp.tier == "png" and cmp.token_match == 1.0 and len(cmp.codec.token_ids) == 6
