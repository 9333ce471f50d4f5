/* codes_loops_avx2.c: the products' main loops with AVX2, FMA and F16C (codes_cpu.h); a build without them
   (or with -DCODES_PORTABLE) takes codes_loops_portable.c instead. */
#include "codes_cpu.h"
#ifdef CODES_AVX2

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

/* `lut` of an 8-bit float side: its bytes widened to float16 bits and converted, no table, no scale. */
#define LUT_E4M3 2
#define LUT_E5M2 3

/* Channels j..j+7 of a token's row as 8 unscaled levels (j a multiple of 8); `bits` and `lut` (0 integer codes,
   1 a codebook, LUT_E4M3 / LUT_E5M2 8-bit floats) are constants in every copy the callers make, so no test of
   them runs per chunk. */
INLINE __m256 chunk_levels(const Unpack *u, const uint8_t *row, int64_t j, const int bits, const int lut) {
    if (lut >= LUT_E4M3) { /* float8_half, eight lanes at once */
        __m128i bytes = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(row + j)));
        if (lut == LUT_E5M2) return _mm256_cvtph_ps(_mm_slli_epi16(bytes, 8));
        __m128i half = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(bytes, _mm_set1_epi16(0x80)), 8),
                                    _mm_slli_epi16(_mm_and_si128(bytes, _mm_set1_epi16(0x7F)), 7));
        return _mm256_mul_ps(_mm256_cvtph_ps(half), _mm256_set1_ps(E4M3_UNBIAS));
    }
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
        if (lut < LUT_E4M3 && token_scales(s, sh, t, &next, channel_scale, chunk_scale)) /* fold them into q */
            for (int r = 0; r < nr; r++)
                for (int64_t c = 0; c < s->dim; c++) scaled_q[r * s->dim + c] = q[r * q_r + c] * channel_scale[c];
        const uint8_t *row = ch + t * s->codes_t;
        __m256 acc[ROW_BLOCK];
        for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
        for (int64_t j = 0; j < s->dim; j += 8) {
            __m256 x = chunk_levels(&u, row, j, bits, lut);
            if (lut < LUT_E4M3 && !s->per_channel) x = _mm256_mul_ps(x, _mm256_broadcast_ss(chunk_scale + j / 8));
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
    switch (s->float8 ? 100 + (int)s->float8 : (int)(s->bits * 2 + !s->integer_levels)) {                         \
    case 100 + FLOAT8_E4M3: body(8, LUT_E4M3); break;                                                             \
    case 100 + FLOAT8_E5M2: body(8, LUT_E5M2); break;                                                             \
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

void scores_loop(const Side *s, const uint8_t *ch, const uint16_t *sh, const float *q, int64_t q_r, int64_t rows,
                 int64_t tokens, float *out, int64_t stride) {
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
#define SCORES_ROWS_8_LUT_E4M3(nr) SCORES_ROWS(nr, 8, LUT_E4M3)
#define SCORES_ROWS_8_LUT_E5M2(nr) SCORES_ROWS(nr, 8, LUT_E5M2)
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
        const uint16_t *scale_ga = sh ? sh + j / s->group : NULL, *scale_gb = sh ? sh + (j + 8) / s->group : NULL;
        for (int64_t t = 0; t < tokens; t++) {
            if (lut >= LUT_E4M3) { /* 8-bit floats: no scale */
            } else if (s->per_channel && t % s->group == 0) { /* these 16 channels' scales of the token group */
                float lanes[16];
                halves(sh + t / s->group * s->scale_t + j, 16, lanes);
                scale_a = _mm256_loadu_ps(lanes);
                scale_b = _mm256_loadu_ps(lanes + 8);
            } else if (!s->per_channel) {
                scale_a = _mm256_set1_ps(half_to_float(scale_ga[t * s->scale_t]));
                scale_b = _mm256_set1_ps(half_to_float(scale_gb[t * s->scale_t]));
            }
            const uint8_t *row = ch + t * s->codes_t;
            __m256 a = chunk_levels(&u, row, j, bits, lut), b = chunk_levels(&u, row, j + 8, bits, lut);
            if (lut < LUT_E4M3) {
                a = _mm256_mul_ps(a, scale_a);
                b = _mm256_mul_ps(b, scale_b);
            }
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

void weighted_loop(const Side *s, const uint8_t *ch, const uint16_t *sh, const float *wh, int64_t w_r, int64_t rows,
                   int64_t tokens, float *acc) {
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
#define WEIGHTED_ROWS_8_LUT_E4M3(nr) WEIGHTED_ROWS(nr, 8, LUT_E4M3)
#define WEIGHTED_ROWS_8_LUT_E5M2(nr) WEIGHTED_ROWS(nr, 8, LUT_E5M2)
        PER_KIND(WEIGHTED)
    }
}
#endif
