"""codes_cpu: the compiled CPU kernel against its torch reference (the rows the codec decodes, then a matmul).

Both builds are checked where a C compiler is found: the one the ops use (AVX2 where the CPU has it) and
the plain C loops (-DCODES_PORTABLE, what a CPU without AVX2 runs). Odd shapes: 1 row, rows past a
register block, partial token blocks and groups, strided slices of a larger archive, batch 2.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from codeckv.codecs.lloyd_max import LloydMaxQuant
from codeckv.codecs.quant import GroupQuant
from codeckv.tiers import TIERS
from kernels import ans_cpu, codes_cpu
from kernels import decode_attention_torch as dat
from kernels.codes_cpu import (
    FLAGS,
    build,
    codes_decode,
    codes_scores,
    codes_status,
    codes_supported,
    codes_weighted,
    float8_supported,
)
from kernels.decode_attention import decode_attention_ref
from kernels.decode_attention_torch import decode_attention_torch, decode_attention_torch_compiled
from kernels.layout import layout_of, rows
from kernels.segments import Coded, Raw

BUILDS = {"ops": FLAGS, "portable": (*FLAGS, "-DCODES_PORTABLE")}
SIDES = {
    "integer codes per channel (turbo-4 keys)": GroupQuant(bits=4, group=32, per_channel=True),
    "Lloyd-Max per token (turbo-4 values)": LloydMaxQuant(bits=4, group=32),
    "integer codes per token, group 16": GroupQuant(bits=4, group=16),
    "Lloyd-Max per channel, group 8": LloydMaxQuant(bits=4, group=8, per_channel=True),
    "3-bit integer codes per channel (turbo-3 keys)": GroupQuant(bits=3, group=32, per_channel=True),
    "3-bit Lloyd-Max per token (turbo-3 values)": LloydMaxQuant(bits=3, group=32),
    "2-bit Lloyd-Max per token (turbo-k4v2 values)": LloydMaxQuant(bits=2, group=32),
    "2-bit integer codes per token, group 8": GroupQuant(bits=2, group=8),
    "8-bit integer codes per token (int8)": GroupQuant(bits=8, group=32),
}
SHAPES = [  # (batch, heads, rows, tokens, head_dim)
    (1, 3, 3, 4096, 64),
    (1, 1, 1, 1, 32),
    (2, 2, 5, 77, 96),
    (1, 4, 9, 200, 128),
    (1, 1, 64, 40, 256),
]


@pytest.fixture(params=sorted(BUILDS))
def kernel(request, monkeypatch):
    """Each build in turn, as the one the launcher calls."""
    lib, status = build(BUILDS[request.param])
    if lib is None:
        pytest.skip(f"no compiled kernel here: {status}")
    monkeypatch.setattr(codes_cpu, "_library", lambda: (lib, status))
    return request.param


def _stored(codec, shape, seed=0):
    """(codes, scale, offset or None, reference rows) of `shape`'s n tokens: a per-channel codec encodes
    whole groups and the first n tokens are sliced from them (a partial last group)."""
    torch.manual_seed(seed)
    b, h, _, n, d = shape
    layout = layout_of(codec)
    spec = layout.quant
    whole = -(-n // codec.block_tokens) * codec.block_tokens
    enc = codec.encode(torch.randn(b, h, whole, d) * torch.linspace(0.2, 3.0, d) + torch.linspace(-1.0, 2.0, d))
    span = slice(0, -(-n // spec.group)) if spec.per_channel else slice(0, n)
    offset = enc.data[spec.offset][:, :, span] if spec.offset else None
    return enc.data["codes"][:, :, :n], enc.data["scale"][:, :, span], offset, rows(layout, enc, 0, whole)[:, :, :n]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("side", sorted(SIDES))
def test_products_on_the_codes_match_the_decoded_rows(kernel, side, shape):
    codec = SIDES[side]
    b, h, r, n, d = shape
    codes, scale, offset, x = _stored(codec, shape)
    spec = layout_of(codec).quant
    q, w = torch.randn(b, h, r, d), torch.rand(b, h, r, n)
    got = codes_scores(q, codes, scale, spec, offset)
    torch.testing.assert_close(got, q @ x.transpose(2, 3), atol=2e-4 * d**0.5, rtol=1e-4,
                               msg=f"{kernel} build: scores of {side} {shape}")
    got = codes_weighted(w, codes, scale, spec, offset)
    torch.testing.assert_close(got, w @ x, atol=2e-4 * n**0.5, rtol=1e-4,
                               msg=f"{kernel} build: weighted sum of {side} {shape}")


def test_strided_slices_of_a_larger_archive(kernel):
    """A piece of a capacity-doubled archive: codes and scales sliced along the sequence, weights a column slice."""
    codec = SIDES["integer codes per channel (turbo-4 keys)"]
    codes, scale, offset, x = _stored(codec, (1, 3, 3, 256, 64))
    spec = layout_of(codec).quant
    codes, scale, offset = codes[:, :, 64:160], scale[:, :, 2:5], offset[:, :, 2:5]
    q = torch.randn(1, 3, 8, 64)[:, :, ::2]  # a row stride of 2 rows
    w = torch.rand(1, 3, 3, 300)[..., 10:106]
    torch.testing.assert_close(codes_scores(q, codes, scale, spec, offset), q @ x[:, :, 64:160].transpose(2, 3),
                               atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(codes_weighted(w, codes, scale, spec, offset), w @ x[:, :, 64:160],
                               atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("tier", ["turbo-4", "rotated-4", "turbo-3", "int8", "turbo-k4v2"])
def test_attention_with_the_kernel_matches_the_reference(kernel, tier):
    """decode_attention_torch with both sides on the kernel, raw spans around, and a mask, against the reference."""
    tier_def = TIERS[tier]
    torch.manual_seed(1)
    k, v = torch.randn(1, 3, 320, 64), torch.randn(1, 3, 320, 64)
    coded = Coded(tier_def.key, tier_def.key.encode(k), tier_def.value, tier_def.value.encode(v))
    segments = [Raw(torch.randn(1, 3, 4, 64), torch.randn(1, 3, 4, 64)), coded,
                Raw(torch.randn(1, 3, 7, 64), torch.randn(1, 3, 7, 64))]
    assert decode_attention_torch_compiled(coded, 64, query_rows=3) == (True, True)
    for t in (1, 2):
        query = torch.randn(1, 9, t, 64)
        mask = torch.ones(1, 1, t, 331, dtype=torch.bool)
        mask[..., 2:9] = False
        for m in (None, mask):
            torch.testing.assert_close(decode_attention_torch(query, segments, mask=m),
                                       decode_attention_ref(query, segments, mask=m), atol=2e-5, rtol=1e-4,
                                       msg=f"{kernel} build, {tier}, T={t}, mask={m is not None}")


@pytest.mark.parametrize("tier, rows, raw_spans, head_dim", [
    ("turbo-4", 3, 2, 64), ("rotated-4", 1, 4, 64), ("turbo-4", 9, 0, 128), ("rotated-4", 64, 1, 32),
    ("turbo-3", 4, 1, 64), ("int8", 2, 2, 96),
])
def test_a_whole_decode_step_matches_the_reference(kernel, tier, rows, raw_spans, head_dim):
    """codes_decode (scores, softmax and weighted values in one call) against decode_attention_ref."""
    codecs = TIERS[tier]
    torch.manual_seed(2)
    k, v = torch.randn(2, 2, 96, head_dim), torch.randn(2, 2, 96, head_dim) + 0.5
    coded = Coded(codecs.key, codecs.key.encode(k), codecs.value, codecs.value.encode(v))
    raws = [Raw(torch.randn(2, 2, n, head_dim), torch.randn(2, 2, n, head_dim)) for n in (3, 1, 7, 2)[:raw_spans]]
    segments = raws[:1] + [coded] + raws[1:]
    query = torch.randn(2, 2 * rows, 1, head_dim)
    want = decode_attention_ref(query, segments)
    b, hkv, d = 2, 2, head_dim
    q = (query * d**-0.5).reshape(b, hkv, rows, d)
    got = dat._whole_step(q, segments, None)
    assert got is not None, "one coded span both of whose sides the kernel reads: the whole step in one call"
    torch.testing.assert_close(got.reshape(query.shape), want, atol=2e-5, rtol=1e-4, msg=f"{kernel} build")
    hides_nothing = torch.ones(2, 1, 1, sum(s.tokens for s in segments), dtype=torch.bool)
    torch.testing.assert_close(decode_attention_torch(query, segments, mask=hides_nothing), want, atol=2e-5,
                               rtol=1e-4)


@pytest.mark.parametrize("tier", ["turbo-4", "int8", "fp8-e4m3"])
def test_a_whole_step_on_two_threads_is_the_same_step(kernel, tier, monkeypatch):
    """codes_decode runs its (batch, head) pairs on torch's threads (OpenMP in the build): each pair's sums are its
    own, in the same order on any thread, so one thread and two give the same bits, batch 2 and heads 3 included
    (an odd count of pairs per thread)."""
    codecs = TIERS[tier]
    torch.manual_seed(4)
    k, v = torch.randn(2, 3, 320, 64), torch.randn(2, 3, 320, 64)
    coded = Coded(codecs.key, codecs.key.encode(k), codecs.value, codecs.value.encode(v))
    segments = [Raw(torch.randn(2, 3, 4, 64), torch.randn(2, 3, 4, 64)), coded]
    q = torch.randn(2, 3, 7, 64) * 0.125
    steps = {}
    for threads in (1, 2):
        monkeypatch.setattr(torch, "get_num_threads", lambda threads=threads: threads)
        steps[threads] = dat._whole_step(q, segments, None)
    assert steps[1] is not None and torch.equal(steps[1], steps[2]), f"{kernel} build, {tier}"


def test_the_kernel_shares_torchs_openmp_runtime(kernel):
    """The OpenMP build links libgomp by its soname, which the loader resolves to the copy torch has loaded: one
    runtime in the process, so the kernel's threads are torch's (a second pool would contend with them)."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        pytest.skip("no /proc/self/maps here (not Linux)")
    mapped = {line.split()[-1] for line in maps.read_text().splitlines() if "libgomp" in line.split()[-1]}
    assert len(mapped) <= 1, f"two OpenMP runtimes loaded: {mapped}"
    if codes_cpu.OPENMP in codes_cpu._library()[1]:
        assert len(mapped) == 1, "a build with OpenMP runs on a libgomp: none is mapped"


def test_a_compiler_without_openmp_builds_it_single_threaded(monkeypatch):
    """The build with OpenMP fails (a compiler without it): the kernel is built without and runs on one thread."""
    plain = tuple(f for f in FLAGS if f != codes_cpu.OPENMP)
    assert codes_cpu.OPENMP in FLAGS and plain != FLAGS
    monkeypatch.setattr(codes_cpu, "build", lambda flags: (None, "torch (no OpenMP)") if codes_cpu.OPENMP in flags
                        else ("plain build", "compiled C (plain)"))
    assert codes_cpu._library() == ("plain build", "compiled C (plain)")
    if build(FLAGS)[0] is not None:
        assert build(FLAGS)[1].endswith(f"-march=native {codes_cpu.OPENMP})"), build(FLAGS)[1]


def test_a_whole_step_falls_back_where_it_does_not_apply(kernel):
    codecs = TIERS["turbo-4"]
    k, v = torch.randn(1, 1, 64, 64), torch.randn(1, 1, 64, 64)
    coded = Coded(codecs.key, codecs.key.encode(k), codecs.value, codecs.value.encode(v))
    raw = Raw(torch.randn(1, 1, 2, 64), torch.randn(1, 1, 2, 64))
    q = torch.randn(1, 1, 1, 64)
    assert dat._whole_step(q, [coded] + [raw] * (codes_cpu.MAX_RAW + 1), None) is None, "too many raw spans"
    assert dat._whole_step(q, [coded, coded], None) is None, "two coded spans"
    mask = torch.ones(1, 1, 1, 66, dtype=torch.bool)
    mask[..., 0] = False
    assert dat._whole_step(q, [coded, raw], mask) is None, "a mask that hides a token"
    jpeg = TIERS["jpeg-k8-int8"]
    coded_dct = Coded(jpeg.key, jpeg.key.encode(k), jpeg.value, jpeg.value.encode(v))
    assert dat._whole_step(q, [coded_dct, raw], None) is None, "DCT coefficients"
    query = torch.randn(1, 1, 1, 64)
    torch.testing.assert_close(decode_attention_torch(query, [coded, raw], mask=mask),
                               decode_attention_ref(query, [coded, raw], mask=mask), atol=2e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="at most 4"):
        codes_decode(q, q, (), (), [(raw.keys, raw.values)] * 5, None)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
def test_rows_of_8_bit_floats_read_exactly(kernel, dtype):
    """Every byte of FP8 rows (an fp8 tier at scale 1) becomes the float torch casts it to, exactly: a query that
    is one channel's indicator reads each stored value back; products as the cast rows' matmul."""
    every = torch.arange(256, dtype=torch.uint8).view(dtype)
    every = torch.where(torch.isfinite(every.float()), every.float(), 0.0).to(dtype)  # NaN / inf bytes never stored
    rows = every.view(1, 1, 4, 64)  # four tokens of 64 channels hold all 256 bytes
    got = codes_scores(torch.eye(64).view(1, 1, 64, 64), rows, None, None)
    assert torch.equal(got[0, 0].T, rows.float()[0, 0]), f"{kernel} build: an 8-bit float read back differs"
    for b, h, r, n, d in SHAPES:
        torch.manual_seed(3)
        x = (torch.randn(b, h, n, d) * torch.logspace(-3, 2, d)).clamp(-400, 400).to(dtype)
        q, w = torch.randn(b, h, r, d), torch.rand(b, h, r, n)
        torch.testing.assert_close(codes_scores(q, x, None, None), q @ x.float().transpose(2, 3),
                                   atol=2e-4 * d**0.5, rtol=1e-4, msg=f"{kernel} build: scores {dtype}")
        torch.testing.assert_close(codes_weighted(w, x, None, None), w @ x.float(), atol=2e-4 * n**0.5, rtol=1e-4,
                                   msg=f"{kernel} build: weighted sum {dtype}")


@pytest.mark.parametrize("tier", ["fp8-e4m3", "fp8-e5m2"])
def test_an_fp8_tier_decodes_on_its_bytes(kernel, tier):
    """Both sides of an FP8 tier at scale 1 are read by the kernel, the whole step in one call, as the reference."""
    codecs = TIERS[tier]
    torch.manual_seed(4)
    k, v = torch.randn(1, 2, 200, 64) * 4, torch.randn(1, 2, 200, 64)
    coded = Coded(codecs.key, codecs.key.encode(k), codecs.value, codecs.value.encode(v))
    raw = Raw(torch.randn(1, 2, 5, 64), torch.randn(1, 2, 5, 64))
    assert decode_attention_torch_compiled(coded, 64, query_rows=7) == (True, True)
    query = torch.randn(1, 14, 1, 64)
    q = (query * 64**-0.5).reshape(1, 2, 7, 64)
    assert dat._whole_step(q, [raw, coded], None) is not None
    torch.testing.assert_close(decode_attention_torch(query, [raw, coded]), decode_attention_ref(query, [raw, coded]),
                               atol=2e-5, rtol=1e-4, msg=f"{kernel} build, {tier}")


def test_which_sides_it_takes():
    spec = layout_of(TIERS["turbo-4"].value).quant
    assert not codes_supported(None, 64, 3), "DCT coefficients or raw rows: no quantized rows to read"
    assert not codes_supported(layout_of(LloydMaxQuant(bits=8, group=32)).quant, 64, 3), "8-bit Lloyd-Max"
    assert not codes_supported(spec, 64, codes_cpu.MAX_ROWS + 1), "a long prefill chunk's rows: torch matmuls"
    assert not codes_supported(spec, 40, 3), "head_dim not a multiple of 16"
    built = build(FLAGS)[0] is not None
    assert codes_supported(spec, 64, 3) == built and codes_supported(spec, 256, 64) == built
    assert float8_supported(torch.float8_e4m3fn, 64, 3) == built and float8_supported(torch.float8_e5m2, 64, 3) == built
    assert not float8_supported(torch.bfloat16, 64, 3), "raw bf16 rows: a cast, no kernel"
    assert not float8_supported(torch.float8_e4m3fn, 40, 3) and not float8_supported(torch.float8_e4m3fn, 64, 65)


def test_no_compiler_or_disabled_means_the_torch_path(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    status = build((*FLAGS, "-DCODES_TEST_NO_COMPILER"))
    assert status == (None, "torch (no C compiler: install gcc or clang, or set CC)")
    monkeypatch.setenv(codes_cpu.DISABLE_VARIABLE, "0")
    assert codes_status() == f"torch ({codes_cpu.DISABLE_VARIABLE}=0)"
    assert not codes_supported(layout_of(TIERS["turbo-4"].value).quant, 64, 3)
    with pytest.raises(RuntimeError, match="not built here"):
        codes_scores(torch.zeros(1, 1, 1, 16), torch.zeros(1, 1, 1, 8, dtype=torch.uint8),
                      torch.zeros(1, 1, 1, 1, dtype=torch.float16), layout_of(LloydMaxQuant(bits=4, group=16)).quant)


def test_a_failed_build_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv("CODECKV_CACHE", str(tmp_path))
    lib, status = build((*FLAGS, "-DCODES_TEST_FAILS", "-Werror=this-flag-does-not-exist"))
    assert lib is None and status.startswith("torch (building codes_cpu failed:"), status


def test_the_build_reads_every_c_file_and_the_header(monkeypatch, tmp_path):
    """Every .c and .h file in kernels/ is compiled (here, or in the PCA coder's library); without one (an install
    that lost the header) the torch path."""
    folder = codes_cpu.SOURCE.parent
    assert {*codes_cpu.SOURCES, codes_cpu.HEADER, ans_cpu.SOURCE} == {*folder.glob("*.c"), *folder.glob("*.h")}
    monkeypatch.setattr(codes_cpu, "HEADER", tmp_path / "codes_cpu.h")
    lib, status = build((*FLAGS, "-DCODES_TEST_NO_HEADER"))
    assert lib is None and status.startswith("torch (codes_cpu's sources are incomplete here"), status


def test_wrong_tensors_are_refused(kernel):
    spec = layout_of(LloydMaxQuant(bits=4, group=32)).quant
    codes, scale = torch.zeros(1, 1, 4, 32, dtype=torch.uint8), torch.zeros(1, 1, 4, 2, dtype=torch.float16)
    with pytest.raises(ValueError, match="uint8 codes and float16 scale"):
        codes_scores(torch.zeros(1, 1, 1, 64), codes, scale.float(), spec)
    with pytest.raises(ValueError, match="uint8 codes and float16 scale"):
        codes_scores(torch.zeros(1, 1, 1, 64), codes, scale[:, :, :3], spec)
    with pytest.raises(ValueError, match="uint8 codes and float16 scale"):
        codes_scores(torch.zeros(1, 1, 1, 64), codes, scale, spec, offset=scale[:, :, :3])
    with pytest.raises(ValueError, match="refused 4-bit codes, group 32, head_dim 64"):
        codes_scores(torch.zeros(1, 1, codes_cpu.MAX_ROWS + 1, 64), codes, scale, spec)
    fp8 = torch.zeros(1, 1, 4, 64, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="8-bit floats .* without scale or offset"):
        codes_scores(torch.zeros(1, 1, 1, 64), fp8, scale, None)
    with pytest.raises(ValueError, match="must be 8-bit floats"):
        codes_scores(torch.zeros(1, 1, 1, 64), codes, None, None)
    with pytest.raises(ValueError, match="refused torch.float8_e4m3fn rows, head_dim 64"):
        codes_weighted(torch.zeros(1, 1, codes_cpu.MAX_ROWS + 1, 4), fp8, None, None)
