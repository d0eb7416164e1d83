/* Fused CPU kernels for one decode pass of a Llama-family model (float32, one thread).

   Between its matrix products a decode pass is a chain of small operators (norms, RoPE,
   the K/V write, attention over each sequence's context, SiLU, sampling); run one by one
   through PyTorch each costs a dispatch and a pass over memory that outweigh its
   arithmetic when the model is small. Each function here does one such chain in a single
   pass over its rows. Compiled and loaded by cpu_kernels.py; used by fused_decode.py.

   Every function is plain C99 over contiguous row-major float32 buffers; the caller owns
   all memory. Reductions carry `omp simd` so the compiler may vectorise them
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

/* out = silu(gate) * up = gate / (1 + exp(-gate)) * up, where gu rows are [gate (inter) | up (inter)]. */
void silu_mul(const float *restrict gu, float *restrict out, int64_t rows, int64_t inter) {
    for (int64_t i = 0; i < rows; i++) {
        const float *g = gu + i * 2 * inter, *u = g + inter;
        float *o = out + i * inter;
#pragma omp simd
        for (int64_t j = 0; j < inter; j++) o[j] = g[j] / (1.0f + fast_exp(-g[j])) * u[j];
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

/* softmax(q . K[0..p]) V[0..p] for one query head (q already scaled): out (hd,).
   Inlined with a constant hd at the call sites below, so its loops unroll fully. */
static inline __attribute__((always_inline)) void attend_head(
        const float *restrict q, const float *restrict krow, const float *restrict vrow, int64_t p, int64_t hd,
        float *restrict scores, float *restrict out) {
    float m = -INFINITY;
    for (int64_t j = 0; j <= p; j++) {
        const float *kj = krow + j * hd;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t i = 0; i < hd; i++) dot += q[i] * kj[i];
        scores[j] = dot;
        m = dot > m ? dot : m;
    }
    float total = 0.0f;
#pragma omp simd reduction(+ : total)
    for (int64_t j = 0; j <= p; j++) {
        scores[j] = fast_exp(scores[j] - m);
        total += scores[j];
    }
    float acc[hd];
#pragma omp simd
    for (int64_t i = 0; i < hd; i++) acc[i] = 0.0f;
    for (int64_t j = 0; j <= p; j++) {
        const float *vj = vrow + j * hd;
        float wj = scores[j];
#pragma omp simd
        for (int64_t i = 0; i < hd; i++) acc[i] += wj * vj[i];
    }
    float inv = 1.0f / total;
#pragma omp simd
    for (int64_t i = 0; i < hd; i++) out[i] = acc[i] * inv;
}

/* One decode token per sequence, for one layer:
     qkv   (S, (nh + 2 nkv) hd): [q heads | k heads | v heads] of the new token;
     cos_t, sin_t (P, hd): RoPE tables by position; pos (S,): the token's position;
     kc, vc: this layer's decode-cache rows (rows, nkv, L, hd), row of each sequence rows (S,);
   rotates q and k, writes k and v at [row, head, pos], and attends over positions
   0..pos of the row: out (S, nh hd). scores (>= pos + 1 floats) is scratch. */
void rope_attend(const float *restrict qkv, int64_t S, int64_t nh, int64_t nkv, int64_t hd,
                 const float *restrict cos_t, const float *restrict sin_t, const int64_t *restrict pos,
                 const int64_t *restrict rows, float *restrict kc, float *restrict vc, int64_t L,
                 float *restrict out, float scale, float *restrict scores) {
    int64_t width = (nh + 2 * nkv) * hd, rep = nh / nkv;
    float qr[512];
    for (int64_t s = 0; s < S; s++) {
        int64_t p = pos[s];
        const float *c = cos_t + p * hd, *sn = sin_t + p * hd;
        const float *q = qkv + s * width, *k = q + nh * hd, *v = k + nkv * hd;
        for (int64_t h = 0; h < nkv; h++) {
            float *krow = kc + ((rows[s] * nkv + h) * L) * hd, *vrow = vc + ((rows[s] * nkv + h) * L) * hd;
            rope(k + h * hd, c, sn, krow + p * hd, hd);
            memcpy(vrow + p * hd, v + h * hd, (size_t)hd * sizeof(float));
            for (int64_t r = 0; r < rep; r++) {
                int64_t qh = h * rep + r;
                float *o = out + s * nh * hd + qh * hd;
                rope(q + qh * hd, c, sn, qr, hd);
#pragma omp simd
                for (int64_t i = 0; i < hd; i++) qr[i] *= scale;
                switch (hd) { /* the common head sizes get fully unrolled loops */
                    case 32: attend_head(qr, krow, vrow, p, 32, scores, o); break;
                    case 64: attend_head(qr, krow, vrow, p, 64, scores, o); break;
                    case 128: attend_head(qr, krow, vrow, p, 128, scores, o); break;
                    default: attend_head(qr, krow, vrow, p, hd, scores, o);
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
