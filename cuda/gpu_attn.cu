/* gpu_attn.cu: causal multi-head self-attention on the GPU (gpu_attn.h), mgtrain's own kernels,
 * FlashAttention's order of work (Dao et al. 2022): no t x t matrix is stored, per head or at all.
 *
 * Forward, one warp a query (sequence b, head h, position i; kWarps queries of one (b, h) a
 * block): the query's d values in shared memory; the keys taken 32 at a time, one a lane, each
 * lane forming its key's score s = (q . k) / sqrt(d) (a float sum in order, as one row of the
 * CPU's GEMM) and the warp an online softmax over them: the running maximum m and sum of
 * exponentials l, the output accumulator rescaled by e^(m_old - m_new) when the maximum grows,
 * then O += sum_j p_j v_j with the lanes over the value channels (d <= kMaxD: up to kMaxD / 32
 * accumulators a lane, in registers). y = O / l; lse = m + log l is kept for backward. Causal
 * keys after the query are never read. Dropout multiplies a weight by its keep mask (backend.h:
 * the counter of (sample, head, i, j)) after the sum, as the CPU does.
 *
 * Backward, FlashAttention-2's recomputation from lse, in two kernels so that every gradient has
 * one writer (no atomics: the same bits on every run):
 *   dQ: one warp a query i, over its keys j: p = e^(s - lse_i), dP = dO_i . v_j,
 *       dS = p (dP keep - D_i), dq_i = sum_j dS k_j / sqrt(d), D_i = dO_i . O_i (in double, in
 *       order, as the CPU forms it), kept in the scratch (n heads t floats) for the next kernel;
 *   dK, dV: one warp a key j, over its queries i >= j (all of them without the causal mask), one
 *       a lane: the same p, dP and dS, dv_j = sum_i p keep dO_i, dk_j = sum_i dS q_i / sqrt(d).
 * Each pair's score and dP are formed twice (once per kernel): a first version, correct and
 * deterministic; a tiled one (the keys of a block in shared memory, tensor cores) is the next
 * step for speed.
 *
 * Generation (attn_decode): the forward's warp on one query against the key and value cache. */
#include "gpu_launch.h"
#include "gpu_vec.h"
#include "util.h"

namespace {

/* Queries (or keys) a block, one a warp; the most channels a head may have. */
constexpr int kWarps = 4, kMaxD = 256, kPer = kMaxD / 32;

__device__ inline float warp_sum_f(float v) {
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(kFull, v, o);
    return v;
}

/* The dropout keep scale of weight (sample seq, head h, query i, key j) (backend.h). */
__device__ inline float attn_keep(const mgt_attn_shape &s, uint64_t seq, int h, int i, int j) {
    const uint64_t ctr =
        (((s.first_sample + seq) * (uint64_t)s.heads + (uint64_t)h) * (uint64_t)s.t + (uint64_t)i) *
            (uint64_t)s.t +
        (uint64_t)j;
    return mgt_uniform(s.key, ctr) >= s.rate ? 1.0f / (1.0f - s.rate) : 0.0f;
}

/* The block's (sequence, head) and this warp's row (query or key) in it: blocks run over
 * (sequence, head, tile of kWarps rows). */
struct place {
    int b, h, row;
};
__device__ inline place place_of(const mgt_attn_shape &s) {
    const int tiles = (s.t + kWarps - 1) / kWarps;
    const int tile = blockIdx.x % tiles, bh = blockIdx.x / tiles;
    return {bh / s.heads, bh % s.heads, tile * kWarps + (int)(threadIdx.x / 32)};
}

/* Scale times the dot product of d floats a (shared) and d values b (global), in order. */
template <class T> __device__ inline float dot_scaled(const float *a, const T *b, int d, float sc) {
    float acc = 0.0f;
    for (int e = 0; e < d; e++)
        acc += a[e] * widen(b[e]);
    return sc * acc;
}

/* One query's attention over nkeys keys (rows of k and v, ld apart), by the calling warp:
 * qs its query in shared memory, y (d values) and, unless NULL, *lse written. Dropout where
 * s.rate > 0 (seq, h, i: the weight's place for its mask). ws: the warp's 32 floats of shared
 * memory. */
template <class T>
__device__ void attend(const float *qs, const T *k, const T *v, size_t ld, int nkeys, int d,
                       float scale, const mgt_attn_shape &s, uint64_t seq, int h, int i, T *y,
                       float *lse, float *ws) {
    const int lane = threadIdx.x & 31;
    float m = -INFINITY, l = 0.0f, acc[kPer];
    for (int q = 0; q < kPer; q++)
        acc[q] = 0.0f;
    const bool drop = s.rate > 0.0f;
    for (int j0 = 0; j0 < nkeys; j0 += 32) {
        const int j = j0 + lane, bk = nkeys - j0 < 32 ? nkeys - j0 : 32;
        const float sc = j < nkeys ? dot_scaled(qs, k + (size_t)j * ld, d, scale) : -INFINITY;
        const float mn = fmaxf(m, warp_max(sc));
        const float corr = mn == -INFINITY ? 1.0f : expf(m - mn);
        const float p = j < nkeys ? expf(sc - mn) : 0.0f;
        l = l * corr + warp_sum_f(p);
        m = mn;
        ws[lane] = drop && j < nkeys ? p * attn_keep(s, seq, h, i, j) : p;
        __syncwarp();
        for (int q = 0; q < kPer; q++) {
            const int e = lane + 32 * q;
            if (e >= d)
                break;
            float a = acc[q] * corr;
            for (int jj = 0; jj < bk; jj++)
                a += ws[jj] * widen(v[(size_t)(j0 + jj) * ld + e]);
            acc[q] = a;
        }
        __syncwarp();
    }
    const float inv = 1.0f / l;
    for (int q = 0; q < kPer; q++) {
        const int e = lane + 32 * q;
        if (e < d)
            y[e] = narrow<T>(acc[q] * inv);
    }
    if (lse && lane == 0)
        *lse = m + logf(l);
}

/* Block (b, h, tile of kWarps queries). */
template <class T>
__global__ void k_attn_fwd(mgt_attn_shape s, const T *__restrict__ qkv, T *__restrict__ y,
                           float *__restrict__ lse) {
    __shared__ float qsh[kWarps][kMaxD], wsh[kWarps][32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const place at = place_of(s);
    const int b = at.b, h = at.h, i = at.row;
    if (i >= s.t)
        return; /* the whole warp: nothing below waits for the block */
    const int c = s.c, d = c / s.heads;
    const size_t ld = 3 * (size_t)c;
    const T *base = qkv + (size_t)b * s.t * ld + (size_t)h * d;
    const T *q = base + (size_t)i * ld;
    for (int e = lane; e < d; e += 32)
        qsh[warp][e] = widen(q[e]);
    __syncwarp();
    attend(qsh[warp], base + c, base + 2 * (size_t)c, ld, s.causal ? i + 1 : s.t, d,
           1.0f / sqrtf((float)d), s, (uint64_t)b, h, i,
           y + ((size_t)b * s.t + i) * (size_t)c + (size_t)h * d,
           lse + ((size_t)b * s.heads + h) * s.t + i, wsh[warp]);
}

/* D_i = dO_i . O_i for the d channels of a head, in double, in order (the CPU's). */
template <class T> __device__ inline float delta_of(const T *dO, const T *O, int d) {
    double acc = 0.0;
    for (int e = 0; e < d; e++)
        acc += (double)widen(dO[e]) * widen(O[e]);
    return (float)acc;
}

/* dq: block (b, h, tile of kWarps queries), one warp a query. */
template <class T>
__global__ void k_attn_bwd_dq(mgt_attn_shape s, const T *__restrict__ qkv, const T *__restrict__ y,
                              const float *__restrict__ lse, const T *__restrict__ dy,
                              T *__restrict__ dqkv, float *__restrict__ delta) {
    __shared__ float qsh[kWarps][kMaxD], gsh[kWarps][kMaxD], wsh[kWarps][32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const place at = place_of(s);
    const int b = at.b, h = at.h, i = at.row;
    if (i >= s.t)
        return;
    const int c = s.c, d = c / s.heads;
    const size_t ld = 3 * (size_t)c;
    const float scale = 1.0f / sqrtf((float)d);
    const bool drop = s.rate > 0.0f;
    const T *base = qkv + (size_t)b * s.t * ld + (size_t)h * d;
    const T *k = base + c, *v = base + 2 * (size_t)c;
    const size_t orow = ((size_t)b * s.t + i) * (size_t)c + (size_t)h * d;
    for (int e = lane; e < d; e += 32) {
        qsh[warp][e] = widen(base[(size_t)i * ld + e]);
        gsh[warp][e] = widen(dy[orow + e]);
    }
    __syncwarp();
    const float D = delta_of(dy + orow, y + orow, d);
    const float L = lse[((size_t)b * s.heads + h) * s.t + i];
    if (lane == 0)
        delta[((size_t)b * s.heads + h) * s.t + i] = D;
    const int nkeys = s.causal ? i + 1 : s.t;
    float acc[kPer];
    for (int q = 0; q < kPer; q++)
        acc[q] = 0.0f;
    for (int j0 = 0; j0 < nkeys; j0 += 32) {
        const int j = j0 + lane, bk = nkeys - j0 < 32 ? nkeys - j0 : 32;
        float ds = 0.0f;
        if (j < nkeys) {
            const float p = expf(dot_scaled(qsh[warp], k + (size_t)j * ld, d, scale) - L);
            const float dp = dot_scaled(gsh[warp], v + (size_t)j * ld, d, 1.0f);
            const float keep = drop ? attn_keep(s, (uint64_t)b, h, i, j) : 1.0f;
            ds = p * (drop ? dp * keep - D : dp - D);
        }
        wsh[warp][lane] = ds;
        __syncwarp();
        for (int q = 0; q < kPer; q++) {
            const int e = lane + 32 * q;
            if (e >= d)
                break;
            float a = acc[q];
            for (int jj = 0; jj < bk; jj++)
                a += wsh[warp][jj] * widen(k[(size_t)(j0 + jj) * ld + e]);
            acc[q] = a;
        }
        __syncwarp();
    }
    T *dq = dqkv + ((size_t)b * s.t + i) * ld + (size_t)h * d;
    for (int q = 0; q < kPer; q++) {
        const int e = lane + 32 * q;
        if (e < d)
            dq[e] = narrow<T>(scale * acc[q]);
    }
}

/* dk, dv: block (b, h, tile of kWarps keys), one warp a key. */
template <class T>
__global__ void k_attn_bwd_dkv(mgt_attn_shape s, const T *__restrict__ qkv,
                               const float *__restrict__ lse, const float *__restrict__ delta,
                               const T *__restrict__ dy, T *__restrict__ dqkv) {
    __shared__ float ksh[kWarps][kMaxD], vsh[kWarps][kMaxD], psh[kWarps][32], dsh[kWarps][32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const place at = place_of(s);
    const int b = at.b, h = at.h, j = at.row;
    if (j >= s.t)
        return;
    const int c = s.c, d = c / s.heads;
    const size_t ld = 3 * (size_t)c;
    const float scale = 1.0f / sqrtf((float)d);
    const bool drop = s.rate > 0.0f;
    const T *base = qkv + (size_t)b * s.t * ld + (size_t)h * d;
    const T *gb = dy + (size_t)b * s.t * c + (size_t)h * d;
    const float *lb = lse + ((size_t)b * s.heads + h) * s.t;
    const float *db = delta + ((size_t)b * s.heads + h) * s.t;
    for (int e = lane; e < d; e += 32) {
        ksh[warp][e] = widen(base[(size_t)j * ld + c + e]);
        vsh[warp][e] = widen(base[(size_t)j * ld + 2 * (size_t)c + e]);
    }
    __syncwarp();
    float ak[kPer], av[kPer];
    for (int q = 0; q < kPer; q++)
        ak[q] = av[q] = 0.0f;
    const int i_first = s.causal ? j : 0;
    for (int i0 = i_first; i0 < s.t; i0 += 32) {
        const int i = i0 + lane, bq = s.t - i0 < 32 ? s.t - i0 : 32;
        float pk = 0.0f, ds = 0.0f;
        if (i < s.t) {
            const T *qi = base + (size_t)i * ld, *gi = gb + (size_t)i * c;
            const float p = expf(dot_scaled(ksh[warp], qi, d, scale) - lb[i]);
            const float dp = dot_scaled(vsh[warp], gi, d, 1.0f);
            const float D = db[i];
            const float keep = drop ? attn_keep(s, (uint64_t)b, h, i, j) : 1.0f;
            ds = p * (drop ? dp * keep - D : dp - D);
            pk = drop ? p * keep : p;
        }
        psh[warp][lane] = pk;
        dsh[warp][lane] = ds;
        __syncwarp();
        for (int q = 0; q < kPer; q++) {
            const int e = lane + 32 * q;
            if (e >= d)
                break;
            float a = av[q], g = ak[q];
            for (int ii = 0; ii < bq; ii++) {
                a += psh[warp][ii] * widen(gb[(size_t)(i0 + ii) * c + e]);
                g += dsh[warp][ii] * widen(base[(size_t)(i0 + ii) * ld + e]);
            }
            av[q] = a;
            ak[q] = g;
        }
        __syncwarp();
    }
    T *dk = dqkv + ((size_t)b * s.t + j) * ld + c + (size_t)h * d;
    T *dv = dk + c;
    for (int q = 0; q < kPer; q++) {
        const int e = lane + 32 * q;
        if (e < d) {
            dk[e] = narrow<T>(scale * ak[q]);
            dv[e] = narrow<T>(av[q]);
        }
    }
}

/* Generation: one block, one warp a head, the query against positions 0 .. p of the cache. */
template <class T>
__global__ void k_attn_decode(int c, int heads, int p, const T *__restrict__ q,
                              const T *__restrict__ kc, const T *__restrict__ vc,
                              T *__restrict__ y) {
    __shared__ float qsh[kWarps][kMaxD], wsh[kWarps][32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int h = blockIdx.x * kWarps + warp, d = c / heads;
    if (h >= heads)
        return;
    for (int e = lane; e < d; e += 32)
        qsh[warp][e] = widen(q[(size_t)h * d + e]);
    __syncwarp();
    const mgt_attn_shape none = {};
    attend(qsh[warp], kc + (size_t)h * d, vc + (size_t)h * d, (size_t)c, p + 1, d,
           1.0f / sqrtf((float)d), none, 0, h, 0, y + (size_t)h * d, (float *)nullptr, wsh[warp]);
}

/* The head's width must fit the kernels' shared rows and accumulators. */
void check_width(cudaStream_t st, int c, int heads) {
    if (heads <= 0 || c / heads > kMaxD)
        mgt_gpu_fail_on(st, MGT_GPU_CUDA, (int)cudaErrorInvalidValue,
                        "attention with more than 256 channels a head (the GPU kernels' most)",
                        __FILE__, __LINE__);
}

unsigned blocks_of(const mgt_attn_shape *s) {
    return (unsigned)((size_t)s->n * s->heads * ((s->t + kWarps - 1) / kWarps));
}

} /* namespace */

extern "C" {

/* The own kernels' scratch, D: a float a query and head (backward's dQ kernel writes it, the
 * dK/dV kernel reads it). */
static size_t own_scratch(const mgt_attn_shape *s) {
    return sizeof(float) * (size_t)(s->n > 0 ? s->n : 1) * (size_t)s->heads * (size_t)s->t;
}

/* The own kernels' or cuDNN's (its plans built now), whichever is larger. */
size_t mgt_gpu_attn_scratch(mgt_backend *be, const mgt_attn_shape *s) {
    const size_t own = own_scratch(s), fused = mgt_gpu_sdpa_scratch(be, s);
    return fused > own ? fused : own;
}

void mgt_gpu_attn_fwd(mgt_backend *be, const mgt_attn_shape *s, const float *qkv, float *y,
                      float *lse) {
    if (s->n <= 0 || s->t <= 0 || s->heads <= 0)
        return;
    if (mgt_gpu_sdpa_fwd(be, s, qkv, y, lse))
        return;
    cudaStream_t st = mgt_gpu_stream(be);
    check_width(st, s->c, s->heads);
    with_act_type(mgt_gpu_impl_of(be)->bf16, [&](auto e) {
        using T = decltype(e);
        MGT_LAUNCH(k_attn_fwd<T>, blocks_of(s), 32 * kWarps, st, *s, (const T *)qkv, (T *)y, lse);
    });
}

void mgt_gpu_attn_bwd(mgt_backend *be, const mgt_attn_shape *s, const float *qkv, const float *y,
                      const float *lse, const float *dy, float *dqkv) {
    if (s->n <= 0 || s->t <= 0 || s->heads <= 0 || !dqkv)
        return;
    if (mgt_gpu_sdpa_bwd(be, s, qkv, y, lse, dy, dqkv))
        return;
    cudaStream_t st = mgt_gpu_stream(be);
    check_width(st, s->c, s->heads);
    float *delta = (float *)mgt_gpu_workspace(be, own_scratch(s));
    with_act_type(mgt_gpu_impl_of(be)->bf16, [&](auto e) {
        using T = decltype(e);
        MGT_LAUNCH(k_attn_bwd_dq<T>, blocks_of(s), 32 * kWarps, st, *s, (const T *)qkv,
                   (const T *)y, lse, (const T *)dy, (T *)dqkv, delta);
        MGT_LAUNCH(k_attn_bwd_dkv<T>, blocks_of(s), 32 * kWarps, st, *s, (const T *)qkv, lse, delta,
                   (const T *)dy, (T *)dqkv);
    });
}

void mgt_gpu_attn_decode(mgt_backend *be, int c, int heads, int p, const float *q, const float *kc,
                         const float *vc, float *y) {
    if (heads <= 0 || p < 0)
        return;
    cudaStream_t st = mgt_gpu_stream(be);
    check_width(st, c, heads);
    with_act_type(mgt_gpu_impl_of(be)->bf16, [&](auto e) {
        using T = decltype(e);
        MGT_LAUNCH(k_attn_decode<T>, (unsigned)((heads + kWarps - 1) / kWarps), 32 * kWarps, st, c,
                   heads, p, (const T *)q, (const T *)kc, (const T *)vc, (T *)y);
    });
}

} /* extern "C" */
