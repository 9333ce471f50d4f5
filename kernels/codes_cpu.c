/* codes_cpu.c: attention on stored integer codes, for the CPU, without ever writing a float row.

   A side (keys or values) of a coded span stores, per token t and channel c of a KV head,
       x[t, c] = level[code(t, c)] * scale(t, c) + offset(t, c)     (the offset optional)
   with code(t, c) the b-bit field c of the token's row (b = 2, 3, 4 or 8; the row an LSB-first bit stream:
   field c at bits [c b, (c + 1) b)), level a table (the integers for integer codes, a Lloyd-Max codebook of
   2^b levels, b <= 4, otherwise) and scale(t, c) a float16 either per channel over `group` tokens
   (scale[t / group, c]) or per token over `group` channels (scale[t, c / group]); an offset (integer codes'
   zero) is a float16 laid out as the scale. Three entry points:

       codes_scores    out[b, h, r, t] = sum_c q[b, h, r, c] * x[t, c]      (R query rows against n tokens)
       codes_weighted  out[b, h, r, c] = sum_t w[b, h, r, t] * x[t, c]      (R weight rows over n tokens)
       codes_decode    a whole decode step: softmax(q . [x, raw keys]) @ [x, raw values], no mask

   A token's codes become levels in registers (AVX2: eight channels at a time, their fields shifted into
   eight lanes and converted, or looked up in the levels held in one or two registers) and are used there
   by up to ROW_BLOCK rows of its KV head at once, so the memory read per token and side is its D b / 8
   bytes of codes, not 4 D bytes of float rows. The scores keep a token's sums in a vector until TOKEN_BLOCK
   tokens are done and reduce them together; per-channel scales are folded into the queries once per group.
   The offsets are added after the main loops, once per group (per channel: q . offset; the weights summed
   times the offset) or per token (per token: the sums of q over its groups times its offsets). Without AVX2,
   FMA and F16C (or built with -DCODES_PORTABLE) the same sums run as plain C loops. Single-threaded;
   kernels/codes_cpu.py checks shapes, dtypes and strides before calling.
*/
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
} Side;

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

/* The float16 values of one row of scales (or offsets) as floats. */
INLINE void halves(const uint16_t *row, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i++) out[i] = half_to_float(row[i]);
}

/* The scales token t needs: per channel, its group's (refreshed at a group's first token: returns 1 then,
   `next` being the next group's first token); per token, one per 8-channel chunk. */
INLINE int token_scales(const Side *s, const uint16_t *scale, int64_t t, int64_t *next, float *channel_scale,
                        float *chunk_scale) {
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

/* Scores += q . offset: per channel once per token group, per token from the sums of q over each group. */
static void add_score_offsets(const Side *s, const uint16_t *oh, const float *q, int64_t q_r, int64_t rows,
                              int64_t tokens, float *out, int64_t stride) {
    int64_t dim = s->dim, groups = dim / s->group;
    float offset[MAX_DIM];
    if (s->per_channel) {
        for (int64_t g0 = 0; g0 < tokens; g0 += s->group) {
            halves(oh + g0 / s->group * s->scale_t, dim, offset);
            int64_t g1 = g0 + s->group < tokens ? g0 + s->group : tokens;
            for (int64_t r = 0; r < rows; r++) {
                float bias = 0.0f;
                for (int64_t c = 0; c < dim; c++) bias += q[r * q_r + c] * offset[c];
                for (int64_t t = g0; t < g1; t++) out[r * stride + t] += bias;
            }
        }
        return;
    }
    float qsum[MAX_ROWS * (MAX_DIM / 8)];
    for (int64_t r = 0; r < rows; r++)
        for (int64_t g = 0; g < groups; g++) {
            float sum = 0.0f;
            for (int64_t c = g * s->group; c < (g + 1) * s->group; c++) sum += q[r * q_r + c];
            qsum[r * groups + g] = sum;
        }
    for (int64_t t = 0; t < tokens; t++) {
        halves(oh + t * s->scale_t, groups, offset);
        for (int64_t r = 0; r < rows; r++) {
            float bias = 0.0f;
            for (int64_t g = 0; g < groups; g++) bias += qsum[r * groups + g] * offset[g];
            out[r * stride + t] += bias;
        }
    }
}

/* acc += w . offset: per channel the weights summed over each token group, per token over each token's groups. */
static void add_weighted_offsets(const Side *s, const uint16_t *oh, const float *wh, int64_t w_r, int64_t rows,
                                 int64_t tokens, float *acc) {
    int64_t dim = s->dim, groups = dim / s->group;
    float offset[MAX_DIM];
    if (s->per_channel) {
        for (int64_t g0 = 0; g0 < tokens; g0 += s->group) {
            halves(oh + g0 / s->group * s->scale_t, dim, offset);
            int64_t g1 = g0 + s->group < tokens ? g0 + s->group : tokens;
            for (int64_t r = 0; r < rows; r++) {
                float wsum = 0.0f;
                for (int64_t t = g0; t < g1; t++) wsum += wh[r * w_r + t];
                for (int64_t c = 0; c < dim; c++) acc[r * dim + c] += wsum * offset[c];
            }
        }
        return;
    }
    for (int64_t r = 0; r < rows; r++) {
        float z[MAX_DIM / 8] = {0};
        for (int64_t t = 0; t < tokens; t++) {
            halves(oh + t * s->scale_t, groups, offset);
            float wt = wh[r * w_r + t];
            for (int64_t g = 0; g < groups; g++) z[g] += wt * offset[g];
        }
        for (int64_t c = 0; c < dim; c++) acc[r * dim + c] += z[c / s->group];
    }
}

/* ---------------------------------------------------------------- portable C */
#ifndef CODES_AVX2

/* Field c of a row of b-bit codes (a field spans at most two bytes). */
static inline uint32_t field(const uint8_t *row, int64_t c, int64_t bits) {
    int64_t at = c * bits, byte = at / 8, shift = at % 8;
    uint32_t word = row[byte];
    if (shift + bits > 8) word |= (uint32_t)row[byte + 1] << 8;
    return (word >> shift) & ((1u << bits) - 1);
}

/* Token t's values x[c] (without offsets). */
static void token_values(const Side *s, const uint8_t *codes, const float *channel_scale, const float *chunk_scale,
                         float *x) {
    for (int64_t c = 0; c < s->dim; c++) {
        uint32_t code = field(codes, c, s->bits);
        float level = s->integer_levels ? (float)code : s->level[code];
        x[c] = level * (s->per_channel ? channel_scale[c] : chunk_scale[c / 8]);
    }
}

static void scores_portable(const Side *s, const uint8_t *ch, const uint16_t *sh, const float *q, int64_t q_r,
                            int64_t rows, int64_t tokens, float *out, int64_t stride) {
    float channel_scale[MAX_DIM], chunk_scale[MAX_DIM / 8], x[MAX_DIM];
    int64_t next = 0;
    for (int64_t t = 0; t < tokens; t++) {
        token_scales(s, sh, t, &next, channel_scale, chunk_scale);
        token_values(s, ch + t * s->codes_t, channel_scale, chunk_scale, x);
        for (int64_t r = 0; r < rows; r++) {
            float acc = 0.0f;
            for (int64_t c = 0; c < s->dim; c++) acc += q[r * q_r + c] * x[c];
            out[r * stride + t] = acc;
        }
    }
}

static void weighted_portable(const Side *s, const uint8_t *ch, const uint16_t *sh, const float *wh, int64_t w_r,
                              int64_t rows, int64_t tokens, float *acc) {
    float channel_scale[MAX_DIM], chunk_scale[MAX_DIM / 8], x[MAX_DIM];
    int64_t next = 0;
    for (int64_t t = 0; t < tokens; t++) {
        token_scales(s, sh, t, &next, channel_scale, chunk_scale);
        token_values(s, ch + t * s->codes_t, channel_scale, chunk_scale, x);
        for (int64_t r = 0; r < rows; r++) {
            float wt = wh[r * w_r + t];
            for (int64_t c = 0; c < s->dim; c++) acc[r * s->dim + c] += wt * x[c];
        }
    }
}

#else
/* ---------------------------------------------------------------- AVX2 */

/* What chunk_levels needs besides the row: the levels in two registers, each lane's shift and the field mask. */
typedef struct {
    __m256 lo_levels, hi_levels;
    __m256i shifts, mask;
} Unpack;

INLINE Unpack unpack_of(const Side *s) {
    float table[16] = {0};
    if (!s->integer_levels) memcpy(table, s->level, sizeof(float) * ((size_t)1 << s->bits));
    Unpack u = {_mm256_loadu_ps(table), _mm256_loadu_ps(table + 8),
                _mm256_setr_epi32(0, (int)s->bits, 2 * (int)s->bits, 3 * (int)s->bits, 4 * (int)s->bits,
                                  5 * (int)s->bits, 6 * (int)s->bits, 7 * (int)s->bits),
                _mm256_set1_epi32((1 << s->bits) - 1)};
    return u;
}

/* Channels j..j+7 of a token's row as 8 unscaled levels (j a multiple of 8); `bits` and `lut` (a codebook,
   not integer codes) are constants in every copy the callers make, so no test of them runs per chunk. */
INLINE __m256 chunk_levels(const Unpack *u, const uint8_t *row, int64_t j, const int bits, const int lut) {
    __m256i idx;
    if (bits == 8) {
        idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row + j)));
    } else { /* the chunk's b bytes broadcast to every lane (a load of b bytes), each lane shifted to its field */
        const uint8_t *at = row + j * bits / 8;
        __m256i word;
        if (bits == 4) {
            word = _mm256_castps_si256(_mm256_broadcast_ss((const float *)at));
        } else if (bits == 2) {
            int16_t half;
            memcpy(&half, at, 2);
            word = _mm256_set1_epi16(half); /* the low 16 bits of every lane hold the 8 fields */
        } else {
            uint16_t low;
            memcpy(&low, at, 2);
            word = _mm256_set1_epi32((int)(low | (uint32_t)at[2] << 16));
        }
        idx = _mm256_and_si256(_mm256_srlv_epi32(word, u->shifts), u->mask);
    }
    if (!lut) return _mm256_cvtepi32_ps(idx);
    __m256 from_lo = _mm256_permutevar8x32_ps(u->lo_levels, idx); /* the low 3 bits pick a lane */
    if (bits < 4) return from_lo;
    __m256 from_hi = _mm256_permutevar8x32_ps(u->hi_levels, idx); /* bit 3 picks the register */
    return _mm256_blendv_ps(from_lo, from_hi, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
}

/* Eight vectors' sums as one vector: lane i is the sum of v[i]. */
INLINE __m256 sum8(const __m256 *v) {
    __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
}

INLINE float sum1(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* Scores of `nr` (<= ROW_BLOCK) query rows for every token into out (row stride `stride`). */
INLINE void scores_block(const Side *s, const uint8_t *ch, const uint16_t *sh, const float *q, int64_t q_r,
                         const int nr, int64_t tokens, float *out, int64_t stride, const int bits, const int lut) {
    const Unpack u = unpack_of(s);
    float channel_scale[MAX_DIM], chunk_scale[MAX_DIM / 8], scaled_q[ROW_BLOCK * MAX_DIM];
    __m256 sums[ROW_BLOCK][TOKEN_BLOCK];
    const float *qr[ROW_BLOCK];
    for (int r = 0; r < nr; r++) qr[r] = s->per_channel ? scaled_q + r * s->dim : q + r * q_r;
    int64_t next = 0;
    for (int64_t t = 0; t < tokens; t++) {
        if (token_scales(s, sh, t, &next, channel_scale, chunk_scale)) /* fold the group's scales into q */
            for (int r = 0; r < nr; r++)
                for (int64_t c = 0; c < s->dim; c++) scaled_q[r * s->dim + c] = q[r * q_r + c] * channel_scale[c];
        const uint8_t *row = ch + t * s->codes_t;
        __m256 acc[ROW_BLOCK];
        for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
        for (int64_t j = 0; j < s->dim; j += 8) {
            __m256 x = chunk_levels(&u, row, j, bits, lut);
            if (!s->per_channel) x = _mm256_mul_ps(x, _mm256_broadcast_ss(chunk_scale + j / 8));
            for (int r = 0; r < nr; r++) acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(qr[r] + j), x, acc[r]);
        }
        int64_t slot = t % TOKEN_BLOCK;
        for (int r = 0; r < nr; r++) sums[r][slot] = acc[r];
        if (slot == TOKEN_BLOCK - 1)
            for (int r = 0; r < nr; r++) _mm256_storeu_ps(out + r * stride + t - slot, sum8(sums[r]));
    }
    for (int64_t t = tokens / TOKEN_BLOCK * TOKEN_BLOCK; t < tokens; t++) /* the last, partial block */
        for (int r = 0; r < nr; r++) out[r * stride + t] = sum1(sums[r][t % TOKEN_BLOCK]);
}

/* One copy of `body(bits, lut)` per kind of codes, so that each has its constants (chunk_levels). */
#define PER_KIND(body)                                                                                            \
    switch (s->bits * 2 + !s->integer_levels) {                                                                   \
    case 4: body(2, 0); break;                                                                                    \
    case 5: body(2, 1); break;                                                                                    \
    case 6: body(3, 0); break;                                                                                    \
    case 7: body(3, 1); break;                                                                                    \
    case 8: body(4, 0); break;                                                                                    \
    case 9: body(4, 1); break;                                                                                    \
    default: body(8, 0); break;                                                                                   \
    }

/* One copy of `body(nr)` per row count of a block (1 to ROW_BLOCK). */
#define PER_ROWS(n, body)                                                                                         \
    switch (n) {                                                                                                  \
    case 1: body(1); break;                                                                                       \
    case 2: body(2); break;                                                                                       \
    case 3: body(3); break;                                                                                       \
    default: body(4); break;                                                                                      \
    }

static void scores_avx2(const Side *s, const uint8_t *ch, const uint16_t *sh, const float *q, int64_t q_r,
                        int64_t rows, int64_t tokens, float *out, int64_t stride) {
    for (int64_t r0 = 0; r0 < rows; r0 += ROW_BLOCK) {
        const float *qb = q + r0 * q_r;
        float *o = out + r0 * stride;
        int64_t n = rows - r0 < ROW_BLOCK ? rows - r0 : ROW_BLOCK;
#define SCORES(bits, lut) PER_ROWS(n, SCORES_ROWS_##bits##_##lut)
#define SCORES_ROWS(nr, bits, lut) scores_block(s, ch, sh, qb, q_r, nr, tokens, o, stride, bits, lut)
#define SCORES_ROWS_2_0(nr) SCORES_ROWS(nr, 2, 0)
#define SCORES_ROWS_2_1(nr) SCORES_ROWS(nr, 2, 1)
#define SCORES_ROWS_3_0(nr) SCORES_ROWS(nr, 3, 0)
#define SCORES_ROWS_3_1(nr) SCORES_ROWS(nr, 3, 1)
#define SCORES_ROWS_4_0(nr) SCORES_ROWS(nr, 4, 0)
#define SCORES_ROWS_4_1(nr) SCORES_ROWS(nr, 4, 1)
#define SCORES_ROWS_8_0(nr) SCORES_ROWS(nr, 8, 0)
        PER_KIND(SCORES)
    }
}

/* acc (nr rows) = w rows . every token's values, 16 channels (two chunks) at a time. */
INLINE void weighted_block(const Side *s, const uint8_t *ch, const uint16_t *sh, const float *wh, int64_t w_r,
                           const int nr, int64_t tokens, float *acc, const int bits, const int lut) {
    const Unpack u = unpack_of(s);
    for (int64_t j = 0; j < s->dim; j += 16) {
        __m256 sum_a[ROW_BLOCK], sum_b[ROW_BLOCK], scale_a = _mm256_setzero_ps(), scale_b = scale_a;
        for (int r = 0; r < nr; r++) sum_a[r] = sum_b[r] = _mm256_setzero_ps();
        const uint16_t *scale_ga = sh + j / s->group, *scale_gb = sh + (j + 8) / s->group; /* per token */
        for (int64_t t = 0; t < tokens; t++) {
            if (s->per_channel && t % s->group == 0) { /* these 16 channels' scales of the token group */
                float lanes[16];
                halves(sh + t / s->group * s->scale_t + j, 16, lanes);
                scale_a = _mm256_loadu_ps(lanes);
                scale_b = _mm256_loadu_ps(lanes + 8);
            } else if (!s->per_channel) {
                scale_a = _mm256_set1_ps(half_to_float(scale_ga[t * s->scale_t]));
                scale_b = _mm256_set1_ps(half_to_float(scale_gb[t * s->scale_t]));
            }
            const uint8_t *row = ch + t * s->codes_t;
            __m256 a = _mm256_mul_ps(chunk_levels(&u, row, j, bits, lut), scale_a);
            __m256 b = _mm256_mul_ps(chunk_levels(&u, row, j + 8, bits, lut), scale_b);
            for (int r = 0; r < nr; r++) {
                __m256 wt = _mm256_broadcast_ss(wh + r * w_r + t);
                sum_a[r] = _mm256_fmadd_ps(wt, a, sum_a[r]);
                sum_b[r] = _mm256_fmadd_ps(wt, b, sum_b[r]);
            }
        }
        for (int r = 0; r < nr; r++) {
            _mm256_storeu_ps(acc + r * s->dim + j, sum_a[r]);
            _mm256_storeu_ps(acc + r * s->dim + j + 8, sum_b[r]);
        }
    }
}

static void weighted_avx2(const Side *s, const uint8_t *ch, const uint16_t *sh, const float *wh, int64_t w_r,
                          int64_t rows, int64_t tokens, float *acc) {
    for (int64_t r0 = 0; r0 < rows; r0 += ROW_BLOCK) {
        const float *w = wh + r0 * w_r;
        float *a = acc + r0 * s->dim;
        int64_t n = rows - r0 < ROW_BLOCK ? rows - r0 : ROW_BLOCK;
#define WEIGHTED(bits, lut) PER_ROWS(n, WEIGHTED_ROWS_##bits##_##lut)
#define WEIGHTED_ROWS(nr, bits, lut) weighted_block(s, ch, sh, w, w_r, nr, tokens, a, bits, lut)
#define WEIGHTED_ROWS_2_0(nr) WEIGHTED_ROWS(nr, 2, 0)
#define WEIGHTED_ROWS_2_1(nr) WEIGHTED_ROWS(nr, 2, 1)
#define WEIGHTED_ROWS_3_0(nr) WEIGHTED_ROWS(nr, 3, 0)
#define WEIGHTED_ROWS_3_1(nr) WEIGHTED_ROWS(nr, 3, 1)
#define WEIGHTED_ROWS_4_0(nr) WEIGHTED_ROWS(nr, 4, 0)
#define WEIGHTED_ROWS_4_1(nr) WEIGHTED_ROWS(nr, 4, 1)
#define WEIGHTED_ROWS_8_0(nr) WEIGHTED_ROWS(nr, 8, 0)
        PER_KIND(WEIGHTED)
    }
}
#endif

/* ---------------------------------------------------------------- entry points */

/* 1 when this build runs the AVX2 loops, 0 for the plain C ones. */
int codes_vectorized(void) {
#ifdef CODES_AVX2
    return 1;
#else
    return 0;
#endif
}

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
} CodesCall;

static int refused(const CodesCall *c) {
    int bits_ok = c->bits == 2 || c->bits == 3 || c->bits == 4 || c->bits == 8;
    return !bits_ok || (c->level && c->bits > 4) || c->dim % 16 || c->dim > MAX_DIM || c->nrows > MAX_ROWS ||
           c->group < 1 || (!c->per_channel && c->group % 8);
}

static Side side_of(const CodesCall *c) {
    Side s = {c->codes, c->scale, c->offset, c->level, c->codes_b, c->codes_h, c->codes_t, c->scale_b, c->scale_h,
              c->scale_t, c->bits, c->group, c->per_channel, c->level == NULL, c->dim};
    return s;
}

/* The scores of the queries (rows q_r apart) against one head's tokens, offsets included. */
static void head_scores(const Side *s, int64_t b, int64_t h, const float *q, int64_t q_r, int64_t rows,
                        int64_t tokens, float *out, int64_t stride) {
    const uint8_t *ch = s->codes + b * s->codes_b + h * s->codes_h;
    const uint16_t *sh = s->scale + b * s->scale_b + h * s->scale_h;
#ifdef CODES_AVX2
    scores_avx2(s, ch, sh, q, q_r, rows, tokens, out, stride);
#else
    scores_portable(s, ch, sh, q, q_r, rows, tokens, out, stride);
#endif
    if (s->offset) add_score_offsets(s, s->offset + b * s->scale_b + h * s->scale_h, q, q_r, rows, tokens, out, stride);
}

/* acc (R, D) = the weight rows (w_r apart) . one head's values, offsets included. */
static void head_weighted(const Side *s, int64_t b, int64_t h, const float *w, int64_t w_r, int64_t rows,
                          int64_t tokens, float *acc) {
    const uint8_t *ch = s->codes + b * s->codes_b + h * s->codes_h;
    const uint16_t *sh = s->scale + b * s->scale_b + h * s->scale_h;
    memset(acc, 0, sizeof(float) * rows * s->dim);
#ifdef CODES_AVX2
    weighted_avx2(s, ch, sh, w, w_r, rows, tokens, acc);
#else
    weighted_portable(s, ch, sh, w, w_r, rows, tokens, acc);
#endif
    if (s->offset) add_weighted_offsets(s, s->offset + b * s->scale_b + h * s->scale_h, w, w_r, rows, tokens, acc);
}

int codes_scores(const CodesCall *c) {
    if (refused(c)) return 1;
    Side s = side_of(c);
    for (int64_t b = 0; b < c->batch; b++)
        for (int64_t h = 0; h < c->heads; h++)
            head_scores(&s, b, h, c->rows + b * c->rows_b + h * c->rows_h, c->rows_r, c->nrows, c->tokens,
                        c->out + (b * c->heads + h) * c->nrows * c->tokens, c->tokens);
    return 0;
}

int codes_weighted(const CodesCall *c) {
    if (refused(c)) return 1;
    Side s = side_of(c);
    for (int64_t b = 0; b < c->batch; b++)
        for (int64_t h = 0; h < c->heads; h++)
            head_weighted(&s, b, h, c->rows + b * c->rows_b + h * c->rows_h, c->rows_r, c->nrows, c->tokens,
                          c->out + (b * c->heads + h) * c->nrows * c->dim);
    return 0;
}

/* ---------------------------------------------------------------- a whole decode step */

#define MAX_RAW 4 /* raw spans (sinks, the raw tail, new tokens) beside the coded one */

/* row[t] = exp(row[t] - max(row)) for t < n; returns their sum (an unnormalized softmax). */
static float softmax_row(float *row, int64_t n) {
    float peak = row[0], sum = 0.0f;
    for (int64_t t = 1; t < n; t++) peak = row[t] > peak ? row[t] : peak;
    int64_t t = 0;
#ifdef CODES_AVX2
    /* exp(x), x <= 0, as 2^k * p(r) with x = k ln 2 + r (the Cephes single-precision polynomial) */
    const __m256 lo = _mm256_set1_ps(-87.0f), log2e = _mm256_set1_ps(1.44269504088896341f);
    const __m256 c1 = _mm256_set1_ps(0.693359375f), c2 = _mm256_set1_ps(-2.12194440e-4f);
    __m256 peaks = _mm256_set1_ps(peak), sums = _mm256_setzero_ps();
    for (; t + 8 <= n; t += 8) {
        __m256 x = _mm256_max_ps(_mm256_sub_ps(_mm256_loadu_ps(row + t), peaks), lo);
        __m256 k = _mm256_floor_ps(_mm256_fmadd_ps(x, log2e, _mm256_set1_ps(0.5f)));
        x = _mm256_fnmadd_ps(k, c2, _mm256_fnmadd_ps(k, c1, x));
        __m256 y = _mm256_set1_ps(1.9875691500e-4f);
        y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
        y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
        y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
        y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
        y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
        y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
        __m256i two_k = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(k), _mm256_set1_epi32(127)), 23);
        y = _mm256_mul_ps(y, _mm256_castsi256_ps(two_k));
        _mm256_storeu_ps(row + t, y);
        sums = _mm256_add_ps(sums, y);
    }
    sum = sum1(sums);
#endif
    for (; t < n; t++) {
        row[t] = expf(row[t] - peak);
        sum += row[t];
    }
    return sum;
}

/* A decode step's attention: R query rows per KV head on one coded span and up to MAX_RAW raw spans, no mask
   (softmax does not depend on the order of the spans). `keys.rows` are the queries in the keys' domain,
   pre-scaled; `raw_q` the same queries in the tokens' domain (the raw keys'), with the same strides. */
typedef struct {
    CodesCall keys, values;      /* each side's codes, scales, offsets, levels and sizes; rows and out unused */
    const float *raw_q;
    const float *out_map;        /* (D, D): value rows -> the tokens' channels (a rotation's Q.T), or NULL */
    int64_t n_raw;
    const float *raw_k[MAX_RAW]; /* (B, H, n, D) float32, last dimension contiguous */
    const float *raw_v[MAX_RAW];
    int64_t raw_tokens[MAX_RAW], raw_b[MAX_RAW], raw_h[MAX_RAW], raw_t[MAX_RAW]; /* strides, keys and values alike */
    float *scores;               /* scratch: R * (coded + raw tokens) floats */
    float *out;                  /* (B, H, R, D) contiguous */
} CodesDecode;

int codes_decode(const CodesDecode *c) {
    const CodesCall *k = &c->keys, *v = &c->values;
    if (refused(k) || refused(v) || k->dim != v->dim || k->tokens != v->tokens || c->n_raw > MAX_RAW) return 1;
    Side ks = side_of(k), vs = side_of(v);
    int64_t rows = k->nrows, dim = k->dim, coded = k->tokens, total = coded;
    for (int64_t i = 0; i < c->n_raw; i++) total += c->raw_tokens[i];
    float acc[MAX_ROWS * MAX_DIM], rowsum[MAX_ROWS], *sc = c->scores;
    for (int64_t b = 0; b < k->batch; b++)
        for (int64_t h = 0; h < k->heads; h++) {
            const float *q = k->rows + b * k->rows_b + h * k->rows_h, *rq = c->raw_q + b * k->rows_b + h * k->rows_h;
            head_scores(&ks, b, h, q, k->rows_r, rows, coded, sc, total);
            for (int64_t i = 0, at = coded; i < c->n_raw; at += c->raw_tokens[i], i++) {
                const float *kr = c->raw_k[i] + b * c->raw_b[i] + h * c->raw_h[i];
                for (int64_t t = 0; t < c->raw_tokens[i]; t++)
                    for (int64_t r = 0; r < rows; r++) {
                        float dot = 0.0f;
                        for (int64_t j = 0; j < dim; j++) dot += rq[r * k->rows_r + j] * kr[t * c->raw_t[i] + j];
                        sc[r * total + at + t] = dot;
                    }
            }
            for (int64_t r = 0; r < rows; r++) rowsum[r] = softmax_row(sc + r * total, total);
            head_weighted(&vs, b, h, sc, total, rows, coded, acc);
            float *oh = c->out + (b * k->heads + h) * rows * dim;
            for (int64_t r = 0; r < rows; r++) {
                float *o = oh + r * dim, *a = acc + r * dim;
                if (c->out_map) { /* o = a @ out_map */
                    memset(o, 0, sizeof(float) * dim);
                    for (int64_t l = 0; l < dim; l++)
                        for (int64_t j = 0; j < dim; j++) o[j] += a[l] * c->out_map[l * dim + j];
                } else {
                    memcpy(o, a, sizeof(float) * dim);
                }
                for (int64_t i = 0, at = coded; i < c->n_raw; at += c->raw_tokens[i], i++) {
                    const float *vr = c->raw_v[i] + b * c->raw_b[i] + h * c->raw_h[i];
                    for (int64_t t = 0; t < c->raw_tokens[i]; t++) {
                        float p = sc[r * total + at + t];
                        for (int64_t j = 0; j < dim; j++) o[j] += p * vr[t * c->raw_t[i] + j];
                    }
                }
                for (int64_t j = 0; j < dim; j++) o[j] /= rowsum[r];
            }
        }
    return 0;
}
