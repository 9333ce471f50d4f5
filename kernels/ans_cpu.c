/* ans_cpu.c: the PCA tiers' entropy coder (rANS) and its rate control's cost pass, compiled for the CPU.

   ans_encode writes, byte for byte, the streams codeckv/codecs/ans_vectorized.py writes in numpy (and
   constriction's AnsCoder before it): 24-bit probabilities, 32-bit words, a 64-bit state. A stream of L
   symbols in class-major order (symbol t: code codes[order[t]] under model classes[t] - shift) pushes its
   escaped values first, the last one first (cumulative v * ESCAPE_FREQUENCY, frequency ESCAPE_FREQUENCY),
   then its symbols from the last to the first, then its final state, low word first (a word only when
   what is left of the state is not zero). A code q with |q| <= M_k is symbol q + M_k of model k; any other
   is the escape symbol 2 M_k + 1, followed by its value clipped to 16 bits. Each stream writes its words into
   its own row of the word buffer; LANES streams are coded in lockstep.

   ans_costs is the rate control's estimate of a stream's length (codeckv/codecs/pca.py, stream_bytes):
   per row s of components y (B, S, r), the summed cost of the codes round(y / step[s]), each clamped to
   [-limit - 1, limit + 1], under model classes[c] - shift[s] of column c, from a table of integer costs
   (fixed-point bits). Integer sums are exact, so this and the torch reference agree on every row.

   Single-threaded; kernels/ans_cpu.py checks shapes, dtypes and bounds before calling.
*/
#include <stdint.h>
#include <stdlib.h>

#define PRECISION 24
#define WORD_BITS 32
#define ESCAPE_RANGE 65536
#define ESCAPE_FREQUENCY ((1u << PRECISION) / ESCAPE_RANGE)

typedef struct {
    const int32_t *codes;    /* (streams, length): each stream's codes in their natural (row-major) order */
    const int64_t *order;    /* (length,) natural position of the t-th symbol coded (class-major order) */
    const int32_t *classes;  /* (length,) base class of the t-th symbol */
    const int32_t *shift;    /* (streams,) each stream's class shift */
    const int32_t *offset;   /* (models,) M_k */
    const uint32_t *low;     /* (models * symbols,) each model's fixed-point cumulatives */
    const uint32_t *freq;    /* (models * symbols,) and frequencies */
    int64_t streams, length, models, symbols;
    uint32_t *words;         /* (streams, capacity): each stream's words */
    int64_t capacity;        /* at least ans_capacity(length) */
    int64_t *sizes;          /* (streams,) how many words each stream wrote */
} AnsEncode;

typedef struct {
    const float *y;          /* (batch, rows, columns), columns contiguous */
    int64_t y_b, y_s;        /* strides of the batch and the row (elements) */
    int64_t batch, rows, columns;
    const float *step;       /* (rows,) each row's quantizer step */
    const int32_t *shift;    /* (rows,) each row's class shift */
    const int32_t *classes;  /* (columns,) each column's class at shift 0 */
    const int32_t *costs;    /* (models * (2 limit + 3),) a code's fixed-point cost under each model */
    int64_t models, limit;
    int64_t *per_row;        /* (rows,) the summed cost of each row */
} AnsCosts;

/* The words a stream of `length` symbols may need: each symbol at most 24 bits, an escaped value 16 more,
   and the final state's two words. */
int64_t ans_capacity(int64_t length) { return (length * (PRECISION + 16) + WORD_BITS - 1) / WORD_BITS + 2; }

/* state / frequency and its remainder, exactly, through a double division: the state is below
   frequency * 2^40 when it is divided (push's renormalization), so the quotient is below 2^40 and the
   double's is within 1 of it; one correction step makes it exact (the divq it replaces is slow, and
   not pipelined on many CPUs). */
static inline uint64_t divide(uint64_t state, uint32_t frequency, uint64_t *remainder) {
    uint64_t q = (uint64_t)((double)state / (double)frequency);
    int64_t r = (int64_t)(state - q * frequency);
    if (r < 0) {
        q -= 1;
        r += frequency;
    } else if (r >= (int64_t)frequency) {
        q += 1;
        r -= frequency;
    }
    *remainder = (uint64_t)r;
    return q;
}

/* One encode step (AnsCoder.encode_symbol): a state that would overflow first writes its low word. */
static inline uint64_t push(uint64_t state, uint32_t cumulative, uint32_t frequency, uint32_t *words, int64_t *at) {
    if ((state >> (64 - PRECISION)) >= frequency) {
        words[(*at)++] = (uint32_t)state;
        state >>= WORD_BITS;
    }
    uint64_t remainder, quotient = divide(state, frequency, &remainder);
    return (quotient << PRECISION) | (cumulative + remainder);
}

#define LANES 4  /* streams coded in lockstep: their steps are independent, so their divisions overlap */

/* 0: done; 1: capacity below ans_capacity(length); 2: a class outside the models. */
int ans_encode(const AnsEncode *call) {
    const int64_t length = call->length, symbols = call->symbols;
    if (call->capacity < ans_capacity(length)) return 1;
    int64_t low_class = INT64_MAX, high_class = INT64_MIN, low_shift = INT64_MAX, high_shift = INT64_MIN;
    for (int64_t t = 0; t < length; t++) {  /* every model used is in range: min class - max shift, and so on */
        low_class = call->classes[t] < low_class ? call->classes[t] : low_class;
        high_class = call->classes[t] > high_class ? call->classes[t] : high_class;
    }
    for (int64_t s = 0; s < call->streams; s++) {
        low_shift = call->shift[s] < low_shift ? call->shift[s] : low_shift;
        high_shift = call->shift[s] > high_shift ? call->shift[s] : high_shift;
    }
    if (length > 0 && call->streams > 0 && (low_class - high_shift < 0 || high_class - low_shift >= call->models))
        return 2;
    for (int64_t first = 0; first < call->streams; first += LANES) {
        const int lanes = call->streams - first < LANES ? (int)(call->streams - first) : LANES;
        uint64_t state[LANES] = {0};
        int64_t at[LANES] = {0};
        const int32_t *codes[LANES];
        uint32_t *words[LANES];
        int32_t shift[LANES];
        for (int j = 0; j < lanes; j++) {
            codes[j] = call->codes + (first + j) * length;
            words[j] = call->words + (first + j) * call->capacity;
            shift[j] = call->shift[first + j];
            for (int64_t t = length - 1; t >= 0; t--) {  /* the escaped values, the last one first */
                int32_t m = call->offset[call->classes[t] - shift[j]], q = codes[j][call->order[t]];
                if (q > m || q < -m) {
                    int64_t v = (int64_t)q + ESCAPE_RANGE / 2;
                    v = v < 0 ? 0 : (v > ESCAPE_RANGE - 1 ? ESCAPE_RANGE - 1 : v);
                    state[j] = push(state[j], (uint32_t)v * ESCAPE_FREQUENCY, ESCAPE_FREQUENCY, words[j], &at[j]);
                }
            }
        }
        for (int64_t t = length - 1; t >= 0; t--) {  /* the symbols, the last one first */
            const int64_t position = call->order[t];
            const int32_t base = call->classes[t];
            for (int j = 0; j < lanes; j++) {
                const int32_t k = base - shift[j], m = call->offset[k], q = codes[j][position];
                const int64_t place = (int64_t)k * symbols + ((q > m || q < -m) ? 2 * m + 1 : q + m);
                state[j] = push(state[j], call->low[place], call->freq[place], words[j], &at[j]);
            }
        }
        for (int j = 0; j < lanes; j++) {  /* the final state, low word first */
            if (state[j] > 0) words[j][at[j]++] = (uint32_t)state[j];
            if ((state[j] >> WORD_BITS) > 0) words[j][at[j]++] = (uint32_t)(state[j] >> WORD_BITS);
            call->sizes[first + j] = at[j];
        }
    }
    return 0;
}

#if defined(__GNUC__) && !defined(__clang__)
#define SCALAR_LOOPS __attribute__((optimize("no-tree-vectorize")))
#else
#define SCALAR_LOOPS
#endif

/* sum of costs[place[c]]: scalar loads, two sums in flight. Vectorized, the compiler gathers (AVX2), which was
   slower on the CPU measured (an AMD EPYC: 0.96 ms against 0.74 ms for 2^20 codes). */
SCALAR_LOOPS static int64_t summed(const int32_t *costs, const int32_t *place, int64_t count) {
    int64_t even = 0, odd = 0, c = 0;
#if defined(__clang__)
#pragma clang loop vectorize(disable)
#endif
    for (; c + 1 < count; c += 2) {
        even += costs[place[c]];
        odd += costs[place[c + 1]];
    }
    if (c < count) even += costs[place[c]];
    return even + odd;
}

/* 0: done; 2: a class outside the models; 3: no memory. A row's codes are placed in the cost table first
   (a loop the compiler vectorizes: divide, clamp, round, add the column's base), then summed. The columns'
   bases are recomputed only where a row's shift differs from the row before's (most chunks share a rung). */
int ans_costs(const AnsCosts *call) {
    const int64_t width = 2 * call->limit + 3, columns = call->columns;
    const float bound = (float)(call->limit + 1);
    const float magic = 12582912.0f;  /* 1.5 * 2^23: (v + magic) - magic rounds |v| < 2^22 half to even */
    int32_t *base = malloc((size_t)(columns > 0 ? 2 * columns : 1) * sizeof(int32_t));
    if (base == NULL) return 3;
    int32_t *place = base + columns;
    for (int64_t s = 0; s < call->rows; s++) {
        for (int64_t c = 0; c < columns && (s == 0 || call->shift[s] != call->shift[s - 1]); c++) {
            int64_t k = (int64_t)call->classes[c] - call->shift[s];  /* where column c's q = 0 costs */
            if (k < 0 || k >= call->models) {
                free(base);
                return 2;
            }
            base[c] = (int32_t)(k * width + call->limit + 1);
        }
        const float step = call->step[s];
        int64_t sum = 0;
        for (int64_t b = 0; b < call->batch; b++) {
            const float *y = call->y + b * call->y_b + s * call->y_s;
            for (int64_t c = 0; c < columns; c++) {
                float v = y[c] / step;
                v = v < bound ? v : bound;  /* NaN becomes the bound: never an index outside the table */
                v = v > -bound ? v : -bound;
                place[c] = base[c] + (int32_t)((v + magic) - magic);
            }
            sum += summed(call->costs, place, columns);
        }
        call->per_row[s] = sum;
    }
    free(base);
    return 0;
}
