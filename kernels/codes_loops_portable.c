/* codes_loops_portable.c: the products' main loops as plain C, for a CPU without AVX2, FMA and F16C or a build
   with -DCODES_PORTABLE (codes_cpu.h); codes_loops_avx2.c builds them otherwise. */
#include "codes_cpu.h"
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
        float level = s->float8 ? float8_value(code, s->float8) : s->integer_levels ? (float)code : s->level[code];
        x[c] = level * (s->per_channel ? channel_scale[c] : chunk_scale[c / 8]);
    }
}

void scores_loop(const Side *s, const uint8_t *ch, const uint16_t *sh, const float *q, int64_t q_r, int64_t rows,
                 int64_t tokens, float *out, int64_t stride) {
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

void weighted_loop(const Side *s, const uint8_t *ch, const uint16_t *sh, const float *wh, int64_t w_r, int64_t rows,
                   int64_t tokens, float *acc) {
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
#endif
