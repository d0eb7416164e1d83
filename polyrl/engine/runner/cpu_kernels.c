/* Fused CPU kernels for one decode pass of a Llama-family model (float32, one thread, apart
   from the BLAS sgemm that decode_pass calls, which uses the threads torch gives MKL).

   Between its matrix products a decode pass is a chain of small operators (norms, RoPE,
   the K/V write, attention over each sequence's context, SiLU, sampling); run one by one
   through PyTorch each costs a dispatch and a pass over memory that outweigh its
   arithmetic when the model is small. Each function here does one such chain in a single
   pass over its rows. Compiled and loaded by cpu_kernels.py; used by fused_decode.py.

   Every function is plain C99 over contiguous row-major float32 buffers (attention's dot
   products use AVX2 intrinsics where the compiler targets them); the caller owns all
   memory. Reductions carry `omp simd` so the compiler may vectorise them
   (-fopenmp-simd: no OpenMP runtime is linked). */

#include <math.h>
#include <stdint.h>
#include <string.h>

/* exp(x) for finite x, to within a few ulp over [-87, 88] and clamped outside it
   (Cephes' expf polynomial): 2^n * p(r), with x = n ln2 + r, |r| <= ln2 / 2.
   Branch-free, so loops over it vectorise. Callers pass finite values only. */
static inline float fast_exp(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest: 1.5 * 2^23 */
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { int32_t i; float f; } scale = { .i = ((int32_t)n + 127) << 23 };
    return p * scale.f;
}

/* y[i] = x[i] / sqrt(mean(x[i]^2) + eps) * w, rows of d. */
void rms_norm(const float *restrict x, const float *restrict w, float *restrict y, int64_t rows, int64_t d,
              float eps) {
    for (int64_t i = 0; i < rows; i++) {
        const float *xi = x + i * d;
        float *yi = y + i * d;
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int64_t j = 0; j < d; j++) ss += xi[j] * xi[j];
        float r = 1.0f / sqrtf(ss / (float)d + eps);
#pragma omp simd
        for (int64_t j = 0; j < d; j++) yi[j] = xi[j] * r * w[j];
    }
}

/* out = silu(gate) * up = gate / (1 + exp(-gate)) * up, where gu rows are [gate (inter) | up (inter)].
   Two loops on purpose: fused into one, gcc vectorises fast_exp's clamp as a select and
   computes the division on both arms, and the clamped arm (gate / e^88) makes subnormal
   floats for ordinary gates, each of which can cost x86 CPUs a microcode assist. */
void silu_mul(const float *restrict gu, float *restrict out, int64_t rows, int64_t inter) {
    for (int64_t i = 0; i < rows; i++) {
        const float *g = gu + i * 2 * inter, *u = g + inter;
        float *o = out + i * inter;
#pragma omp simd
        for (int64_t j = 0; j < inter; j++) o[j] = fast_exp(-g[j]);
#pragma omp simd
        for (int64_t j = 0; j < inter; j++) o[j] = g[j] / (1.0f + o[j]) * u[j];
    }
}

/* x * cos + roll(x, hd/2) * sin, sin's first half negated (transformer.py's apply_rope). */
static inline void rope(const float *restrict x, const float *restrict c, const float *restrict s,
                        float *restrict y, int64_t hd) {
    int64_t half = hd / 2;
#pragma omp simd
    for (int64_t i = 0; i < half; i++) y[i] = x[i] * c[i] + x[i + half] * s[i];
#pragma omp simd
    for (int64_t i = half; i < hd; i++) y[i] = x[i] * c[i] + x[i - half] * s[i];
}

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/* The 8 dot products q . k[j] of q (hd,) with 8 consecutive rows k[j] = k + j hd (hd a
   multiple of 8), as one vector: vertical FMAs per row, then one transposing reduction
   instead of a horizontal sum per row. */
static inline __m256 dot8(const float *restrict q, const float *restrict k, int64_t hd) {
    __m256 a[8];
    for (int j = 0; j < 8; j++) a[j] = _mm256_setzero_ps();
    for (int64_t i = 0; i < hd; i += 8) {
        __m256 qi = _mm256_loadu_ps(q + i);
        for (int j = 0; j < 8; j++) a[j] = _mm256_fmadd_ps(qi, _mm256_loadu_ps(k + j * hd + i), a[j]);
    }
    /* hadd(x, y) = [x0+x1, x2+x3, y0+y1, y2+y3 | x4+x5, x6+x7, y4+y5, y6+y7]: two levels leave
       the rows' sums over each 128-bit half, in row order; adding the halves finishes them. */
    __m256 s0123 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    __m256 s4567 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31));
}
#endif

#define GROUP 4 /* query heads attended together over one K/V head (GQA) */
#define MAX_HEAD_DIM 512

/* softmax(q_r . K[0..p]) V[0..p] for g <= GROUP query heads q (g, hd) (already scaled) that
   share one K/V head: out (g, hd). Each K and V position is read once for all g heads.
   scores (>= g (p + 1) floats) is scratch.
   Inlined with a constant hd at the call sites below, so its loops unroll fully. */
static inline __attribute__((always_inline)) void attend_group(
        const float *restrict q, int64_t g, const float *restrict krow, const float *restrict vrow, int64_t p,
        int64_t hd, float *restrict scores, float *restrict out) {
    int64_t n = p + 1, j = 0;
#if defined(__AVX2__) && defined(__FMA__)
    if (hd % 8 == 0)
        for (; j + 8 <= n; j += 8)
            for (int64_t r = 0; r < g; r++) _mm256_storeu_ps(scores + r * n + j, dot8(q + r * hd, krow + j * hd, hd));
#endif
    for (; j < n; j++) {
        const float *kj = krow + j * hd;
        for (int64_t r = 0; r < g; r++) {
            const float *qr = q + r * hd;
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int64_t i = 0; i < hd; i++) dot += qr[i] * kj[i];
            scores[r * n + j] = dot;
        }
    }
    float inv[GROUP];
    for (int64_t r = 0; r < g; r++) {
        float *sr = scores + r * n, m = -INFINITY, total = 0.0f;
#pragma omp simd reduction(max : m)
        for (int64_t j = 0; j < n; j++) m = sr[j] > m ? sr[j] : m;
#pragma omp simd reduction(+ : total)
        for (int64_t j = 0; j < n; j++) {
            sr[j] = fast_exp(sr[j] - m);
            total += sr[j];
        }
        inv[r] = 1.0f / total;
    }
    float acc[GROUP * MAX_HEAD_DIM];
    for (int64_t i = 0; i < g * hd; i++) acc[i] = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        const float *vj = vrow + j * hd;
        for (int64_t r = 0; r < g; r++) {
            float wj = scores[r * n + j], *ar = acc + r * hd;
#pragma omp simd
            for (int64_t i = 0; i < hd; i++) ar[i] += wj * vj[i];
        }
    }
    for (int64_t r = 0; r < g; r++)
#pragma omp simd
        for (int64_t i = 0; i < hd; i++) out[r * hd + i] = acc[r * hd + i] * inv[r];
}

/* One decode token per sequence, for one layer:
     qkv   (S, (nh + 2 nkv) hd): [q heads | k heads | v heads] of the new token;
     cos_t, sin_t (P, hd): RoPE tables by position; pos (S,): the token's position;
     kc, vc: this layer's decode-cache rows (rows, nkv, L, hd), row of each sequence rows (S,);
   rotates q and k, writes k and v at [row, head, pos], and attends over positions
   0..pos of the row: out (S, nh hd). scores (>= GROUP (pos + 1) floats) is scratch. */
void rope_attend(const float *restrict qkv, int64_t S, int64_t nh, int64_t nkv, int64_t hd,
                 const float *restrict cos_t, const float *restrict sin_t, const int64_t *restrict pos,
                 const int64_t *restrict rows, float *restrict kc, float *restrict vc, int64_t L,
                 float *restrict out, float scale, float *restrict scores) {
    int64_t width = (nh + 2 * nkv) * hd, rep = nh / nkv;
    float qr[GROUP * MAX_HEAD_DIM];
    for (int64_t s = 0; s < S; s++) {
        int64_t p = pos[s];
        const float *c = cos_t + p * hd, *sn = sin_t + p * hd;
        const float *q = qkv + s * width, *k = q + nh * hd, *v = k + nkv * hd;
        for (int64_t h = 0; h < nkv; h++) {
            float *krow = kc + ((rows[s] * nkv + h) * L) * hd, *vrow = vc + ((rows[s] * nkv + h) * L) * hd;
            rope(k + h * hd, c, sn, krow + p * hd, hd);
            memcpy(vrow + p * hd, v + h * hd, (size_t)hd * sizeof(float));
            for (int64_t r0 = 0; r0 < rep; r0 += GROUP) {
                int64_t g = rep - r0 < GROUP ? rep - r0 : GROUP, qh = h * rep + r0;
                float *o = out + s * nh * hd + qh * hd;
                for (int64_t r = 0; r < g; r++) {
                    rope(q + (qh + r) * hd, c, sn, qr + r * hd, hd);
#pragma omp simd
                    for (int64_t i = 0; i < hd; i++) qr[r * hd + i] *= scale;
                }
                switch (hd) { /* the common head sizes get fully unrolled loops */
                    case 32: attend_group(qr, g, krow, vrow, p, 32, scores, o); break;
                    case 64: attend_group(qr, g, krow, vrow, p, 64, scores, o); break;
                    case 128: attend_group(qr, g, krow, vrow, p, 128, scores, o); break;
                    default: attend_group(qr, g, krow, vrow, p, hd, scores, o);
                }
            }
        }
    }
}

/* Per row of logits (M, V): logprobs = log_softmax(logits / t) (untempered when t == 0),
   then the token: argmax when t == 0, else the first index whose cumulative probability
   (summed in double, as torch.cumsum does) reaches u * total (sampler.sample_batch's
   inverse CDF without truncation). Writes tokens (M,) and their logprobs (M,);
   work (>= V floats) is scratch. */
void sample_rows(const float *restrict logits, int64_t M, int64_t V, const float *restrict temperature,
                 const double *restrict u, int64_t *restrict tokens, float *restrict token_logprobs,
                 float *restrict work) {
    for (int64_t i = 0; i < M; i++) {
        const float *x = logits + i * V;
        int greedy = temperature[i] == 0.0f;
        float t = greedy ? 1.0f : temperature[i];
        float m = -INFINITY;
#pragma omp simd reduction(max : m)
        for (int64_t j = 0; j < V; j++) {
            work[j] = x[j] / t;
            m = work[j] > m ? work[j] : m;
        }
        float total = 0.0f;
#pragma omp simd reduction(+ : total)
        for (int64_t j = 0; j < V; j++) total += fast_exp(work[j] - m);
        float lse = m + logf(total);
        int64_t tok = 0;
        if (greedy) {
            while (tok < V - 1 && work[tok] != m) tok++; /* the first maximum, as argmax */
        } else {
#pragma omp simd
            for (int64_t j = 0; j < V; j++) work[j] = fast_exp(work[j] - lse);
            double cdf = 0.0;
            for (int64_t j = 0; j < V; j++) {
                cdf += (double)work[j];
                work[j] = (float)cdf;
            }
            float target = (float)(u[i] * (double)work[V - 1]);
            tok = V - 1;
            for (int64_t j = 0; j < V; j++) {
                if (work[j] >= target) { tok = j; break; }
            }
        }
        token_logprobs[i] = x[tok] / t - lse;
        tokens[i] = tok;
    }
}

/* decode_cache.py's write_back: the K/V at positions pos (n,) of cache rows rows (n,) to pool
   slots (n,), in every layer. Cache (layers, R, nkv, L, hd); pool (layers, pool_slots, nkv, hd). */
void cache_to_pool(const float *restrict kc, const float *restrict vc, int64_t layers, int64_t R, int64_t nkv,
                   int64_t L, int64_t hd, const int64_t *restrict rows, const int64_t *restrict pos,
                   const int64_t *restrict slots, int64_t n, float *restrict pk, float *restrict pv,
                   int64_t pool_slots) {
    size_t bytes = (size_t)hd * sizeof(float);
    for (int64_t l = 0; l < layers; l++)
        for (int64_t i = 0; i < n; i++)
            for (int64_t h = 0; h < nkv; h++) {
                int64_t src = (((l * R + rows[i]) * nkv + h) * L + pos[i]) * hd;
                int64_t dst = ((l * pool_slots + slots[i]) * nkv + h) * hd;
                memcpy(pk + dst, kc + src, bytes);
                memcpy(pv + dst, vc + src, bytes);
            }
}

/* ---- The whole decode pass in one call (models whose weights are all small) ----

   Python's loop over layers pays an operator dispatch per call, a sizeable share of a
   small model's pass. decode_pass runs the same chain, embedding to logits, in one call:
   the matrix products go to the BLAS sgemm (Fortran interface, column-major) whose
   address the caller passes, the same routine torch.mm reaches on CPU builds with MKL;
   the rest are the kernels above. */

typedef void (*sgemm_fn)(const char *transa, const char *transb, const int *m, const int *n, const int *k,
                         const float *alpha, const float *a, const int *lda, const float *b, const int *ldb,
                         const float *beta, float *c, const int *ldc);

/* One layer's weights: norms (D,), products as (in, out) row-major copies, biases (out,) or NULL. */
struct decode_layer {
    const float *norm1, *wqkv, *bqkv, *wo, *bo, *norm2, *wgu, *bgu, *wdown, *bdown;
};

struct decode_args {
    sgemm_fn sgemm;
    const struct decode_layer *layers;
    int64_t n_layers, S, D, nh, nkv, hd, inter, V, L, layer_stride; /* layer_stride: floats between layers' caches */
    float eps, scale;
    const float *embed;          /* (vocab, D) */
    const int64_t *ids, *pos, *rows; /* (S,) each */
    const float *cos_t, *sin_t;  /* (P, hd) */
    float *kc, *vc;              /* layer 0's cache rows; layer i at + i * layer_stride */
    const float *final_norm, *whead, *bhead; /* whead (D, V) */
    float *logits;               /* (S, V) out */
    /* scratch: x, h (S, D); qkv (S, (nh + 2 nkv) hd); attn (S, nh hd); gu (S, 2 inter); act (S, inter); scores (GROUP L) */
    float *x, *h, *qkv, *attn, *gu, *act, *scores;
};

/* y (S, n) = beta * y + x (S, k) @ w (k, n) (+ bias): row-major, so sgemm computes y^T = w^T x^T. */
static void product(sgemm_fn sgemm, const float *x, const float *w, const float *bias, float *y, int64_t S,
                    int64_t k, int64_t n, float beta) {
    const int m_ = (int)n, n_ = (int)S, k_ = (int)k;
    const float one = 1.0f;
    sgemm("N", "N", &m_, &n_, &k_, &one, w, &m_, x, &k_, &beta, y, &m_);
    if (bias)
        for (int64_t s = 0; s < S; s++) {
            float *ys = y + s * n;
#pragma omp simd
            for (int64_t j = 0; j < n; j++) ys[j] += bias[j];
        }
}

void decode_pass(const struct decode_args *a) {
    int64_t S = a->S, D = a->D, qkv_w = (a->nh + 2 * a->nkv) * a->hd;
    for (int64_t s = 0; s < S; s++) memcpy(a->x + s * D, a->embed + a->ids[s] * D, (size_t)D * sizeof(float));
    for (int64_t i = 0; i < a->n_layers; i++) {
        const struct decode_layer *w = a->layers + i;
        rms_norm(a->x, w->norm1, a->h, S, D, a->eps);
        product(a->sgemm, a->h, w->wqkv, w->bqkv, a->qkv, S, D, qkv_w, 0.0f);
        rope_attend(a->qkv, S, a->nh, a->nkv, a->hd, a->cos_t, a->sin_t, a->pos, a->rows,
                    a->kc + i * a->layer_stride, a->vc + i * a->layer_stride, a->L, a->attn, a->scale, a->scores);
        product(a->sgemm, a->attn, w->wo, w->bo, a->x, S, a->nh * a->hd, D, 1.0f);
        rms_norm(a->x, w->norm2, a->h, S, D, a->eps);
        product(a->sgemm, a->h, w->wgu, w->bgu, a->gu, S, D, 2 * a->inter, 0.0f);
        silu_mul(a->gu, a->act, S, a->inter);
        product(a->sgemm, a->act, w->wdown, w->bdown, a->x, S, a->inter, D, 1.0f);
    }
    rms_norm(a->x, a->final_norm, a->h, S, D, a->eps);
    product(a->sgemm, a->h, a->whead, a->bhead, a->logits, S, D, a->V, 0.0f);
}

/* A decode burst (decode_backend.py): up to K passes back to back, each sampling (sample_rows,
   noise u (K, S)) the next pass's input tokens, until every sequence has sampled a stop id
   (stop (S, m), padded with -1) or reached its last kept pass (keep (S,)). a->ids holds the
   first pass's tokens; pos (K, S) the positions. Writes tokens and logprobs (K, S) and
   returns the passes run. a->logits is scratch here (S, V); work (>= V floats) and done
   (S bytes) too. */
int64_t decode_burst(const struct decode_args *a, int64_t K, const int64_t *pos, const float *temperature,
                     const double *u, const int64_t *stop, int64_t m, const int64_t *keep, int64_t *tokens,
                     float *logprobs, float *work, unsigned char *done) {
    struct decode_args p = *a;
    int64_t S = a->S;
    memset(done, 0, (size_t)S);
    for (int64_t k = 0; k < K; k++) {
        p.pos = pos + k * S;
        decode_pass(&p);
        int64_t *out = tokens + k * S;
        sample_rows(p.logits, S, a->V, temperature, u + k * S, out, logprobs + k * S, work);
        p.ids = out;
        int all = 1;
        for (int64_t s = 0; s < S; s++) {
            if (!done[s]) {
                int hit = keep[s] <= k + 1;
                for (int64_t j = 0; j < m && !hit; j++) hit = stop[s * m + j] == out[s];
                done[s] = (unsigned char)hit;
            }
            all &= done[s];
        }
        if (all) return k + 1;
    }
    return K;
}
