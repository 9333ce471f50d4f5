"""The peers (transformers' QuantizedCache): bytes by their storage rule, scored in the lockstep batch beside the
tiers, accepted wherever a tier name is, and absent with a one-line reason when their package is missing."""

import dataclasses
import importlib.util
import os
import subprocess

import pytest
import torch
from transformers import LlamaConfig

from codeckv.cli import main
from codeckv.figures.plots import pareto_figure
from codeckv.measure.lockstep import compare, lockstep
from codeckv.measure.needle import needle_grid
from codeckv.measure.peers import (
    ATTENTION,
    PEERS,
    absent_reason,
    make_peer_cache,
    peer_footprint,
    rule_bytes,
    run_for,
)
from codeckv.measure.quality import measure_quality
from codeckv.serve.formatting import quality_table
from codeckv.serve.inputs import chosen_tiers
from codeckv.serve.service import ONE_PROMPT, sweep_request
from codeckv.tiers import TIERS

INSTALLED = [name for name, peer in PEERS.items() if absent_reason(peer) is None]
needs = pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.skipif(
    absent_reason(PEERS[n]) is not None, reason=str(absent_reason(PEERS[n])))) for n in PEERS])


@pytest.fixture
def hidden(monkeypatch):
    """optimum-quanto and hqq look uninstalled to codeckv.measure.peers (importlib finds neither)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name.split(".")[0] in ("hqq", "optimum") else real(name, *args))


@needs
def test_bytes_counted_from_the_tensors_match_the_storage_rule(name):
    peer = PEERS[name]
    config = LlamaConfig(num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=3, hidden_size=384)
    cache = make_peer_cache(config, peer)
    layer = cache.layers[0]
    torch.manual_seed(0)
    prompt = torch.randn(2, 3, 100, 64)
    layer.update(prompt, prompt)
    flushed = False
    for _ in range(140):  # past one flush of the raw window into the codes
        token = torch.randn(2, 3, 1, 64)
        layer.update(token, token)
        held = peer_footprint(cache).layers[0]
        assert held.archived_tokens + held.tail_tokens == held.tokens == layer.get_seq_length()
        assert held.archive_bytes == rule_bytes(peer, 2, 3, 64, held.archived_tokens, held.tail_tokens, 4), held
        flushed |= held.tail_tokens == 0
    assert flushed and held.tail_tokens < peer.residual_length
    steady = (peer.nbits + 2 * 32 / peer.q_group_size) / 16  # codes + an fp32 scale and zero per 64, over bf16
    assert peer_footprint(cache).steady_state_ratio == pytest.approx(steady)


def test_a_peer_name_is_accepted_where_a_tier_name_is_and_is_no_tier(capsys):
    assert not set(PEERS) & set(TIERS) and run_for("hf-quanto-int4") is PEERS["hf-quanto-int4"]
    assert run_for("turbo-4") is TIERS["turbo-4"]
    with pytest.raises(ValueError, match=r"unknown tier 'nope' \(allowed tiers: native, .*peers: hf-quanto-int4"):
        run_for("nope")
    assert main(["needle", "--tiers", "hf-quanto-int5"]) == 2
    assert "peers: hf-quanto-int4, hf-quanto-int2, hf-hqq-int4" in capsys.readouterr().err
    assert chosen_tiers(["png", "hf-hqq-int4"], peers=True) == [TIERS["png"], PEERS["hf-hqq-int4"]]
    with pytest.raises(ValueError, match="allowed: native, png"):
        chosen_tiers(["hf-hqq-int4"])  # the Chat and Memory take tiers only
    with pytest.raises(ValueError, match="long text only"):
        sweep_request(None, ONE_PROMPT, None, None, None, 1, 64, "Hi", 4, ["png", "hf-quanto-int4"])


@pytest.mark.skipif(len(INSTALLED) < 2, reason="needs optimum-quanto and hqq (scripts/setup.sh --peers)")
def test_peers_ride_in_the_lockstep_batch_beside_the_tiers(loaded):
    run = measure_quality(loaded, [run_for(n) for n in ["png", *INSTALLED]], windows=2, length=40)
    rows = {r.tier: r for r in run.rows}
    assert list(rows) == ["native", "png", *INSTALLED] and not run.absent
    layers = len(loaded.info.layer_types)
    for name in INSTALLED:
        row = rows[name]
        # 20 tokens prefilled are quantized at once, the 20 decoded ones wait in the raw window (< 128)
        rule = layers * rule_bytes(PEERS[name], 1, loaded.info.num_kv_heads, loaded.info.head_dim, 20, 20, 4)
        assert (row.attention, row.archive_bytes, row.held_bytes) == ({ATTENTION: layers}, rule, rule)
        assert 0 < row.kld < 5 and 0 <= row.top1_pct <= 100 and row.steady_state_ratio < 0.32
    alone_cache = make_peer_cache(loaded, PEERS[INSTALLED[0]])
    _, (alone,) = lockstep(loaded.model, run.reference.windows, [alone_cache], reference=run.reference)
    torch.testing.assert_close(compare(run.reference, alone).kld.mean, rows[INSTALLED[0]].kld, atol=1e-4, rtol=1e-3,
                               msg="a peer's numbers do not depend on what it is batched beside")
    figure = pareto_figure(run.rows, "kld")
    peers_trace = figure.data[2]
    assert peers_trace.name.startswith("peers") and list(peers_trace.text) == INSTALLED
    assert "diamond-open" in peers_trace.marker.symbol and figure.layout.showlegend  # int2 may sit off the top
    assert set(peers_trace.marker.symbol) <= {"diamond-open", "triangle-up-open"} and figure.data[1].name == "codecs"
    assert "peers" not in " ".join(t.name for t in pareto_figure(run.rows[:2], "kld").data)


def test_absent_peers_are_a_line_each_never_an_error(loaded, hidden, tmp_path, capsys):
    run = measure_quality(loaded, [run_for(n) for n in ["png", "hf-hqq-int4", "hf-quanto-int2"]], windows=1, length=16)
    assert [r.tier for r in run.rows] == ["native", "png"]
    assert run.absent == ["hf-hqq-int4: absent, hqq is not installed (pip install 'codeckv[peers]')",
                          "hf-quanto-int2: absent, optimum-quanto is not installed (pip install 'codeckv[peers]')"]
    table = quality_table(run.rows, run.absent)["data"]
    assert table[-1][0] == "hf-quanto-int2" and table[-1][4].startswith("absent, optimum-quanto")
    with pytest.raises(ValueError, match="hqq is not installed"):
        make_peer_cache(loaded, PEERS["hf-hqq-int4"])
    args = ["quality", "--windows", "1", "--length", "16", "--tiers", "png", "hf-quanto-int4"]
    assert main([*args, "--out", str(tmp_path / "q.csv"), "--charts", str(tmp_path)]) == 0
    assert "hf-quanto-int4: absent, optimum-quanto is not installed" in capsys.readouterr().out
    grid = needle_grid(loaded, [run_for(n) for n in ["hf-quanto-int4"]], [300], [0.0])
    assert grid.tiers == ["native"] and grid.absent[0].startswith("hf-quanto-int4: absent")


@pytest.mark.skipif("hf-hqq-int4" not in INSTALLED, reason="needs hqq (scripts/setup.sh --peers)")
def test_an_odd_hqq_batch_is_a_line_not_an_error(loaded):
    # 1 x 3 x 11 tokens: odd
    run = measure_quality(loaded, [run_for(n) for n in ["png", "hf-hqq-int4"]], windows=1, length=21)
    assert [r.tier for r in run.rows] == ["native", "png"]
    assert run.absent == ["hf-hqq-int4: absent, HQQ's 4-bit packing fails on an odd number of groups (1 rows x 3 KV "
                          "heads x 11 tokens); choose an even number of windows or of tokens"]


@pytest.mark.skipif("hf-quanto-int4" not in INSTALLED, reason="needs optimum-quanto (scripts/setup.sh --peers)")
def test_a_hybrid_model_has_no_peer_rows(loaded):
    hybrid = dataclasses.replace(loaded.info, name="tiny-gemma3", layer_types=["sliding_attention", "full_attention"])
    assert absent_reason(PEERS["hf-quanto-int4"], hybrid) == (
        "hf-quanto-int4: absent, transformers' QuantizedCache takes full-attention models only and tiny-gemma3 "
        "has sliding_attention layers")
    assert absent_reason(PEERS["hf-quanto-int4"], loaded.info) is None


@pytest.mark.skipif(len(INSTALLED) < 2, reason="needs optimum-quanto and hqq (scripts/setup.sh --peers)")
def test_needle_keeps_the_cell_a_peer_fails_on(loaded):
    # 285 tokens: 1 x 3 x 285 is odd
    grid = needle_grid(loaded, [run_for(n) for n in ["hf-quanto-int4", "hf-hqq-int4"]], [300], [0.0])
    rows = {r.tier: r for r in grid.rows}
    assert rows["native"].retrieved and rows["hf-quanto-int4"].retrieved and not rows["hf-quanto-int4"].error
    assert not rows["hf-hqq-int4"].retrieved and "must match the size" in rows["hf-hqq-int4"].error


def test_codeckv_imports_and_says_why_in_a_venv_without_the_peers(fresh_env, tmp_path):
    python = fresh_env("no-peers", hide=("hqq", "optimum"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    script = ("import sys; sys.path.insert(0, sys.argv[1]); from codeckv.measure.peers import PEERS, absent_reason; "
              "print('|'.join(absent_reason(p) for p in PEERS.values()))")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout
    done = subprocess.run([python, "-c", script, root], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().split("|") == [
        "hf-quanto-int4: absent, optimum-quanto is not installed (pip install 'codeckv[peers]')",
        "hf-quanto-int2: absent, optimum-quanto is not installed (pip install 'codeckv[peers]')",
        "hf-hqq-int4: absent, hqq is not installed (pip install 'codeckv[peers]')"]
