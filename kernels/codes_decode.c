/* codes_decode.c: a whole decode step's attention on one coded span and a few raw ones, in one call (codes_cpu.h). */
#include "codes_cpu.h"

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
    float *scores;               /* scratch: B * H * R * (coded + raw tokens) floats */
    float *out;                  /* (B, H, R, D) contiguous */
    int64_t threads;             /* the most threads to run the (batch, head) pairs on */
} CodesDecode;

/* One (batch, head)'s attention: its scores into `sc` (R * total floats of its own), its output rows into out. */
static void decode_head(const CodesDecode *c, const Side *ks, const Side *vs, int64_t b, int64_t h, int64_t total,
                        float *sc) {
    const CodesCall *k = &c->keys;
    int64_t rows = k->nrows, dim = k->dim, coded = k->tokens;
    float acc[MAX_ROWS * MAX_DIM], rowsum[MAX_ROWS];
    const float *q = k->rows + b * k->rows_b + h * k->rows_h, *rq = c->raw_q + b * k->rows_b + h * k->rows_h;
    head_scores(ks, b, h, q, k->rows_r, rows, coded, sc, total);
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
    head_weighted(vs, b, h, sc, total, rows, coded, acc);
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

/* Every (batch, head) on up to c->threads threads (OpenMP, where built with it: each pair's work and scratch are
   its own, so the numbers do not depend on the threads, as long as the caller has not changed one thread's
   floating-point mode, e.g. flush-to-zero); the pragma is ignored in a build without OpenMP. */
int codes_decode(const CodesDecode *c) {
    const CodesCall *k = &c->keys, *v = &c->values;
    if (refused(k) || refused(v) || k->dim != v->dim || k->tokens != v->tokens || c->n_raw > MAX_RAW) return 1;
    Side ks = side_of(k), vs = side_of(v);
    int64_t total = k->tokens, pairs = k->batch * k->heads;
    for (int64_t i = 0; i < c->n_raw; i++) total += c->raw_tokens[i];
    const int64_t span = k->nrows * total; /* each pair's scratch */
    int threads = (int)(c->threads < 1 ? 1 : c->threads < pairs ? c->threads : pairs);
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t pair = 0; pair < pairs; pair++)
        decode_head(c, &ks, &vs, pair / k->heads, pair % k->heads, total, c->scores + pair * span);
    return 0;
}
