/* codes_cpu.c: the offsets, one KV head's products and the entry points codes_scores / codes_weighted
   (the format and the other files: codes_cpu.h). */
#include "codes_cpu.h"

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

/* ---------------------------------------------------------------- entry points */

/* 1 when this build runs the AVX2 loops, 0 for the plain C ones. */
int codes_vectorized(void) {
#ifdef CODES_AVX2
    return 1;
#else
    return 0;
#endif
}

/* 1 when the kernel does not take this call (kernels/codes_cpu.py's codes_supported says which it takes). */
int refused(const CodesCall *c) {
    int bits_ok = c->bits == 2 || c->bits == 3 || c->bits == 4 || c->bits == 8;
    int float8_ok = !c->float8 || ((c->float8 == FLOAT8_E4M3 || c->float8 == FLOAT8_E5M2) && c->bits == 8 &&
                                   !c->scale && !c->offset && !c->level && !c->per_channel);
    return !bits_ok || !float8_ok || (!c->float8 && !c->scale) || (c->level && c->bits > 4) || c->dim % 16 ||
           c->dim > MAX_DIM || c->nrows > MAX_ROWS || c->group < 1 || (!c->per_channel && c->group % 8);
}

/* The side a call reads. */
Side side_of(const CodesCall *c) {
    Side s = {c->codes, c->scale, c->offset, c->level, c->codes_b, c->codes_h, c->codes_t, c->scale_b, c->scale_h,
              c->scale_t, c->bits, c->group, c->per_channel, c->level == NULL, c->dim, c->float8};
    return s;
}

/* The scores of the queries (rows q_r apart) against one head's tokens, offsets included. */
void head_scores(const Side *s, int64_t b, int64_t h, const float *q, int64_t q_r, int64_t rows,
                 int64_t tokens, float *out, int64_t stride) {
    const uint8_t *ch = s->codes + b * s->codes_b + h * s->codes_h;
    const uint16_t *sh = s->scale ? s->scale + b * s->scale_b + h * s->scale_h : NULL;
    scores_loop(s, ch, sh, q, q_r, rows, tokens, out, stride);
    if (s->offset) add_score_offsets(s, s->offset + b * s->scale_b + h * s->scale_h, q, q_r, rows, tokens, out, stride);
}

/* acc (R, D) = the weight rows (w_r apart) . one head's values, offsets included. */
void head_weighted(const Side *s, int64_t b, int64_t h, const float *w, int64_t w_r, int64_t rows,
                   int64_t tokens, float *acc) {
    const uint8_t *ch = s->codes + b * s->codes_b + h * s->codes_h;
    const uint16_t *sh = s->scale ? s->scale + b * s->scale_b + h * s->scale_h : NULL;
    memset(acc, 0, sizeof(float) * rows * s->dim);
    weighted_loop(s, ch, sh, w, w_r, rows, tokens, acc);
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
