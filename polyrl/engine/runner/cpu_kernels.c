/* Fused CPU kernels for one decode pass of a Llama-family model (float32).

   Between its matrix products a decode pass is a chain of small operators (norms, RoPE,
   the K/V write, attention over each sequence's context, SiLU, sampling); run one by one
   through PyTorch each costs a dispatch and a pass over memory that outweigh its
   arithmetic when the model is small. Each function here does one such chain in a single
   pass over its rows. Compiled and loaded by cpu_kernels.py; used by fused_decode.py.

   Every function is plain C99 over contiguous row-major float32 buffers (attention's dot
   products use AVX2 intrinsics where the compiler targets them); the caller owns all
   memory. Reductions carry `omp simd` so the compiler may vectorise them.

   Threads: the per-row kernels (attention, SiLU-and-multiply, sampling) split their rows
   over `threads` OpenMP threads when every thread gets at least MIN_ROWS_PER_THREAD rows;
   each row's arithmetic is unchanged, so the results are bitwise those of one thread.
   Built with -fopenmp, the library needs libgomp.so.1, and the dynamic loader hands it
   the copy torch has already loaded: these loops run on the very threads torch's own
   operators and MKL's sgemm use (a second pool would fight them for the cores). Built
   without OpenMP (cpu_kernels.py's fallback), the pragmas are ignored and every kernel
   runs on the calling thread. Scratch that a row needs (attention scores, sampling work)
   comes as `threads` slices, one per thread. */

#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#define THREAD_ID ((int64_t)omp_get_thread_num())
#else
#define THREAD_ID ((int64_t)0)
#endif

#define MIN_ROWS_PER_THREAD 8 /* below this a thread's share costs more to hand out than it saves */

/* How many of `threads` threads a call over `rows` rows uses. */
static inline int64_t row_threads(int64_t threads, int64_t rows) {
    int64_t n = rows / MIN_ROWS_PER_THREAD;
    n = n < threads ? n : threads;
    return n > 1 ? n : 1;
}

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
void silu_mul(const float *restrict gu, float *restrict out, int64_t rows, int64_t inter, int64_t threads) {
    int64_t nt = row_threads(threads, rows);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
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

/* x rounded to bfloat16 (nearest, ties to even), as torch's float -> bfloat16 cast. */
static inline float round_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    u &= 0xFFFF0000u;
    memcpy(&x, &u, sizeof u);
    return x;
}

/* x (hd) replaced by what an int8 KV pool gives back for it (kv_int8.py's fake_quant, the
   same operations in the same order, so the same floats): s = bf16(max |x| / 127),
   q = clamp(rint(x / s), -127, 127), x = q s. */
static void fake_q8(float *restrict x, int64_t hd) {
    float m = 0.0f;
    for (int64_t i = 0; i < hd; i++) m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
    float stored = round_bf16(m / 127.0f), s = stored > 0.0f ? stored : 1.0f;
    for (int64_t i = 0; i < hd; i++) {
        float q = rintf(x[i] / s);
        q = q < -127.0f ? -127.0f : (q > 127.0f ? 127.0f : q);
        x[i] = q * stored;
    }
}

/* One decode token per sequence, for one layer:
     qkv   (S, (nh + 2 nkv) hd): [q heads | k heads | v heads] of the new token;
     cos_t, sin_t (P, hd): RoPE tables by position; pos (S,): the token's position;
     kc, vc: this layer's decode-cache rows (rows, nkv, L, hd), row of each sequence rows (S,);
   rotates q and k, writes k and v at [row, head, pos], and attends over positions
   0..pos of the row: out (S, nh hd). scores (threads x GROUP L floats) is scratch.
   kv_q8: the pool is int8, so the new k and v are written (and attended) as it gives them back. */
void rope_attend(const float *restrict qkv, int64_t S, int64_t nh, int64_t nkv, int64_t hd,
                 const float *restrict cos_t, const float *restrict sin_t, const int64_t *restrict pos,
                 const int64_t *restrict rows, float *restrict kc, float *restrict vc, int64_t L,
                 float *restrict out, float scale, float *restrict scores, int64_t kv_q8, int64_t threads) {
    int64_t width = (nh + 2 * nkv) * hd, rep = nh / nkv, nt = row_threads(threads, S);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t s = 0; s < S; s++) {
        float qr[GROUP * MAX_HEAD_DIM];
        float *sc = scores + THREAD_ID * GROUP * L; /* this thread's slice */
        int64_t p = pos[s];
        const float *c = cos_t + p * hd, *sn = sin_t + p * hd;
        const float *q = qkv + s * width, *k = q + nh * hd, *v = k + nkv * hd;
        for (int64_t h = 0; h < nkv; h++) {
            float *krow = kc + ((rows[s] * nkv + h) * L) * hd, *vrow = vc + ((rows[s] * nkv + h) * L) * hd;
            rope(k + h * hd, c, sn, krow + p * hd, hd);
            memcpy(vrow + p * hd, v + h * hd, (size_t)hd * sizeof(float));
            if (kv_q8) {
                fake_q8(krow + p * hd, hd);
                fake_q8(vrow + p * hd, hd);
            }
            for (int64_t r0 = 0; r0 < rep; r0 += GROUP) {
                int64_t g = rep - r0 < GROUP ? rep - r0 : GROUP, qh = h * rep + r0;
                float *o = out + s * nh * hd + qh * hd;
                for (int64_t r = 0; r < g; r++) {
                    rope(q + (qh + r) * hd, c, sn, qr + r * hd, hd);
#pragma omp simd
                    for (int64_t i = 0; i < hd; i++) qr[r * hd + i] *= scale;
                }
                switch (hd) { /* the common head sizes get fully unrolled loops */
                    case 32: attend_group(qr, g, krow, vrow, p, 32, sc, o); break;
                    case 64: attend_group(qr, g, krow, vrow, p, 64, sc, o); break;
                    case 128: attend_group(qr, g, krow, vrow, p, 128, sc, o); break;
                    default: attend_group(qr, g, krow, vrow, p, hd, sc, o);
                }
            }
        }
    }
}

/* Per row of logits (M, V): logprobs = log_softmax(logits / t) (untempered when t == 0),
   then the token: argmax when t == 0, else the first index whose cumulative probability
   (summed in double, as torch.cumsum does) reaches u * total (sampler.sample_batch's
   inverse CDF without truncation). Writes tokens (M,) and their logprobs (M,);
   work_all (threads x V floats) is scratch. */
void sample_rows(const float *restrict logits, int64_t M, int64_t V, const float *restrict temperature,
                 const double *restrict u, int64_t *restrict tokens, float *restrict token_logprobs,
                 float *restrict work_all, int64_t threads) {
    int64_t nt = row_threads(threads, M);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t i = 0; i < M; i++) {
        float *restrict work = work_all + THREAD_ID * V; /* this thread's slice */
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

/* decode_cache.py's write_back: the K/V at positions pos (n,) of cache rows to pool slots (n,),
   in every layer; entry i is in row rows[i % S] (n = passes x S, pass-major). Cache (layers,
   R, nkv, L, hd); pool (layers, pool_slots, nkv, hd). Returns 0, or 1 + the first entry whose
   row, position or slot is out of bounds (then nothing is copied). */
int64_t cache_to_pool(const float *restrict kc, const float *restrict vc, int64_t layers, int64_t R, int64_t nkv,
                      int64_t L, int64_t hd, const int64_t *restrict rows, int64_t S, const int64_t *restrict pos,
                      const int64_t *restrict slots, int64_t n, float *restrict pk, float *restrict pv,
                      int64_t pool_slots) {
    for (int64_t i = 0; i < n; i++) {
        int64_t r = rows[i % S];
        if (r < 0 || r >= R || pos[i] < 0 || pos[i] >= L || slots[i] < 0 || slots[i] >= pool_slots)
            return i + 1;
    }
    size_t bytes = (size_t)hd * sizeof(float);
    for (int64_t l = 0; l < layers; l++)
        for (int64_t i = 0; i < n; i++)
            for (int64_t h = 0; h < nkv; h++) {
                int64_t src = (((l * R + rows[i % S]) * nkv + h) * L + pos[i]) * hd;
                int64_t dst = ((l * pool_slots + slots[i]) * nkv + h) * hd;
                memcpy(pk + dst, kc + src, bytes);
                memcpy(pv + dst, vc + src, bytes);
            }
    return 0;
}

/* ---- int8 products (int8_linear.py) ----

   y (S, N) = beta * y + x (S, K) @ W^T * scales (+ bias), W int8 with one scale per output
   channel. Two schemes, fixed when the weight is packed (q8_weight.vnni):

   - vnni: int8 activations too. Each row of x is quantized on the fly to s8 with its own
     scale (max |x| / 127), stored offset by 128 as u8, and multiplied with VPDPBUSD
     (u8 x s8, four products summed straight into int32: no intermediate saturation); the
     offset comes back out as 128 * colsum[n]. Weights packed (Np/16, Kp/4, 16, 4): one
     64-byte load feeds 16 outputs x 4 inputs. Exact integer arithmetic while
     255 * 127 * Kp < 2^31 (int8_linear.py keeps K <= 65536).
   - otherwise weight-only: x stays float, weights are widened to float in registers,
     packed (Np/16, Kp, 16). No u8 x s8 pair products in int16 (VPMADDUBSW saturates at
     255 * 127 * 2 > 32767), so nothing can saturate.

   Both walk the weight once per tile of up to Q8_ROWS rows, block of 16 outputs outer, so
   a decode step (a few rows) reads every weight byte once. Single-threaded. */

#define Q8_ROWS 8

struct q8_weight {
    const int8_t *w;       /* packed as above, zero in the padding */
    const float *scale;    /* (N,) per output channel */
    const int32_t *colsum; /* (N,) sum over k of w[n, k] (the vnni scheme's offset correction) */
    int64_t N, K, Kp, vnni; /* Kp: K rounded up to 4 (vnni) */
};

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define Q8_VNNI 1
#include <immintrin.h>
#endif

/* 1 when this build has the vnni scheme (AVX-512 VNNI), else 0. */
int q8_vnni(void) {
#ifdef Q8_VNNI
    return 1;
#else
    return 0;
#endif
}

#ifdef Q8_VNNI
/* Rows of x (S, K) -> xq (S, Kp) u8 = clamp(round_even(x / s), -127, 127) + 128, padding 128;
   xs (S,) = s = max |x| / 127 (1 for an all-zero row). */
static void q8_quantize_rows(const float *restrict x, int64_t S, int64_t K, int64_t Kp, uint8_t *restrict xq,
                             float *restrict xs) {
    for (int64_t s = 0; s < S; s++) {
        const float *xi = x + s * K;
        uint8_t *qi = xq + s * Kp;
        float m = 0.0f;
#pragma omp simd reduction(max : m)
        for (int64_t k = 0; k < K; k++) m = fabsf(xi[k]) > m ? fabsf(xi[k]) : m;
        float scale = m > 0.0f ? m / 127.0f : 1.0f, inv = 1.0f / scale;
        const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127), off = _mm512_set1_epi32(128);
        int64_t k = 0;
        for (; k + 16 <= K; k += 16) { /* cvtps rounds half to even, as nearbyintf below */
            __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xi + k), _mm512_set1_ps(inv)));
            q = _mm512_add_epi32(_mm512_min_epi32(_mm512_max_epi32(q, lo), hi), off);
            _mm_storeu_si128((__m128i *)(qi + k), _mm512_cvtepi32_epi8(q));
        }
        for (; k < K; k++) {
            float v = nearbyintf(xi[k] * inv);
            v = v < -127.0f ? -127.0f : v > 127.0f ? 127.0f : v;
            qi[k] = (uint8_t)((int)v + 128);
        }
        for (; k < Kp; k++) qi[k] = 128;
        xs[s] = scale;
    }
}

/* R rows (a constant at each call site) of xq against output block nb. */
static inline __attribute__((always_inline)) void q8_tile_vnni(const struct q8_weight *q, const uint8_t *xq,
                                                               const float *xs, int64_t R, const float *bias,
                                                               float *y, float beta, int64_t nb) {
    int64_t groups = q->Kp / 4, n0 = nb * 16, N = q->N;
    const int8_t *wb = q->w + nb * groups * 64;
    __m512i acc[Q8_ROWS][2];
    for (int64_t r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
    int64_t g = 0;
    for (; g + 2 <= groups; g += 2) { /* two accumulators per row: the dpbusd chains overlap */
        __m512i w0 = _mm512_loadu_si512(wb + g * 64), w1 = _mm512_loadu_si512(wb + (g + 1) * 64);
        for (int64_t r = 0; r < R; r++) {
            int32_t x0, x1;
            memcpy(&x0, xq + r * q->Kp + g * 4, 4);
            memcpy(&x1, xq + r * q->Kp + g * 4 + 4, 4);
            acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], _mm512_set1_epi32(x0), w0);
            acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], _mm512_set1_epi32(x1), w1);
        }
    }
    if (g < groups) {
        __m512i w0 = _mm512_loadu_si512(wb + g * 64);
        for (int64_t r = 0; r < R; r++) {
            int32_t x0;
            memcpy(&x0, xq + r * q->Kp + g * 4, 4);
            acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], _mm512_set1_epi32(x0), w0);
        }
    }
    __mmask16 mask = N - n0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (N - n0)) - 1);
    __m512 ws = _mm512_maskz_loadu_ps(mask, q->scale + n0);
    __m512i off = _mm512_slli_epi32(_mm512_maskz_loadu_epi32(mask, q->colsum + n0), 7); /* 128 * colsum */
    __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + n0) : _mm512_setzero_ps();
    for (int64_t r = 0; r < R; r++) {
        __m512i t = _mm512_sub_epi32(_mm512_add_epi32(acc[r][0], acc[r][1]), off);
        __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_mul_ps(ws, _mm512_set1_ps(xs[r])), b);
        float *yr = y + r * N + n0;
        if (beta != 0.0f) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, yr));
        _mm512_mask_storeu_ps(yr, mask, v);
    }
}
#endif

/* 16 floats, 16 int8s: GCC/Clang vector extensions, lowered to whatever vectors the target has. */
typedef float q8_f16 __attribute__((vector_size(64)));
typedef int32_t q8_i16 __attribute__((vector_size(64)));
typedef int8_t q8_b16 __attribute__((vector_size(16)));

/* 16 int8 weights at p -> floats. gcc scalarises the generic conversion, hence the intrinsics. */
static inline __attribute__((always_inline)) q8_f16 q8_widen(const int8_t *p) {
#if defined(__AVX512F__)
    return (q8_f16)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
#elif defined(__AVX2__)
    __m128i b = _mm_loadu_si128((const __m128i *)p);
    __m256 halves[2] = {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)),
                        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)))};
    q8_f16 w;
    memcpy(&w, halves, sizeof w);
    return w;
#else
    q8_b16 b;
    memcpy(&b, p, 16);
    return __builtin_convertvector(__builtin_convertvector(b, q8_i16), q8_f16);
#endif
}

/* The weight-only scheme's tile: R float rows of x (S, K) against output block nb. */
static inline __attribute__((always_inline)) void q8_tile_float(const struct q8_weight *q, const float *x,
                                                                int64_t R, const float *bias, float *y, float beta,
                                                                int64_t nb) {
    int64_t K = q->K, n0 = nb * 16, n = q->N - n0 < 16 ? q->N - n0 : 16, k = 0;
    const int8_t *wb = q->w + nb * q->Kp * 16;
    q8_f16 acc[Q8_ROWS][2]; /* two partial sums per row (k even, odd): independent add chains */
    for (int64_t r = 0; r < R; r++) acc[r][0] = acc[r][1] = (q8_f16){0};
    for (; k + 2 <= K; k += 2) {
        q8_f16 w0 = q8_widen(wb + k * 16), w1 = q8_widen(wb + k * 16 + 16);
        for (int64_t r = 0; r < R; r++) {
            acc[r][0] += x[r * K + k] * w0;
            acc[r][1] += x[r * K + k + 1] * w1;
        }
    }
    if (k < K) {
        q8_f16 w0 = q8_widen(wb + k * 16);
        for (int64_t r = 0; r < R; r++) acc[r][0] += x[r * K + k] * w0;
    }
    for (int64_t r = 0; r < R; r++) {
        q8_f16 sum = acc[r][0] + acc[r][1];
        float *yr = y + r * q->N + n0;
        for (int64_t j = 0; j < n; j++) {
            float v = sum[j] * q->scale[n0 + j] + (bias ? bias[n0 + j] : 0.0f);
            yr[j] = beta != 0.0f ? yr[j] + v : v;
        }
    }
}

#define Q8_DISPATCH(TILE, R, Y, ...)                          \
    switch (R) { /* a constant row count per call: the tile's loops unroll */ \
        case 1: TILE(__VA_ARGS__, 1, bias, Y, beta, nb); break; \
        case 2: TILE(__VA_ARGS__, 2, bias, Y, beta, nb); break; \
        case 3: TILE(__VA_ARGS__, 3, bias, Y, beta, nb); break; \
        case 4: TILE(__VA_ARGS__, 4, bias, Y, beta, nb); break; \
        case 5: TILE(__VA_ARGS__, 5, bias, Y, beta, nb); break; \
        case 6: TILE(__VA_ARGS__, 6, bias, Y, beta, nb); break; \
        case 7: TILE(__VA_ARGS__, 7, bias, Y, beta, nb); break; \
        default: TILE(__VA_ARGS__, 8, bias, Y, beta, nb);       \
    }

/* y (S, N) = beta * y + x (S, K) @ W^T (+ bias), beta 0 or 1; xq (S, Kp) bytes and xs (S,)
   floats are scratch (vnni only). Returns 0, or -1 for a vnni-packed weight in a build
   without VNNI. */
int q8_matmul(const struct q8_weight *q, const float *x, int64_t S, const float *bias, float *y, float beta,
              uint8_t *xq, float *xs) {
    int64_t blocks = (q->N + 15) / 16;
    if (q->vnni) {
#ifdef Q8_VNNI
        q8_quantize_rows(x, S, q->K, q->Kp, xq, xs);
        for (int64_t nb = 0; nb < blocks; nb++) /* a block's weights stay in cache across row tiles */
            for (int64_t s = 0; s < S; s += Q8_ROWS) {
                int64_t rows = S - s < Q8_ROWS ? S - s : Q8_ROWS;
                Q8_DISPATCH(q8_tile_vnni, rows, y + s * q->N, q, xq + s * q->Kp, xs + s)
            }
        return 0;
#else
        return -1;
#endif
    }
    for (int64_t nb = 0; nb < blocks; nb++)
        for (int64_t s = 0; s < S; s += Q8_ROWS) {
            int64_t rows = S - s < Q8_ROWS ? S - s : Q8_ROWS;
            Q8_DISPATCH(q8_tile_float, rows, y + s * q->N, q, x + s * q->K)
        }
    return 0;
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

/* One layer's weights: norms (D,), products as (in, out) row-major copies, biases (out,) or NULL;
   an int8 engine's products as q8 weights instead (their float copies then NULL). */
struct decode_layer {
    const float *norm1, *wqkv, *bqkv, *wo, *bo, *norm2, *wgu, *bgu, *wdown, *bdown;
    const struct q8_weight *qqkv, *qo, *qgu, *qdown;
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
    /* scratch: x, h (S, D); qkv (S, (nh + 2 nkv) hd); attn (S, nh hd); gu (S, 2 inter); act (S, inter); scores (threads x GROUP L) */
    float *x, *h, *qkv, *attn, *gu, *act, *scores;
    const struct q8_weight *qhead; /* the int8 head, or NULL */
    uint8_t *xq; float *xs;        /* q8_matmul's scratch: (S, widest Kp) bytes, (S,) floats */
    int64_t kv_q8;                 /* rope_attend's kv_q8: an int8 KV pool */
    int64_t threads;               /* the per-row kernels' threads (scores: that many slices) */
};

/* y (S, n) = beta * y + x (S, k) @ w (k, n) (+ bias): row-major, so sgemm computes y^T = w^T x^T.
   With an int8 weight q, q8_matmul instead. */
static void product(const struct decode_args *a, const struct q8_weight *q, const float *x, const float *w,
                    const float *bias, float *y, int64_t S, int64_t k, int64_t n, float beta) {
    if (q) {
        q8_matmul(q, x, S, bias, y, beta, a->xq, a->xs);
        return;
    }
    sgemm_fn sgemm = a->sgemm;
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
        product(a, w->qqkv, a->h, w->wqkv, w->bqkv, a->qkv, S, D, qkv_w, 0.0f);
        rope_attend(a->qkv, S, a->nh, a->nkv, a->hd, a->cos_t, a->sin_t, a->pos, a->rows,
                    a->kc + i * a->layer_stride, a->vc + i * a->layer_stride, a->L, a->attn, a->scale, a->scores,
                    a->kv_q8, a->threads);
        product(a, w->qo, a->attn, w->wo, w->bo, a->x, S, a->nh * a->hd, D, 1.0f);
        rms_norm(a->x, w->norm2, a->h, S, D, a->eps);
        product(a, w->qgu, a->h, w->wgu, w->bgu, a->gu, S, D, 2 * a->inter, 0.0f);
        silu_mul(a->gu, a->act, S, a->inter, a->threads);
        product(a, w->qdown, a->act, w->wdown, w->bdown, a->x, S, a->inter, D, 1.0f);
    }
    rms_norm(a->x, a->final_norm, a->h, S, D, a->eps);
    product(a, a->qhead, a->h, a->whead, a->bhead, a->logits, S, D, a->V, 0.0f);
}

/* A decode burst (decode_backend.py): up to K passes back to back, each sampling (sample_rows,
   noise u (K, S)) the next pass's input tokens, until every sequence has sampled a stop id
   (stop (S, m), padded with -1) or reached its last kept pass (keep (S,)). a->ids holds the
   first pass's tokens; pos (K, S) the positions. Writes tokens and logprobs (K, S) and
   returns the passes run. a->logits is scratch here (S, V); work (threads x V floats) and done
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
        sample_rows(p.logits, S, a->V, temperature, u + k * S, out, logprobs + k * S, work, a->threads);
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
