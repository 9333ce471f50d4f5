"""Side-by-side streaming: both panels grow together, the final update carries the comparison."""

import math

import torch

from codeckv.cache import CODES, SHORT_VIEW
from codeckv.cache.kernel_ops import attention_compiled
from codeckv.measure.side_by_side import run_side_by_side, stream_side_by_side
from codeckv.tiers import TIERS, get_tier


def test_streaming_yields_progressively_longer_texts_on_both_sides(loaded, chat):
    updates = list(stream_side_by_side(loaded, chat, TIERS["turbo-4"], max_new_tokens=6, stop_at_eos=False))
    assert updates[0].phase == "prefill"
    generating = [u for u in updates if u.phase == "generating"]
    assert [len(u.native.token_ids) for u in generating] == list(range(2, 7)), "one native token per update"
    assert [len(u.codec.token_ids) for u in generating] == list(range(2, 7)), "codec advances in lockstep"
    for before, after in zip(generating, generating[1:]):
        assert len(after.native.text) >= len(before.native.text)
        assert len(after.codec.text) >= len(before.codec.text)
    assert generating[-1].native.text and generating[-1].codec.text
    assert updates[-1].phase == "done" and all(u.results is None for u in updates[:-1])

    result = updates[-1].result
    assert result.tier == "turbo-4" and result.codec.token_ids == updates[-1].codec.token_ids
    assert result.native.prefill_s > 0 and result.codec.decode_ms > 0 and math.isfinite(result.latency_ratio)
    assert 0.0 <= result.token_match <= 1.0
    assert len(result.token_nll_native) == len(result.token_kld) == len(result.scored_tokens) == 6
    assert result.token_kld[0] == 0.0, "the first token is predicted by the prefill, at full precision"
    assert result.kld > 0 and 0 <= result.top1_pct <= 100
    on_cpu = loaded.model.device.type == "cpu"
    assert result.codec.peak_memory_source.startswith("the most the cache's own tensors" if on_cpu else "cuda")
    assert result.codec.resident_bytes >= result.codec.archive_bytes > 0
    assert result.codec.peak_held_bytes >= result.codec.held_bytes > 0
    turbo = get_tier("turbo-4")
    if attention_compiled(turbo.key, turbo.value, loaded.model.config.head_dim):
        assert list(result.codec.attention) == [CODES], "the compiled kernel reads codes at any length"
    else:
        assert list(result.codec.attention) == [SHORT_VIEW], "a short chat decodes on a view"
    assert result.codec.prefill_path.startswith("in chunks of 512 tokens through the codec cache")
    element = torch.finfo(loaded.model.dtype).bits // 8
    assert result.native.archive_bytes * 2 == result.native.bf16_bytes * element, "native holds its dtype's bytes"
    torch.testing.assert_close(
        torch.tensor(result.nll_native), torch.tensor(result.token_nll_native).mean(), msg="mean of per-token NLL"
    )


def test_run_side_by_side_returns_the_comparison(loaded):
    cmp = run_side_by_side(loaded, "The three primary colours are", TIERS["png"], max_new_tokens=6, stop_at_eos=False)
    assert cmp.tier == "png" and cmp.token_match == 1.0 and len(cmp.codec.token_ids) == 6
    assert cmp.kld == 0.0 and cmp.top1_pct == 100.0 and cmp.delta_nll_pct == 0.0, "png is lossless"


def test_the_codec_cache_is_filled_from_the_native_prefill_exactly(loaded):
    """Filling a codec cache from the native prefill equals prefilling through it and archiving the prompt."""
    from transformers import DynamicCache

    from codeckv.cache import make_cache
    from codeckv.corpus import corpus_windows
    from codeckv.measure.side_by_side import Run, filled_from

    ids = corpus_windows(loaded.tokenizer, 1, 80)  # two archive units of turbo-4 and a raw tail
    native, direct = DynamicCache(config=loaded.model.config), make_cache(loaded.model.config, "turbo-4")
    with torch.inference_mode():
        loaded.model(input_ids=ids, cache=native)
        loaded.model(input_ids=ids, cache=direct)
    direct.flush()
    filled = filled_from(native, Run(loaded, "turbo-4", get_tier("turbo-4")))
    filled.flush()
    for a, b in zip(direct.layers, filled.layers):
        assert a.archive_k.tokens == b.archive_k.tokens == 64 and a.archive_v.nbytes == b.archive_v.nbytes
        torch.testing.assert_close(a.keys, b.keys, rtol=0, atol=0)
        torch.testing.assert_close(a.values, b.values, rtol=0, atol=0)
