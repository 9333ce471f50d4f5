/* codes4_cpu.c: attention's two products on 4-bit codes, for the CPU, without ever writing a float row.

   A side (keys or values) of a coded span stores, per token t and channel c of a KV head,
       x[t, c] = level[code(t, c)] * scale(t, c) + offset(t, c)     (the offset optional)
   with code(t, c) the nibble c of the token's D/2 bytes (LSB first: byte i holds channels 2i and 2i+1),
   level a table of 16 floats (the integers 0..15 for integer codes, a Lloyd-Max codebook otherwise) and
   scale(t, c) a float16 either per channel over `group` tokens (scale[t / group, c]) or per token over
   `group` channels (scale[t, c / group]); an offset (integer codes' zero) is a float16 laid out as the
   scale. Two products read it:

       codes4_scores    out[b, h, r, t] = sum_c q[b, h, r, c] * x[t, c]      (R query rows against n tokens)
       codes4_weighted  out[b, h, r, c] = sum_t w[b, h, r, t] * x[t, c]      (R weight rows over n tokens)

   A token's codes become levels in registers (AVX2: eight nibbles at a time, converted, or looked up in
   the 16 levels held in two registers) and are used there by up to ROW_BLOCK rows of its KV head at once,
   so the memory read per token and side is its D/2 bytes of codes, not 4 D bytes of float rows. In
   registers a 16-channel chunk is its 8 even channels, then its 8 odd ones (the low and high nibbles of 8
   bytes): the queries and the output are put in that "lane order" once per call. The scores keep a
   token's sums in a vector until TOKEN_BLOCK tokens are done, then reduce them together; per-channel
   scales are folded into the queries once per group. The offsets are added after the main loops, once per
   group (per channel: q . offset, the weights summed times the offset) or per token (per token: the sum of
   q over a group times its offset), so they cost a pass over scores and weights, never over channels. Without AVX2, FMA and F16C (or built with
   -DCODES4_PORTABLE) the same sums run as plain C loops. Single-threaded; kernels/codes4_cpu.py checks shapes, dtypes and strides before calling.
*/
#include <stdint.h>
#include <math.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(CODES4_PORTABLE)
#include <immintrin.h>
#define CODES4_AVX2 1
#endif

#define MAX_DIM 256
#define MAX_ROWS 64
#define ROW_BLOCK 4   /* rows whose accumulators stay in registers together */
#define TOKEN_BLOCK 8 /* tokens whose score sums are reduced together */
#define INLINE static inline __attribute__((always_inline))

/* Strides are in elements; the last dimension of every tensor is contiguous (the launcher checks). */
typedef struct {
    const uint8_t *codes;   /* (B, H, n, D/2) */
    const uint16_t *scale;  /* float16 bits: (B, H, ceil(n/group), D) per channel, (B, H, n, D/group) per token */
    const uint16_t *offset; /* float16 bits laid out as the scale, or NULL */
    const float *level;     /* (16,) */
    int64_t codes_b, codes_h, codes_t, scale_b, scale_h, scale_t;
    int64_t group, per_channel, integer_levels, dim;
} Side;

INLINE float half_to_float(uint16_t h) {
#ifdef CODES4_AVX2
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

/* The channel of lane j: chunk j/16, its even channels first, then its odd ones. */
INLINE int64_t lane_channel(int64_t j) {
    int64_t l = j % 16;
    return j - l + (l < 8 ? 2 * l : 2 * (l - 8) + 1);
}

/* The scales token t needs, in lane order: per channel, its group's (refreshed at a group's first token:
   returns 1 then, `next` being the next group's first token); per token, one per 16-channel chunk. */
INLINE int token_scales(const Side *s, const uint16_t *scale, int64_t t, int64_t *next, float *lanes,
                        float *chunk_scale) {
    if (s->per_channel) {
        if (t != *next) return 0;
        const uint16_t *row = scale + t / s->group * s->scale_t;
        for (int64_t j = 0; j < s->dim; j++) lanes[j] = half_to_float(row[lane_channel(j)]);
        *next += s->group;
        return 1;
    }
    const uint16_t *row = scale + t * s->scale_t;
    for (int64_t c = 0; c < s->dim / 16; c++) chunk_scale[c] = half_to_float(row[c * 16 / s->group]);
    return 0;
}

/* Scores += q . offset: per channel once per token group, per token from the sums of q over each group. */
static void add_score_offsets(const Side *s, const uint16_t *oh, const float *qs, int64_t rows, int64_t tokens,
                              float *out, int64_t stride) {
    int64_t dim = s->dim;
    if (s->per_channel) {
        for (int64_t g0 = 0; g0 < tokens; g0 += s->group) {
            const uint16_t *row = oh + g0 / s->group * s->scale_t;
            int64_t g1 = g0 + s->group < tokens ? g0 + s->group : tokens;
            for (int64_t r = 0; r < rows; r++) {
                float bias = 0.0f;
                for (int64_t j = 0; j < dim; j++) bias += qs[r * dim + j] * half_to_float(row[lane_channel(j)]);
                for (int64_t t = g0; t < g1; t++) out[r * stride + t] += bias;
            }
        }
        return;
    }
    int64_t groups = dim / s->group;
    float qsum[MAX_ROWS * (MAX_DIM / 16)];
    for (int64_t r = 0; r < rows; r++) /* the lanes of a group are its channels (whole 16-channel chunks) */
        for (int64_t g = 0; g < groups; g++) {
            float sum = 0.0f;
            for (int64_t j = g * s->group; j < (g + 1) * s->group; j++) sum += qs[r * dim + j];
            qsum[r * groups + g] = sum;
        }
    for (int64_t t = 0; t < tokens; t++) {
        const uint16_t *row = oh + t * s->scale_t;
        for (int64_t r = 0; r < rows; r++) {
            float bias = 0.0f;
            for (int64_t g = 0; g < groups; g++) bias += qsum[r * groups + g] * half_to_float(row[g]);
            out[r * stride + t] += bias;
        }
    }
}

/* acc (lane order) += w . offset: per channel the weights summed over each token group, per token over
   each token's groups. */
static void add_weighted_offsets(const Side *s, const uint16_t *oh, const float *wh, int64_t w_r, int64_t rows,
                                 int64_t tokens, float *acc) {
    int64_t dim = s->dim;
    if (s->per_channel) {
        for (int64_t g0 = 0; g0 < tokens; g0 += s->group) {
            const uint16_t *row = oh + g0 / s->group * s->scale_t;
            int64_t g1 = g0 + s->group < tokens ? g0 + s->group : tokens;
            for (int64_t r = 0; r < rows; r++) {
                float wsum = 0.0f;
                for (int64_t t = g0; t < g1; t++) wsum += wh[r * w_r + t];
                for (int64_t j = 0; j < dim; j++) acc[r * dim + j] += wsum * half_to_float(row[lane_channel(j)]);
            }
        }
        return;
    }
    int64_t groups = dim / s->group;
    for (int64_t r = 0; r < rows; r++) {
        float z[MAX_DIM / 16] = {0};
        for (int64_t t = 0; t < tokens; t++) {
            const uint16_t *row = oh + t * s->scale_t;
            float wt = wh[r * w_r + t];
            for (int64_t g = 0; g < groups; g++) z[g] += wt * half_to_float(row[g]);
        }
        for (int64_t j = 0; j < dim; j++) acc[r * dim + j] += z[j / s->group];
    }
}

/* ---------------------------------------------------------------- portable C */
#ifndef CODES4_AVX2

/* Token t's scaled values in lane order into x. */
static void token_values(const Side *s, const uint8_t *codes, const float *lanes, const float *chunk_scale,
                         float *x) {
    for (int64_t j = 0; j < s->dim; j++) {
        int64_t c = lane_channel(j);
        float scale = s->per_channel ? lanes[j] : chunk_scale[j / 16];
        x[j] = s->level[(codes[c / 2] >> (4 * (c % 2))) & 15] * scale;
    }
}

static void scores_portable(const Side *s, const uint8_t *ch, const uint16_t *sh, const float *qs, int64_t rows,
                            int64_t tokens, float *out, int64_t stride) {
    float lanes[MAX_DIM], chunk_scale[MAX_DIM / 16], x[MAX_DIM];
    int64_t next = 0;
    for (int64_t t = 0; t < tokens; t++) {
        token_scales(s, sh, t, &next, lanes, chunk_scale);
        token_values(s, ch + t * s->codes_t, lanes, chunk_scale, x);
        for (int64_t r = 0; r < rows; r++) {
            float acc = 0.0f;
            for (int64_t j = 0; j < s->dim; j++) acc += qs[r * s->dim + j] * x[j];
            out[r * stride + t] = acc;
        }
    }
}

static void weighted_portable(const Side *s, const uint8_t *ch, const uint16_t *sh, const float *wh, int64_t w_r,
                              int64_t rows, int64_t tokens, float *acc) {
    float lanes[MAX_DIM], chunk_scale[MAX_DIM / 16], x[MAX_DIM];
    int64_t next = 0;
    for (int64_t t = 0; t < tokens; t++) {
        token_scales(s, sh, t, &next, lanes, chunk_scale);
        token_values(s, ch + t * s->codes_t, lanes, chunk_scale, x);
        for (int64_t r = 0; r < rows; r++) {
            float wt = wh[r * w_r + t];
            for (int64_t j = 0; j < s->dim; j++) acc[r * s->dim + j] += wt * x[j];
        }
    }
}

#else
/* ---------------------------------------------------------------- AVX2 */

/* The 16 unscaled levels of chunk j of a token: even channels in *a, odd ones in *b. */
INLINE void chunk_levels(const Side *s, const uint8_t *codes, int64_t j, __m256 lo_levels, __m256 hi_levels,
                         __m256 *a, __m256 *b) {
    __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(codes + j / 2)));
    __m256i idx[2] = {_mm256_and_si256(bytes, _mm256_set1_epi32(15)), _mm256_srli_epi32(bytes, 4)};
    __m256 out[2];
    for (int half = 0; half < 2; half++) {
        if (s->integer_levels) {
            out[half] = _mm256_cvtepi32_ps(idx[half]);
        } else { /* level[idx]: the low 3 bits pick a lane, bit 3 the register */
            __m256 from_lo = _mm256_permutevar8x32_ps(lo_levels, idx[half]);
            __m256 from_hi = _mm256_permutevar8x32_ps(hi_levels, idx[half]);
            out[half] = _mm256_blendv_ps(from_lo, from_hi, _mm256_castsi256_ps(_mm256_slli_epi32(idx[half], 28)));
        }
    }
    *a = out[0];
    *b = out[1];
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

/* Scores of `nr` (<= ROW_BLOCK) rows qs (lane order; per channel already scaled) for every token into out. */
INLINE void scores_block(const Side *s, const uint8_t *ch, const uint16_t *sh, const float *qs, float *qsc,
                         const int nr, int64_t tokens, float *out, int64_t stride) {
    const __m256 lo_levels = _mm256_loadu_ps(s->level), hi_levels = _mm256_loadu_ps(s->level + 8);
    float lanes[MAX_DIM], chunk_scale[MAX_DIM / 16];
    __m256 sums[ROW_BLOCK][TOKEN_BLOCK];
    const float *q = s->per_channel ? qsc : qs;
    int64_t next = 0;
    for (int64_t t = 0; t < tokens; t++) {
        if (token_scales(s, sh, t, &next, lanes, chunk_scale)) /* fold the group's scales into the queries */
            for (int r = 0; r < nr; r++)
                for (int64_t j = 0; j < s->dim; j++) qsc[r * s->dim + j] = qs[r * s->dim + j] * lanes[j];
        const uint8_t *ct = ch + t * s->codes_t;
        __m256 acc[ROW_BLOCK];
        for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
        for (int64_t j = 0; j < s->dim; j += 16) {
            __m256 a, b;
            chunk_levels(s, ct, j, lo_levels, hi_levels, &a, &b);
            if (!s->per_channel) {
                __m256 scale = _mm256_broadcast_ss(chunk_scale + j / 16);
                a = _mm256_mul_ps(a, scale);
                b = _mm256_mul_ps(b, scale);
            }
            for (int r = 0; r < nr; r++) {
                acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q + r * s->dim + j), a, acc[r]);
                acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q + r * s->dim + j + 8), b, acc[r]);
            }
        }
        int64_t slot = t % TOKEN_BLOCK;
        for (int r = 0; r < nr; r++) sums[r][slot] = acc[r];
        if (slot == TOKEN_BLOCK - 1) {
            for (int r = 0; r < nr; r++) _mm256_storeu_ps(out + r * stride + t - slot, sum8(sums[r]));
        }
    }
    for (int64_t t = tokens / TOKEN_BLOCK * TOKEN_BLOCK; t < tokens; t++) /* the last, partial block */
        for (int r = 0; r < nr; r++) out[r * stride + t] = sum1(sums[r][t % TOKEN_BLOCK]);
}

static void scores_avx2(const Side *s, const uint8_t *ch, const uint16_t *sh, const float *qs, int64_t rows,
                        int64_t tokens, float *out, int64_t stride) {
    float qsc[ROW_BLOCK * MAX_DIM];
    for (int64_t r0 = 0; r0 < rows; r0 += ROW_BLOCK) {
        const float *q = qs + r0 * s->dim;
        float *o = out + r0 * stride;
        switch (rows - r0 < ROW_BLOCK ? rows - r0 : ROW_BLOCK) { /* a constant row count per copy */
        case 1: scores_block(s, ch, sh, q, qsc, 1, tokens, o, stride); break;
        case 2: scores_block(s, ch, sh, q, qsc, 2, tokens, o, stride); break;
        case 3: scores_block(s, ch, sh, q, qsc, 3, tokens, o, stride); break;
        default: scores_block(s, ch, sh, q, qsc, 4, tokens, o, stride); break;
        }
    }
}

/* acc (nr rows, lane order) = w rows . every token's values, one 16-channel chunk at a time. */
INLINE void weighted_block(const Side *s, const uint8_t *ch, const uint16_t *sh, const float *wh, int64_t w_r,
                           const int nr, int64_t tokens, float *acc) {
    const __m256 lo_levels = _mm256_loadu_ps(s->level), hi_levels = _mm256_loadu_ps(s->level + 8);
    for (int64_t j = 0; j < s->dim; j += 16) {
        __m256 sum_a[ROW_BLOCK], sum_b[ROW_BLOCK], scale_a = _mm256_setzero_ps(), scale_b = scale_a;
        for (int r = 0; r < nr; r++) sum_a[r] = sum_b[r] = _mm256_setzero_ps();
        const uint16_t *token_scale = sh + j / s->group; /* per token: this chunk's group */
        for (int64_t t = 0; t < tokens; t++) {
            if (s->per_channel && t % s->group == 0) { /* this chunk's lane scales of the token group */
                float lanes[16];
                const uint16_t *row = sh + t / s->group * s->scale_t;
                for (int64_t l = 0; l < 16; l++) lanes[l] = half_to_float(row[lane_channel(j + l)]);
                scale_a = _mm256_loadu_ps(lanes);
                scale_b = _mm256_loadu_ps(lanes + 8);
            } else if (!s->per_channel) {
                scale_a = scale_b = _mm256_set1_ps(half_to_float(token_scale[t * s->scale_t]));
            }
            __m256 a, b;
            chunk_levels(s, ch + t * s->codes_t, j, lo_levels, hi_levels, &a, &b);
            a = _mm256_mul_ps(a, scale_a);
            b = _mm256_mul_ps(b, scale_b);
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
        switch (rows - r0 < ROW_BLOCK ? rows - r0 : ROW_BLOCK) {
        case 1: weighted_block(s, ch, sh, w, w_r, 1, tokens, a); break;
        case 2: weighted_block(s, ch, sh, w, w_r, 2, tokens, a); break;
        case 3: weighted_block(s, ch, sh, w, w_r, 3, tokens, a); break;
        default: weighted_block(s, ch, sh, w, w_r, 4, tokens, a); break;
        }
    }
}
#endif

/* ---------------------------------------------------------------- entry points */

/* 1 when this build runs the AVX2 loops, 0 for the plain C ones. */
int codes4_vectorized(void) {
#ifdef CODES4_AVX2
    return 1;
#else
    return 0;
#endif
}

/* One call's arguments (kernels/codes4_cpu.py fills the same struct). Strides are in elements. */
typedef struct {
    const float *rows;      /* q (B, H, R, D) for the scores, w (B, H, R, n) for the weighted sum */
    int64_t rows_b, rows_h, rows_r;
    const uint8_t *codes;   /* (B, H, n, D/2) */
    const uint16_t *scale;  /* float16 bits (Side) */
    const uint16_t *offset; /* float16 bits laid out as the scale, or NULL */
    const float *level;     /* (16,) */
    int64_t codes_b, codes_h, codes_t, scale_b, scale_h, scale_t;
    int64_t group, per_channel, integer_levels;
    float *out;             /* (B, H, R, n) scores or (B, H, R, D) weighted sums, contiguous */
    int64_t batch, heads, nrows, tokens, dim;
} Codes4Call;

static int refused(const Codes4Call *c) {
    return c->dim % 16 || c->dim > MAX_DIM || c->nrows > MAX_ROWS || c->group < 1 || (!c->per_channel && c->group % 16);
}

static Side side_of(const Codes4Call *c) {
    Side s = {c->codes, c->scale, c->offset, c->level, c->codes_b, c->codes_h, c->codes_t, c->scale_b, c->scale_h, c->scale_t,
              c->group, c->per_channel, c->integer_levels, c->dim};
    return s;
}

int codes4_scores(const Codes4Call *c) {
    if (refused(c)) return 1;
    Side s = side_of(c);
    int64_t rows = c->nrows, dim = c->dim;
    float qs[MAX_ROWS * MAX_DIM];
    for (int64_t b = 0; b < c->batch; b++)
        for (int64_t h = 0; h < c->heads; h++) {
            const float *qh = c->rows + b * c->rows_b + h * c->rows_h;
            for (int64_t r = 0; r < rows; r++)
                for (int64_t j = 0; j < dim; j++) qs[r * dim + j] = qh[r * c->rows_r + lane_channel(j)];
            const uint8_t *ch = c->codes + b * c->codes_b + h * c->codes_h;
            const uint16_t *sh = c->scale + b * c->scale_b + h * c->scale_h;
            float *oh = c->out + (b * c->heads + h) * rows * c->tokens;
#ifdef CODES4_AVX2
            scores_avx2(&s, ch, sh, qs, rows, c->tokens, oh, c->tokens);
#else
            scores_portable(&s, ch, sh, qs, rows, c->tokens, oh, c->tokens);
#endif
            if (c->offset)
                add_score_offsets(&s, c->offset + b * c->scale_b + h * c->scale_h, qs, rows, c->tokens, oh, c->tokens);
        }
    return 0;
}

int codes4_weighted(const Codes4Call *c) {
    if (refused(c)) return 1;
    Side s = side_of(c);
    int64_t rows = c->nrows, dim = c->dim;
    float acc[MAX_ROWS * MAX_DIM];
    for (int64_t b = 0; b < c->batch; b++)
        for (int64_t h = 0; h < c->heads; h++) {
            const float *wh = c->rows + b * c->rows_b + h * c->rows_h;
            const uint8_t *ch = c->codes + b * c->codes_b + h * c->codes_h;
            const uint16_t *sh = c->scale + b * c->scale_b + h * c->scale_h;
            memset(acc, 0, sizeof(float) * rows * dim);
#ifdef CODES4_AVX2
            weighted_avx2(&s, ch, sh, wh, c->rows_r, rows, c->tokens, acc);
#else
            weighted_portable(&s, ch, sh, wh, c->rows_r, rows, c->tokens, acc);
#endif
            if (c->offset)
                add_weighted_offsets(&s, c->offset + b * c->scale_b + h * c->scale_h, wh, c->rows_r, rows, c->tokens,
                                     acc);
            float *oh = c->out + (b * c->heads + h) * rows * dim;
            for (int64_t r = 0; r < rows; r++)
                for (int64_t j = 0; j < dim; j++) oh[r * dim + lane_channel(j)] = acc[r * dim + j];
        }
    return 0;
}

/* ---------------------------------------------------------------- a whole decode step */

/* row[t] = exp(row[t] - max(row)) for t < n; returns their sum (an unnormalized softmax). */
static float softmax_row(float *row, int64_t n) {
    float peak = row[0], sum = 0.0f;
    for (int64_t t = 1; t < n; t++) peak = row[t] > peak ? row[t] : peak;
    int64_t t = 0;
#ifdef CODES4_AVX2
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

#define MAX_RAW 4 /* raw spans (sinks, the raw tail, new tokens) beside the coded one */

/* A decode step's attention: R query rows per KV head on one coded span and up to MAX_RAW raw spans, no mask
   (softmax does not depend on the order of the spans). `keys.rows` are the queries in the keys' domain,
   pre-scaled; `raw_q` the same queries in the tokens' domain (the raw keys'); `values.rows` is unused. */
typedef struct {
    Codes4Call keys, values;     /* codes, scales, offsets, levels and sizes of each side; keys.out unused */
    const float *raw_q;          /* (B, H, R, D), strides as keys.rows */
    const float *out_map;        /* (D, D): value rows (lane order undone) -> the tokens' channels, or NULL */
    int64_t n_raw;
    const float *raw_k[MAX_RAW]; /* (B, H, n, D) float32, last dimension contiguous */
    const float *raw_v[MAX_RAW];
    int64_t raw_tokens[MAX_RAW], raw_b[MAX_RAW], raw_h[MAX_RAW], raw_t[MAX_RAW]; /* strides, keys and values alike */
    float *scores;               /* scratch: R * (coded + raw tokens) floats */
    float *out;                  /* (B, H, R, D) contiguous */
} Codes4Decode;

int codes4_decode(const Codes4Decode *c) {
    const Codes4Call *k = &c->keys, *v = &c->values;
    if (refused(k) || refused(v) || k->dim != v->dim || k->tokens != v->tokens || c->n_raw > MAX_RAW) return 1;
    Side ks = side_of(k), vs = side_of(v);
    int64_t rows = k->nrows, dim = k->dim, coded = k->tokens, total = coded;
    for (int64_t i = 0; i < c->n_raw; i++) total += c->raw_tokens[i];
    float qs[MAX_ROWS * MAX_DIM], acc[MAX_ROWS * MAX_DIM], rowsum[MAX_ROWS];
    float *sc = c->scores;
    for (int64_t b = 0; b < k->batch; b++)
        for (int64_t h = 0; h < k->heads; h++) {
            const float *qh = k->rows + b * k->rows_b + h * k->rows_h;
            const float *rq = c->raw_q + b * k->rows_b + h * k->rows_h;
            for (int64_t r = 0; r < rows; r++)
                for (int64_t j = 0; j < dim; j++) qs[r * dim + j] = qh[r * k->rows_r + lane_channel(j)];
            /* scores: the coded span, then each raw span */
            const uint8_t *kc = k->codes + b * k->codes_b + h * k->codes_h;
            const uint16_t *kscale = k->scale + b * k->scale_b + h * k->scale_h;
#ifdef CODES4_AVX2
            scores_avx2(&ks, kc, kscale, qs, rows, coded, sc, total);
#else
            scores_portable(&ks, kc, kscale, qs, rows, coded, sc, total);
#endif
            if (k->offset) add_score_offsets(&ks, k->offset + b * k->scale_b + h * k->scale_h, qs, rows, coded, sc, total);
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
            /* the weighted values: the coded span in its rows' domain, back to the tokens' channels, then raw */
            const uint8_t *vc = v->codes + b * v->codes_b + h * v->codes_h;
            const uint16_t *vscale = v->scale + b * v->scale_b + h * v->scale_h;
            memset(acc, 0, sizeof(float) * rows * dim);
#ifdef CODES4_AVX2
            weighted_avx2(&vs, vc, vscale, sc, total, rows, coded, acc);
#else
            weighted_portable(&vs, vc, vscale, sc, total, rows, coded, acc);
#endif
            if (v->offset) add_weighted_offsets(&vs, v->offset + b * v->scale_b + h * v->scale_h, sc, total, rows, coded, acc);
            float *oh = c->out + (b * k->heads + h) * rows * dim;
            for (int64_t r = 0; r < rows; r++) {
                float *o = oh + r * dim, *a = acc + r * dim;
                if (c->out_map) { /* o = a (channel order) @ out_map */
                    for (int64_t j = 0; j < dim; j++) o[j] = 0.0f;
                    for (int64_t l = 0; l < dim; l++) {
                        float x = a[l];
                        const float *m = c->out_map + lane_channel(l) * dim;
                        for (int64_t j = 0; j < dim; j++) o[j] += x * m[j];
                    }
                } else {
                    for (int64_t l = 0; l < dim; l++) o[lane_channel(l)] = a[l];
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
