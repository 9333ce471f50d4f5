/* codes_cpu.h: attention on stored integer codes, for the CPU, without ever writing a float row.

   A side (keys or values) of a coded span stores, per token t and channel c of a KV head,
       x[t, c] = level[code(t, c)] * scale(t, c) + offset(t, c)     (the offset optional)
   with code(t, c) the b-bit field c of the token's row (b = 2, 3, 4 or 8; the row an LSB-first bit stream:
   field c at bits [c b, (c + 1) b)), level a table (the integers for integer codes, a Lloyd-Max codebook of
   2^b levels, b <= 4, otherwise) and scale(t, c) a float16 either per channel over `group` tokens
   (scale[t / group, c]) or per token over `group` channels (scale[t, c / group]); an offset (integer codes'
   zero) is a float16 laid out as the scale. Or a side stores 8-bit floats, x[t, c] = the float of byte (t, c),
   FP8 E4M3 or E5M2 (`float8`), with no scale and no offset: the FP8 tiers' rows under their static scale of 1.
   Three entry points:

       codes_scores    out[b, h, r, t] = sum_c q[b, h, r, c] * x[t, c]      (R query rows against n tokens)
       codes_weighted  out[b, h, r, c] = sum_t w[b, h, r, t] * x[t, c]      (R weight rows over n tokens)
       codes_decode    a whole decode step: softmax(q . [x, raw keys]) @ [x, raw values], no mask

   A token's codes become levels in registers (AVX2: eight channels at a time, their fields shifted into
   eight lanes and converted, or looked up in the levels held in one or two registers; 8-bit floats widened
   to float16 bits and converted by F16C) and are used there
   by up to ROW_BLOCK rows of its KV head at once, so the memory read per token and side is its D b / 8
   bytes of codes, not 4 D bytes of float rows. The scores keep a token's sums in a vector until TOKEN_BLOCK
   tokens are done and reduce them together; per-channel scales are folded into the queries once per group.
   The offsets are added after the main loops, once per group (per channel: q . offset; the weights summed
   times the offset) or per token (per token: the sums of q over its groups times its offsets). Without AVX2,
   FMA and F16C (or built with -DCODES_PORTABLE) the same sums run as plain C loops. codes_decode runs its
   (batch, KV head) pairs on up to `threads` threads (OpenMP, in a build with -fopenmp: the libgomp torch has
   loaded, so its threads, not a second pool); codes_scores and codes_weighted run on one.
   kernels/codes_cpu.py checks shapes, dtypes and strides before calling.

   The files: codes_cpu.h (this one: the format, the types and helpers the others share), codes_cpu.c (the
   offsets, one head's products, the entry points codes_scores and codes_weighted), codes_loops_avx2.c and
   codes_loops_portable.c (the products' main loops, scores_loop and weighted_loop: one of the two builds
   them), codes_decode.c (codes_decode). kernels/codes_cpu.py compiles the .c files together.
*/
#ifndef CODES_CPU_H
#define CODES_CPU_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(CODES_PORTABLE)
#include <immintrin.h>
#define CODES_AVX2 1
#endif

#define MAX_DIM 256
#define MAX_ROWS 64
#define ROW_BLOCK 4   /* rows whose accumulators stay in registers together */
#define TOKEN_BLOCK 8 /* tokens whose score sums are reduced together */
#define INLINE static inline __attribute__((always_inline))

/* One side's codes. Strides are in elements; the last dimension of every tensor is contiguous. */
typedef struct {
    const uint8_t *codes;   /* (B, H, n, D b / 8) */
    const uint16_t *scale;  /* float16 bits: (B, H, ceil(n/group), D) per channel, (B, H, n, D/group) per token */
    const uint16_t *offset; /* float16 bits laid out as the scale, or NULL */
    const float *level;     /* (2^b,) levels, b <= 4; unused for integer codes */
    int64_t codes_b, codes_h, codes_t, scale_b, scale_h, scale_t;
    int64_t bits, group, per_channel, integer_levels, dim;
    int64_t float8;         /* FLOAT8_E4M3 or FLOAT8_E5M2: bytes that are 8-bit floats (scale NULL); else 0 */
} Side;

#define FLOAT8_E4M3 1 /* float8_e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits */
#define FLOAT8_E5M2 2 /* float8_e5m2: sign, 5 exponent bits (bias 15), 2 mantissa bits: float16's upper byte */

INLINE float half_to_float(uint16_t h) {
#ifdef CODES_AVX2
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0 && man == 0) {
        bits = sign;
    } else if (exp == 0) { /* subnormal: normalize */
        exp = 127 - 15 + 1;
        while (!(man & 0x400)) {
            man <<= 1;
            exp--;
        }
        bits = sign | (exp << 23) | ((man & 0x3FF) << 13);
    } else if (exp == 31) {
        bits = sign | 0x7F800000 | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
#endif
}

/* The float16 bits of an 8-bit float (exact: float16 holds every e4m3 and e5m2 value, e4m3's times 2^-8, its
   exponent field moved into float16's wider one with the same bits; E4M3_UNBIAS scales it back). */
#define E4M3_UNBIAS 256.0f
INLINE uint16_t float8_half(uint32_t byte, int64_t format) {
    if (format == FLOAT8_E5M2) return (uint16_t)(byte << 8);
    return (uint16_t)(((byte & 0x80) << 8) | ((byte & 0x7F) << 7));
}

INLINE float float8_value(uint32_t byte, int64_t format) {
    return half_to_float(float8_half(byte, format)) * (format == FLOAT8_E4M3 ? E4M3_UNBIAS : 1.0f);
}

/* The float16 values of one row of scales (or offsets) as floats. */
INLINE void halves(const uint16_t *row, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i++) out[i] = half_to_float(row[i]);
}

/* The scales token t needs: per channel, its group's (refreshed at a group's first token: returns 1 then,
   `next` being the next group's first token); per token, one per 8-channel chunk. */
INLINE int token_scales(const Side *s, const uint16_t *scale, int64_t t, int64_t *next, float *channel_scale,
                        float *chunk_scale) {
    if (s->float8) { /* no scale: 1 */
        for (int64_t c = 0; c < s->dim / 8; c++) chunk_scale[c] = 1.0f;
        return 0;
    }
    if (s->per_channel) {
        if (t != *next) return 0;
        halves(scale + t / s->group * s->scale_t, s->dim, channel_scale);
        *next += s->group;
        return 1;
    }
    const uint16_t *row = scale + t * s->scale_t;
    for (int64_t c = 0; c < s->dim / 8; c++) chunk_scale[c] = half_to_float(row[c * 8 / s->group]);
    return 0;
}

#ifdef CODES_AVX2
INLINE float sum1(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#endif

/* One side's call (kernels/codes_cpu.py fills the same struct). Strides are in elements. */
typedef struct {
    const float *rows;      /* q (B, H, R, D) for the scores, w (B, H, R, n) for the weighted sum */
    int64_t rows_b, rows_h, rows_r;
    const uint8_t *codes;   /* (B, H, n, D b / 8) */
    const uint16_t *scale;  /* float16 bits (Side) */
    const uint16_t *offset; /* float16 bits laid out as the scale, or NULL */
    const float *level;     /* (2^b,) float32 levels, or NULL for integer codes */
    int64_t codes_b, codes_h, codes_t, scale_b, scale_h, scale_t;
    int64_t bits, group, per_channel;
    float *out;             /* (B, H, R, n) scores or (B, H, R, D) weighted sums, contiguous */
    int64_t batch, heads, nrows, tokens, dim;
    int64_t float8;         /* Side's: 8-bit floats (bits 8, scale, offset and level NULL, per token), or 0 */
} CodesCall;

/* Defined in codes_cpu.c. */
int refused(const CodesCall *c);
Side side_of(const CodesCall *c);
void head_scores(const Side *s, int64_t b, int64_t h, const float *q, int64_t q_r, int64_t rows, int64_t tokens,
                 float *out, int64_t stride);
void head_weighted(const Side *s, int64_t b, int64_t h, const float *w, int64_t w_r, int64_t rows, int64_t tokens,
                   float *acc);

/* Defined in codes_loops_avx2.c or codes_loops_portable.c: offsets left out (head_scores adds them). */
void scores_loop(const Side *s, const uint8_t *ch, const uint16_t *sh, const float *q, int64_t q_r, int64_t rows,
                 int64_t tokens, float *out, int64_t stride);
void weighted_loop(const Side *s, const uint8_t *ch, const uint16_t *sh, const float *wh, int64_t w_r, int64_t rows,
                   int64_t tokens, float *acc);

#endif
