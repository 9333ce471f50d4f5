"""Why attention reads a decoded view instead of the stored codes: of a model (codes_reason) or of a tier
(view_reason). CodecCache.from_config asks both before it builds a layer; the app and the measurements show the
reason beside every run that keeps a view.
"""

from __future__ import annotations

import dataclasses

from codeckv.cache.kernel_ops import layout_of
from codeckv.codecs.layout import NoRowLayout
from codeckv.tiers import Tier


def codes_reason(config) -> str | None:
    """Why attention cannot read the stored codes of a model with `config`, whatever the tier (None: it can).

    The codes are read by codeckv.cache.attention, which a model reaches only when it attends through transformers'
    AttentionInterface with it installed (load_model does; use_codec_attention(model) otherwise), and only where the
    model hands the cached keys and values to attention as they are, with scores attention computes plainly.
    """
    from codeckv.cache.attention import ATTENTION  # attention.py imports the layers; imported here, not at the top

    text = config.get_text_config(decoder=True)
    if getattr(config, "_attn_implementation", None) != ATTENTION:
        return ("the model does not attend through codeckv's attention function: load it with codeckv.load_model or "
                "call codeckv.cache.attention.use_codec_attention(model), which routes models that attend through "
                "transformers' AttentionInterface and have an SDPA path (Falcon's attention uses no interface; "
                "ALiBi, Gemma-2's softcapped scores and gpt-oss's learned sinks have no SDPA path: they keep their "
                "own)")
    if getattr(text, "kv_lora_rank", None):
        return ("its cache holds the compressed latent of multi-head latent attention (MLA), which the model expands "
                "into keys and values (kv_b_proj) before attention reads them")
    return None


def view_reason(tier: Tier) -> str | None:
    """Why attention cannot read `tier`'s stored codes, so that its cache keeps a decoded view (None: it can)."""
    if tier.is_native:
        return "a native cache holds its tokens as they are"
    for index, layer_tier in tier.per_layer:
        why = view_reason(layer_tier) if not layer_tier.is_native else None
        if why is not None:
            return f"layer {index} ({layer_tier.name}): {why}"
    tier = dataclasses.replace(tier, per_layer=())  # the tier of the other layers
    if tier.is_native:
        return None
    if tier.joint is not None:
        return "keys and values are coded together in entropy-coded chunks, which no attention kernel reads"
    if tier.key is None:
        return "a press alone keeps its tokens raw: attention reads them as they are"
    for side, codec in (("key", tier.key), ("value", tier.value)):
        layout = layout_of(codec)
        if isinstance(layout, NoRowLayout):
            return f"no attention kernel reads its {side} codes ({layout.reason})"
    return None
