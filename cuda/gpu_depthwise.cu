/* gpu_depthwise.cu: depthwise convolution, depth multiplier 1 (gpu_graph.h), NHWC activations and
 * [c][1][kh][kw] weights as src/cpu/cpu_depthwise.c.
 *
 * Depthwise convolution does kh*kw multiply-adds per value it reads: bound by memory, so each
 * kernel is built to read every tensor once and to spend no arithmetic on indices:
 *   - tiles: a block takes a tile of at most 128 pixels of one sample for 8 channel vectors,
 *     first copies the window the tile needs (the halo included, zeros outside the image) into
 *     shared memory, then computes from there, so each value is read from memory once, not once
 *     per tap;
 *   - vectors over the channels: a thread holds 4 channels of a pixel (16 bytes of float, 8 of
 *     bfloat16; 8 threads cover 32 consecutive channels) when the channel count and the
 *     pointers allow it, else 1 channel (the scalar path, same structure);
 *   - 32-bit indices: a tensor holds fewer than 2^31 values (MGT_MAX_TENSOR_ELEMS), so every
 *     offset fits an unsigned int; a block finds its tile with one division, a thread its pixel
 *     with one per pixel, and nothing divides per element or per tap;
 *   - 3x3 windows (Xception's, MobileNet's) at stride 1 or 2 have kernels of their own, with the
 *     window size known to the compiler: the 9 weights of a thread's channels in registers, and
 *     each thread taking a column of up to 3 output rows at a time, reading the window's rows
 *     once for all of them (5 row reads of 3 vectors for 3 outputs at stride 1, instead of 27),
 *     so that shared memory's bandwidth stays well above what the tile needs.
 *   forward        each output adds its window's taps (in row order for the general kernel);
 *   backward data  a tile of dx pixels gathers from the window of dy that covers it, each dx
 *                  value written once (no atomics); at stride 1 this is the forward kernel on
 *                  dy with the window turned by 180 degrees;
 *   backward filt. a block walks its share of the tiles (the same share for a given shape on
 *                  every run), each thread summing x * dy over a fixed part of each tile (float
 *                  within a tile, double across tiles); the parts are added in a fixed order,
 *                  each block writes a double partial per (tap, channel), and the partials are
 *                  added in a fixed tree (gpu_launch.h). Deterministic: the same bits on every
 *                  run, and the same for a chunk of --reproducible on any rank;
 *   bias           gpu_colsum.h's column sums of dy.
 * A shape whose window does not fit a block's shared memory even for a 1x1 tile (windows of
 * more than 64 taps, large strides) runs the direct kernels at the end: one thread per value.
 * No float atomics anywhere, so results never depend on scheduling. */
#include <utility>

#include "gpu_colsum.h"

namespace {

constexpr int kLanes = 8;           /* channel vectors per block (threadIdx.x) */
constexpr int kPix = 32;            /* pixel threads per block (threadIdx.y) */
constexpr int kVec = 4;             /* channels of a vector */
constexpr int kTileMax = 128;       /* output (or dx) pixels per tile */
constexpr int kTapsMax = 64;        /* the general filter gradient: two taps a thread at most */
constexpr int kFilterBlocks = 1024; /* blocks of the filter gradient, over all channel groups */
/* Output rows a thread of the 3x3 kernels takes at a time: 3 rows read 5 window rows at stride 1
 * (5/3 row reads an output instead of 3) in the 80 registers that let 3 blocks share an SM
 * (4 rows would spill there, sm_90, nvcc 13.0). */
constexpr int kRows = 3;
/* Static shared memory per block: 8 blocks of 256 threads fit an SM (228 KB on Hopper, 164 KB on
 * the A100), the 2048 threads it can hold. */
constexpr int kSmem = 27 * 1024;
/* Bytes of shared memory a window pixel may take: 8 vectors of 16 bytes. The plan assumes it for
 * every type and vector width, so that the tiling is a function of the shape alone. */
constexpr int kPixBytes = kLanes * 16;

/* The element type and the channels a thread takes of a pixel (1, or kVec). */
template <class T_, int N_> struct vpath {
    using T = T_;
    static constexpr int N = N_;
};

enum { PASS_FWD = 0, PASS_DATA = 1, PASS_FILTER = 2 };
/* The kernel family a pass runs: the 3x3 ones, the general tiled ones, the direct ones. */
enum { KIND_3X3 = 0, KIND_TILED = 1, KIND_DIRECT = 2 };

/* Everything a kernel needs about the shape and its tiling, in 32 bits. */
struct dw_geom {
    int n, h, w, c, kh, kw, s, pt, pl, oh, ow;
    int kind;
    int th, tw; /* the tile: output pixels (forward, filter) or dx pixels (data) */
    int wh, ww; /* the window the tile reads (its largest, for the general data kernel) */
    int tiles_y, tiles_x;
    int cv;     /* channel vectors: ceil(c / N) */
    int groups; /* blocks over the channels: ceil(cv / kLanes) */
};

int cdiv(int a, int b) {
    return (a + b - 1) / b;
}

/* Floor and ceiling of a / b for b > 0 and any a. */
__host__ __device__ inline int floor_div(int a, int b) {
    return a >= 0 ? a / b : -((-a + b - 1) / b);
}
__host__ __device__ inline int ceil_div(int a, int b) {
    return -floor_div(-a, b);
}

/* A tile of at most max_h x max_w pixels (and kTileMax) over an out_h x out_w grid, its rows and
 * columns balanced so that the last tile is not mostly empty, then halved until `fits` says its
 * window fits. False when not even 1x1 fits. */
template <class F>
bool pick_tile(int out_h, int out_w, int max_h, int max_w, F fits, int *th, int *tw) {
    int w = out_w < max_w ? out_w : max_w;
    w = cdiv(out_w, cdiv(out_w, w));
    int h = kTileMax / w;
    h = h < out_h ? h : out_h;
    h = h < max_h ? h : max_h;
    h = cdiv(out_h, cdiv(out_h, h));
    while (!fits(h, w)) {
        if (h == 1 && w == 1)
            return false;
        if (h >= w)
            h = cdiv(h, 2);
        else
            w = cdiv(w, 2);
    }
    *th = h;
    *tw = w;
    return true;
}

/* The tiling of pass `pass` for shape s and N channels a thread. */
dw_geom geom_of(const mgt_conv_shape *s, int N, int pass) {
    dw_geom g{};
    g.n = s->n > 0 ? s->n : 0;
    g.h = s->h, g.w = s->w, g.c = s->c, g.kh = s->kh, g.kw = s->kw, g.s = s->stride;
    g.pt = s->pad_top, g.pl = s->pad_left, g.oh = s->oh, g.ow = s->ow;
    g.cv = cdiv(s->c, N);
    g.groups = cdiv(g.cv, kLanes);
    const int taps = s->kh * s->kw, st = s->stride, kh = s->kh, kw = s->kw;
    const int room = kSmem / kPixBytes; /* window pixels a block holds */
    /* the general forward and data kernels keep the weights in shared memory too */
    const int wroom = (kSmem - taps * kLanes * kVec * (int)sizeof(float)) / kPixBytes;
    const bool k3 = kh == 3 && kw == 3 && (st == 1 || (st == 2 && pass != PASS_DATA));
    g.kind = k3 ? KIND_3X3 : taps <= kTapsMax ? KIND_TILED : KIND_DIRECT;
    const int gh = pass == PASS_DATA ? s->h : s->oh, gw = pass == PASS_DATA ? s->w : s->ow;
    auto window = [&](int a, int b) { /* rows and columns of a tile's window */
                                      if (pass == PASS_DATA && !k3)
                                          return std::pair<int, int>((a + kh - 2) / st + 1,
                                                                     (b + kw - 2) / st + 1);
                                      return std::pair<int, int>((a - 1) * st + kh,
                                                                 (b - 1) * st + kw);
    };
    int th = 1, tw = 1;
    bool ok = false;
    if (g.kind == KIND_3X3 && pass == PASS_FILTER) {
        /* a thread per (tap row, tile row): 10 rows use 30 of the 32 pixel threads */
        ok = pick_tile(
            gh, gw, kPix / 3, 16,
            [&](int a, int b) {
                const auto w2 = window(a, b);
                return w2.first * w2.second + a * b <= room;
            },
            &th, &tw);
    } else if (g.kind == KIND_3X3) {
        /* columns of up to kRows rows: 32 / tw columns' worth of threads per tile column */
        ok = pick_tile(
            gh, gw, kTileMax, 16,
            [&](int a, int b) {
                const auto w2 = window(a, b);
                return w2.first * w2.second <= room;
            },
            &th, &tw);
    } else if (g.kind == KIND_TILED) {
        ok = pick_tile(
            gh, gw, kTileMax, 16,
            [&](int a, int b) {
                const auto w2 = window(a, b);
                return pass == PASS_FILTER ? w2.first * w2.second + a * b <= room
                                           : w2.first * w2.second <= wroom;
            },
            &th, &tw);
    }
    if (g.kind != KIND_DIRECT && !ok)
        g.kind = KIND_DIRECT;
    const auto w2 = window(th, tw);
    g.th = th, g.tw = tw, g.wh = w2.first, g.ww = w2.second;
    g.tiles_y = cdiv(gh, th);
    g.tiles_x = cdiv(gw, tw);
    return g;
}

/* Blocks of the filter gradient over the tiles, per channel group: a function of the shape. */
int filter_blocks(const dw_geom &g) {
    const long tiles = (long)g.n * g.tiles_y * g.tiles_x;
    long b = kFilterBlocks / (g.groups > 0 ? g.groups : 1);
    b = b < 1 ? 1 : b;
    return (int)(tiles < b ? (tiles < 1 ? 1 : tiles) : b);
}

/* The tile of block index t (over samples, tile rows, tile columns). */
struct tile_pos {
    int smp, y0, x0;
};
__device__ inline tile_pos tile_of(const dw_geom &g, unsigned t) {
    const unsigned tx = t % (unsigned)g.tiles_x;
    t /= (unsigned)g.tiles_x;
    const unsigned ty = t % (unsigned)g.tiles_y;
    return tile_pos{(int)(t / (unsigned)g.tiles_y), (int)ty * g.th, (int)tx * g.tw};
}

/* This lane's channels start at ch0; `active`: it has any (the last group may be partial). */
struct lane_ch {
    int ch0;
    bool active;
};
template <int N> __device__ inline lane_ch lane_channels(const dw_geom &g) {
    const int cvec = blockIdx.y * kLanes + threadIdx.x;
    return lane_ch{cvec * N, cvec < g.cv};
}

/* Copies the window of rows y0 .. y0 + rows - 1, columns x0 .. x0 + cols - 1 of sample smp
 * (image h x w) into sh (pixel p at sh[(p * kLanes + lane) * N]), zeros outside the image.
 * Every thread of the block takes part. Where a lane's vector is 8 bytes (bfloat16, N = 4), a
 * thread copies two lanes' vectors in one 16-byte access where it can (the pixels' channels
 * 16-byte aligned: c a multiple of 2N and src aligned; both lanes' channels there), so that the
 * window's global loads are 16 bytes wide for bfloat16 as for float. The filter gradient's kernels
 * take the 8-byte copies (WIDE false): inside their loop over tiles the 16-byte one costs them
 * spills (24-64 bytes, sm_90, nvcc 13.0 -Xptxas -v), the forward and data ones nothing. */
template <class T, int N, bool WIDE = true>
__device__ void load_window(const T *__restrict__ src, int h, int w, int c, int smp, int y0, int x0,
                            int rows, int cols, lane_ch lc, T *sh) {
    const int lane = threadIdx.x;
    const unsigned base = (unsigned)smp * (unsigned)h * (unsigned)w;
    if constexpr (WIDE && N * sizeof(T) == 8) {
        if (c % (2 * N) == 0 && aligned_to(src, 16)) {
            constexpr int kPairs = kLanes / 2;
            const int cv = c / N, tid = threadIdx.y * kLanes + lane;
#pragma unroll 4
            for (int k = tid; k < rows * cols * kPairs; k += kLanes * kPix) {
                const int p = k / kPairs, pair = k - p * kPairs;
                const int r = p / cols, q = p - r * cols, y = y0 + r, x = x0 + q;
                const int v0 = (int)blockIdx.y * kLanes + 2 * pair; /* the pair's first vector */
                T *d = sh + (p * kLanes + 2 * pair) * N;
                const T *s0 =
                    src + (base + (unsigned)(y * w + x)) * (unsigned)c + (unsigned)(v0 * N);
                const bool in = y >= 0 && y < h && x >= 0 && x < w;
                if (in && v0 + 1 < cv) {
                    copy_v<T, 2 * N>(d, s0);
                } else {
                    if (in && v0 < cv)
                        copy_v<T, N>(d, s0);
                    else
                        zero_v<T, N>(d);
                    zero_v<T, N>(d + N);
                }
            }
            return;
        }
    }
#pragma unroll 4 /* several loads in flight before the first store */
    for (int p = threadIdx.y; p < rows * cols; p += kPix) {
        const int r = p / cols, q = p - r * cols, y = y0 + r, x = x0 + q;
        T *d = sh + (p * kLanes + lane) * N;
        if (lc.active && y >= 0 && y < h && x >= 0 && x < w)
            copy_v<T, N>(d, src + (base + (unsigned)(y * w + x)) * (unsigned)c + (unsigned)lc.ch0);
        else
            zero_v<T, N>(d);
    }
}

/* The block's channel group's weights transposed to ws[tap][lane * N + v] (zeros past c). */
template <int N>
__device__ void load_weights(const float *__restrict__ w, int c, int taps, float *ws) {
    const int tid = threadIdx.y * kLanes + threadIdx.x, width = kLanes * N;
    for (int i = tid; i < taps * width; i += kLanes * kPix) {
        const int tap = i / width, ch = (int)blockIdx.y * width + (i - tap * width);
        ws[i] = ch < c ? w[(unsigned)ch * (unsigned)taps + (unsigned)tap] : 0.0f;
    }
}

/* ---- the 3x3 kernels ---- */

/* Forward (FLIP false: src = x, window at (y0 * S - pt, x0 * S - pl)) or the data gradient at
 * stride 1 (FLIP true: src = dy, window at (y0 + pt - 2, x0 + pl - 2), the kernel turned), on a
 * tile of th x tw outputs. Thread (lane, p): column p % tw, rows [grp * per, ..) of the tile with
 * grp = p / tw, per = ceil(th / (32 / tw)); kRows rows at a time, the window's rows read once for
 * them. */
template <class P, int S, bool FLIP>
__global__ void __launch_bounds__(kLanes *kPix, 3)
    k_dw3_rows(dw_geom g, const typename P::T *__restrict__ src, const float *__restrict__ w,
               const float *__restrict__ b, typename P::T *__restrict__ dst) {
    using T = typename P::T;
    constexpr int N = P::N, K = 3;
    __shared__ __align__(16) unsigned char sm[kSmem];
    T *xs = reinterpret_cast<T *>(sm);
    const lane_ch lc = lane_channels<N>(g);
    const tile_pos t = tile_of(g, blockIdx.x);
    const int wy0 = FLIP ? t.y0 + g.pt - (K - 1) : t.y0 * S - g.pt;
    const int wx0 = FLIP ? t.x0 + g.pl - (K - 1) : t.x0 * S - g.pl;
    const int sh = FLIP ? g.oh : g.h, sw = FLIP ? g.ow : g.w; /* the source's image */
    const int dh = FLIP ? g.h : g.oh, dw = FLIP ? g.w : g.ow; /* the destination's */
    load_window<T, N>(src, sh, sw, g.c, t.smp, wy0, wx0, g.wh, g.ww, lc, xs);
    __syncthreads();
    const int lane = threadIdx.x, p = threadIdx.y, groups = kPix / g.tw;
    const int q = p % g.tw, grp = p / g.tw, per = (g.th + groups - 1) / groups;
    if (!lc.active || grp >= groups)
        return;
    float wr[K][K][N], bias[N];
#pragma unroll
    for (int ki = 0; ki < K; ki++)
#pragma unroll
        for (int kj = 0; kj < K; kj++)
#pragma unroll
            for (int v = 0; v < N; v++) {
                const int ch = lc.ch0 + v,
                          tap = FLIP ? (K - 1 - ki) * K + (K - 1 - kj) : ki * K + kj;
                wr[ki][kj][v] = ch < g.c ? w[(unsigned)ch * (K * K) + (unsigned)tap] : 0.0f;
            }
#pragma unroll
    for (int v = 0; v < N; v++)
        bias[v] = b && lc.ch0 + v < g.c ? b[lc.ch0 + v] : 0.0f;
    const int r_end = (grp + 1) * per < g.th ? (grp + 1) * per : g.th;
    const unsigned out0 = (unsigned)t.smp * (unsigned)dh * (unsigned)dw;
    for (int ra = grp * per; ra < r_end; ra += kRows) {
        const int rc = r_end - ra < kRows ? r_end - ra : kRows;
        float acc[kRows][N];
#pragma unroll
        for (int j = 0; j < kRows; j++)
#pragma unroll
            for (int v = 0; v < N; v++)
                acc[j][v] = bias[v];
                /* window row ra * S + u feeds output row ra + j through tap row u - j * S */
#pragma unroll
        for (int u = 0; u < (kRows - 1) * S + K; u++) {
            if (u >= (rc - 1) * S + K)
                break;
            float xv[K][N];
            const T *row = xs + (((ra * S + u) * g.ww + q * S) * kLanes + lane) * N;
#pragma unroll
            for (int kj = 0; kj < K; kj++)
                load_v<T, N>(row + kj * kLanes * N, xv[kj]);
#pragma unroll
            for (int j = 0; j < kRows; j++) {
                const int ki = u - j * S;
                if (ki < 0 || ki >= K || j >= rc)
                    continue;
#pragma unroll
                for (int kj = 0; kj < K; kj++)
#pragma unroll
                    for (int v = 0; v < N; v++)
                        acc[j][v] += wr[ki][kj][v] * xv[kj][v];
            }
        }
        const int ox = t.x0 + q;
#pragma unroll
        for (int j = 0; j < kRows; j++) {
            const int oy = t.y0 + ra + j;
            if (j < rc && oy < dh && ox < dw)
                store_v<T, N>(dst + (out0 + (unsigned)(oy * dw + ox)) * (unsigned)g.c +
                                  (unsigned)lc.ch0,
                              acc[j]);
        }
    }
}

/* The filter gradient of a 3x3 window at stride S: per block, for its channel vectors, the sum
 * over its tiles of x * dy for each tap, as part[(blockIdx.x * 9 + tap) * c + ch] (double).
 * Thread (lane, p): tap row ki = p % 3 of tile row p / 3 (30 of the 32 threads with a 10-row
 * tile), sweeping the row's pixels with the 3 x values of its taps in registers (S new ones a
 * pixel). The tile rows' sums are added in row order. */
template <class P, int S>
__global__ void __launch_bounds__(kLanes *kPix)
    k_dw3_filter(dw_geom g, const typename P::T *__restrict__ x,
                 const typename P::T *__restrict__ dy, double *__restrict__ part) {
    using T = typename P::T;
    constexpr int N = P::N, K = 3;
    __shared__ __align__(16) unsigned char sm[kSmem];
    T *xs = reinterpret_cast<T *>(sm);
    T *ds = xs + g.wh * g.ww * kLanes * N;
    const lane_ch lc = lane_channels<N>(g);
    const int lane = threadIdx.x, p = threadIdx.y, ki = p % K, rr = p / K;
    const bool mine = rr < g.th && lc.active;
    double acc[K][N];
#pragma unroll
    for (int kj = 0; kj < K; kj++)
#pragma unroll
        for (int v = 0; v < N; v++)
            acc[kj][v] = 0.0;
    const unsigned tiles = (unsigned)g.n * (unsigned)g.tiles_y * (unsigned)g.tiles_x;
    for (unsigned tt = blockIdx.x; tt < tiles; tt += gridDim.x) {
        const tile_pos t = tile_of(g, tt);
        __syncthreads(); /* the previous tile's readers are done */
        load_window<T, N, false>(x, g.h, g.w, g.c, t.smp, t.y0 * S - g.pt, t.x0 * S - g.pl, g.wh,
                                 g.ww, lc, xs);
        /* dy's tile: outputs past oh / ow load as zeros and add nothing */
        load_window<T, N, false>(dy, g.oh, g.ow, g.c, t.smp, t.y0, t.x0, g.th, g.tw, lc, ds);
        __syncthreads();
        if (!mine)
            continue;
        float f[K][N], xv[K][N];
#pragma unroll
        for (int kj = 0; kj < K; kj++)
#pragma unroll
            for (int v = 0; v < N; v++)
                f[kj][v] = 0.0f;
        const T *xrow = xs + ((rr * S + ki) * g.ww * kLanes + lane) * N;
        const T *drow = ds + (rr * g.tw * kLanes + lane) * N;
#pragma unroll
        for (int kj = 0; kj < K - S; kj++)
            load_v<T, N>(xrow + kj * kLanes * N, xv[kj + S]); /* shifted down below */
        for (int q = 0; q < g.tw; q++) {
            /* the window of pixel q: columns q * S .. q * S + 2 */
#pragma unroll
            for (int kj = 0; kj < K - S; kj++)
#pragma unroll
                for (int v = 0; v < N; v++)
                    xv[kj][v] = xv[kj + S][v];
#pragma unroll
            for (int kj = K - S; kj < K; kj++)
                load_v<T, N>(xrow + (q * S + kj) * kLanes * N, xv[kj]);
            float dv[N];
            load_v<T, N>(drow + q * kLanes * N, dv);
#pragma unroll
            for (int kj = 0; kj < K; kj++)
#pragma unroll
                for (int v = 0; v < N; v++)
                    f[kj][v] += xv[kj][v] * dv[v];
        }
#pragma unroll
        for (int kj = 0; kj < K; kj++)
#pragma unroll
            for (int v = 0; v < N; v++)
                acc[kj][v] += f[kj][v];
    }
    /* the tile rows' sums, added in row order: red[row][tap][lane][v] */
    __syncthreads();
    double *red = reinterpret_cast<double *>(sm);
    if (rr < g.th)
#pragma unroll
        for (int kj = 0; kj < K; kj++)
#pragma unroll
            for (int v = 0; v < N; v++)
                red[((rr * (K * K) + ki * K + kj) * kLanes + lane) * N + v] = acc[kj][v];
    __syncthreads();
    for (int i = p; i < K * K; i += kPix) { /* thread p < 9: tap p */
        if (!lc.active)
            break;
        for (int v = 0; v < N && lc.ch0 + v < g.c; v++) {
            double s = 0.0;
            for (int r = 0; r < g.th; r++)
                s += red[((r * (K * K) + i) * kLanes + lane) * N + v];
            part[((unsigned)blockIdx.x * (K * K) + (unsigned)i) * (unsigned)g.c +
                 (unsigned)(lc.ch0 + v)] = s;
        }
    }
}

/* ---- the general tiled kernels (any window up to kTapsMax taps) ---- */

template <class P>
__global__ void __launch_bounds__(kLanes *kPix)
    k_dw_fwd(dw_geom g, const typename P::T *__restrict__ x, const float *__restrict__ w,
             const float *__restrict__ b, typename P::T *__restrict__ y) {
    using T = typename P::T;
    constexpr int N = P::N;
    __shared__ __align__(16) unsigned char sm[kSmem];
    const int taps = g.kh * g.kw;
    float *ws = reinterpret_cast<float *>(sm);
    T *xs = reinterpret_cast<T *>(sm + ((taps * kLanes * N * (int)sizeof(float) + 15) & ~15));
    const lane_ch lc = lane_channels<N>(g);
    const int lane = threadIdx.x;
    const tile_pos t = tile_of(g, blockIdx.x);
    load_weights<N>(w, g.c, taps, ws);
    load_window<T, N>(x, g.h, g.w, g.c, t.smp, t.y0 * g.s - g.pt, t.x0 * g.s - g.pl, g.wh, g.ww, lc,
                      xs);
    __syncthreads();
    if (!lc.active)
        return;
    float bias[N];
    for (int v = 0; v < N; v++)
        bias[v] = b && lc.ch0 + v < g.c ? b[lc.ch0 + v] : 0.0f;
    const unsigned out0 = (unsigned)t.smp * (unsigned)g.oh * (unsigned)g.ow;
    for (int o = threadIdx.y; o < g.th * g.tw; o += kPix) {
        const int r = o / g.tw, q = o - r * g.tw, oy = t.y0 + r, ox = t.x0 + q;
        if (oy >= g.oh || ox >= g.ow)
            continue;
        float acc[N];
        for (int v = 0; v < N; v++)
            acc[v] = bias[v];
        for (int ki = 0; ki < g.kh; ki++) {
            const T *xr = xs + (((r * g.s + ki) * g.ww + q * g.s) * kLanes + lane) * N;
            const float *wr = ws + (ki * g.kw * kLanes + lane) * N;
            for (int kj = 0; kj < g.kw; kj++) {
                float xv[N];
                load_v<T, N>(xr + kj * kLanes * N, xv);
                for (int v = 0; v < N; v++)
                    acc[v] += wr[kj * kLanes * N + v] * xv[v];
            }
        }
        store_v<T, N>(y + (out0 + (unsigned)(oy * g.ow + ox)) * (unsigned)g.c + (unsigned)lc.ch0,
                      acc);
    }
}

template <class P>
__global__ void __launch_bounds__(kLanes *kPix)
    k_dw_bwd_data(dw_geom g, const float *__restrict__ w, const typename P::T *__restrict__ dy,
                  typename P::T *__restrict__ dx) {
    using T = typename P::T;
    constexpr int N = P::N;
    __shared__ __align__(16) unsigned char sm[kSmem];
    const int taps = g.kh * g.kw;
    float *ws = reinterpret_cast<float *>(sm);
    T *ds = reinterpret_cast<T *>(sm + ((taps * kLanes * N * (int)sizeof(float) + 15) & ~15));
    const lane_ch lc = lane_channels<N>(g);
    const int lane = threadIdx.x;
    const tile_pos t = tile_of(g, blockIdx.x); /* a tile of dx pixels */
    /* the outputs whose windows reach the tile: oy * s - pt + ki in [y0, y0 + th) */
    const int oy0 = ceil_div(t.y0 + g.pt - (g.kh - 1), g.s);
    const int ox0 = ceil_div(t.x0 + g.pl - (g.kw - 1), g.s);
    const int rows = floor_div(t.y0 + g.th - 1 + g.pt, g.s) - oy0 + 1;
    const int cols = floor_div(t.x0 + g.tw - 1 + g.pl, g.s) - ox0 + 1;
    load_weights<N>(w, g.c, taps, ws);
    load_window<T, N>(dy, g.oh, g.ow, g.c, t.smp, oy0, ox0, rows, cols, lc, ds);
    __syncthreads();
    if (!lc.active)
        return;
    const unsigned in0 = (unsigned)t.smp * (unsigned)g.h * (unsigned)g.w;
    for (int o = threadIdx.y; o < g.th * g.tw; o += kPix) {
        const int r = o / g.tw, q = o - r * g.tw, iy = t.y0 + r, ix = t.x0 + q;
        if (iy >= g.h || ix >= g.w)
            continue;
        float acc[N];
        for (int v = 0; v < N; v++)
            acc[v] = 0.0f;
        /* tap ki reaches iy from output (iy + pt - ki) / s where that divides: ki = ty % s, + s..
         */
        const int ty = iy + g.pt, tx = ix + g.pl;
        for (int ki = ty % g.s; ki < g.kh; ki += g.s) {
            const int oy = (ty - ki) / g.s; /* exact: ty - ki is a multiple of s */
            if (oy < 0 || oy >= g.oh)
                continue;
            for (int kj = tx % g.s; kj < g.kw; kj += g.s) {
                const int ox = (tx - kj) / g.s;
                if (ox < 0 || ox >= g.ow)
                    continue;
                float dv[N];
                load_v<T, N>(ds + (((oy - oy0) * cols + (ox - ox0)) * kLanes + lane) * N, dv);
                const float *wt = ws + ((ki * g.kw + kj) * kLanes + lane) * N;
                for (int v = 0; v < N; v++)
                    acc[v] += wt[v] * dv[v];
            }
        }
        store_v<T, N>(dx + (in0 + (unsigned)(iy * g.w + ix)) * (unsigned)g.c + (unsigned)lc.ch0,
                      acc);
    }
}

/* Per block: for its channel vectors and every tap, the sum over the block's tiles of x * dy,
 * as part[(blockIdx.x * taps + tap) * c + ch] (double). Thread (lane, p): with taps <= 32, tap
 * p % taps over the pixels p / taps, p / taps + G, ... of each tile (G = 32 / taps parts, the
 * threads past G * taps idle); with more taps, taps p and p + 32 over every pixel. */
template <class P>
__global__ void __launch_bounds__(kLanes *kPix)
    k_dw_filter_part(dw_geom g, const typename P::T *__restrict__ x,
                     const typename P::T *__restrict__ dy, double *__restrict__ part) {
    using T = typename P::T;
    constexpr int N = P::N;
    __shared__ __align__(16) unsigned char sm[kSmem];
    const int taps = g.kh * g.kw, npix = g.th * g.tw;
    T *xs = reinterpret_cast<T *>(sm);
    T *ds = xs + g.wh * g.ww * kLanes * N;
    const lane_ch lc = lane_channels<N>(g);
    const int lane = threadIdx.x, p = threadIdx.y;
    const int G = taps <= kPix ? kPix / taps : 1;
    const int sub = taps <= kPix ? p / taps : 0;
    const int nslot = taps <= kPix ? (sub < G ? 1 : 0) : (p + kPix < taps ? 2 : 1);
    int tap[2], ty[2], tx[2];
#pragma unroll
    for (int k = 0; k < 2; k++) {
        tap[k] = taps <= kPix ? p % taps : p + k * kPix;
        ty[k] = tap[k] / g.kw;
        tx[k] = tap[k] - ty[k] * g.kw;
    }
    double acc[2][N];
#pragma unroll
    for (int k = 0; k < 2; k++)
        for (int v = 0; v < N; v++)
            acc[k][v] = 0.0;
    const unsigned tiles = (unsigned)g.n * (unsigned)g.tiles_y * (unsigned)g.tiles_x;
    for (unsigned tt = blockIdx.x; tt < tiles; tt += gridDim.x) {
        const tile_pos t = tile_of(g, tt);
        __syncthreads(); /* the previous tile's readers are done */
        load_window<T, N, false>(x, g.h, g.w, g.c, t.smp, t.y0 * g.s - g.pt, t.x0 * g.s - g.pl,
                                 g.wh, g.ww, lc, xs);
        load_window<T, N, false>(dy, g.oh, g.ow, g.c, t.smp, t.y0, t.x0, g.th, g.tw, lc, ds);
        __syncthreads();
#pragma unroll
        for (int k = 0; k < 2; k++) {
            if (k >= nslot)
                break;
            float f[N];
            for (int v = 0; v < N; v++)
                f[v] = 0.0f;
            for (int o = sub; o < npix; o += G) {
                const int r = o / g.tw, q = o - r * g.tw;
                float xv[N], dv[N];
                load_v<T, N>(
                    xs + (((r * g.s + ty[k]) * g.ww + q * g.s + tx[k]) * kLanes + lane) * N, xv);
                load_v<T, N>(ds + (o * kLanes + lane) * N, dv);
                for (int v = 0; v < N; v++)
                    f[v] += xv[v] * dv[v];
            }
            for (int v = 0; v < N; v++)
                acc[k][v] += f[v];
        }
    }
    /* the parts' sums, added in part order */
    __syncthreads();
    double *red = reinterpret_cast<double *>(sm); /* [sub][tap][lane][v] for taps <= 32 */
    if (taps <= kPix) {
        if (nslot)
            for (int v = 0; v < N; v++)
                red[((sub * taps + tap[0]) * kLanes + lane) * N + v] = acc[0][v];
        __syncthreads();
        if (p >= taps || !lc.active)
            return;
        for (int v = 0; v < N; v++) {
            double s = 0.0;
            for (int q = 0; q < G; q++)
                s += red[((q * taps + tap[0]) * kLanes + lane) * N + v];
            acc[0][v] = s;
        }
    }
    if (!lc.active)
        return;
#pragma unroll
    for (int k = 0; k < 2; k++) {
        if (k >= (taps <= kPix ? 1 : nslot))
            break;
        for (int v = 0; v < N && lc.ch0 + v < g.c; v++)
            part[((unsigned)blockIdx.x * (unsigned)taps + (unsigned)tap[k]) * (unsigned)g.c +
                 (unsigned)(lc.ch0 + v)] = acc[k][v];
    }
}

/* dw[ch][tap] = the blocks' partials of (tap, ch) added in a fixed tree (gpu_launch.h's). */
__global__ void k_dw_filter_final(int blocks, int c, int taps, const double *__restrict__ part,
                                  float *__restrict__ dw) {
    __shared__ double sh[kTreeLanes][kTreeCols];
    const int cols = c * taps, col = blockIdx.x * kTreeCols + threadIdx.x;
    const double s = tree_col_sum(part, blocks, cols, col, sh);
    if (threadIdx.y == 0 && col < cols) {
        const int tap = col / c, ch = col - tap * c;
        dw[(unsigned)ch * (unsigned)taps + (unsigned)tap] = (float)s;
    }
}

/* ---- the direct kernels: windows too large for a block's shared memory ---- */

template <class T>
__global__ void k_dw_fwd_direct(unsigned total, dw_geom g, const T *__restrict__ x,
                                const float *__restrict__ w, const float *__restrict__ b,
                                T *__restrict__ y) {
    for (unsigned o = blockIdx.x * blockDim.x + threadIdx.x; o < total;
         o += gridDim.x * blockDim.x) {
        const unsigned pix = o / (unsigned)g.c, ch = o - pix * (unsigned)g.c;
        const unsigned ox = pix % (unsigned)g.ow, t = pix / (unsigned)g.ow;
        const unsigned oy = t % (unsigned)g.oh, smp = t / (unsigned)g.oh;
        const int iy0 = (int)oy * g.s - g.pt, ix0 = (int)ox * g.s - g.pl;
        const float *wc = w + ch * (unsigned)(g.kh * g.kw);
        float acc = b ? b[ch] : 0.0f;
        for (int ki = 0; ki < g.kh; ki++) {
            const int iy = iy0 + ki;
            if (iy < 0 || iy >= g.h)
                continue;
            for (int kj = 0; kj < g.kw; kj++) {
                const int ix = ix0 + kj;
                if (ix >= 0 && ix < g.w)
                    acc += wc[ki * g.kw + kj] *
                           widen(x[((smp * g.h + iy) * g.w + ix) * (unsigned)g.c + ch]);
            }
        }
        y[o] = narrow<T>(acc);
    }
}

template <class T>
__global__ void k_dw_data_direct(unsigned total, dw_geom g, const float *__restrict__ w,
                                 const T *__restrict__ dy, T *__restrict__ dx) {
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += gridDim.x * blockDim.x) {
        const unsigned pix = i / (unsigned)g.c, ch = i - pix * (unsigned)g.c;
        const int ix = (int)(pix % (unsigned)g.w);
        const unsigned t = pix / (unsigned)g.w;
        const int iy = (int)(t % (unsigned)g.h);
        const unsigned smp = t / (unsigned)g.h;
        const float *wc = w + ch * (unsigned)(g.kh * g.kw);
        const int ty = iy + g.pt, tx = ix + g.pl;
        float acc = 0.0f;
        for (int ki = ty % g.s; ki < g.kh; ki += g.s) {
            const int oy = (ty - ki) / g.s;
            if (oy < 0 || oy >= g.oh)
                continue;
            for (int kj = tx % g.s; kj < g.kw; kj += g.s) {
                const int ox = (tx - kj) / g.s;
                if (ox >= 0 && ox < g.ow)
                    acc += wc[ki * g.kw + kj] *
                           widen(dy[((smp * g.oh + oy) * g.ow + ox) * (unsigned)g.c + ch]);
            }
        }
        dx[i] = narrow<T>(acc);
    }
}

/* Block (kTreeCols, kTreeLanes): columns col = tap * c + ch, lanes over the output pixels of
 * chunk blockIdx.y; the chunk's double partial of each column. */
template <class T>
__global__ void k_dw_filter_direct(unsigned rows, unsigned rows_per_chunk, dw_geom g,
                                   const T *__restrict__ x, const T *__restrict__ dy,
                                   double *__restrict__ part) {
    __shared__ double sh[kTreeLanes][kTreeCols];
    const int cols = g.kh * g.kw * g.c;
    const int col = blockIdx.x * kTreeCols + threadIdx.x;
    const unsigned r0 = blockIdx.y * rows_per_chunk;
    const unsigned r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
    double acc = 0.0;
    if (col < cols) {
        const int tap = col / g.c, ch = col - tap * g.c, ki = tap / g.kw, kj = tap - ki * g.kw;
        for (unsigned r = r0 + threadIdx.y; r < r1; r += kTreeLanes) {
            const unsigned ox = r % (unsigned)g.ow, t = r / (unsigned)g.ow;
            const unsigned oy = t % (unsigned)g.oh, smp = t / (unsigned)g.oh;
            const int iy = (int)oy * g.s - g.pt + ki, ix = (int)ox * g.s - g.pl + kj;
            if (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w)
                acc += (double)widen(x[((smp * g.h + iy) * g.w + ix) * (unsigned)g.c + ch]) *
                       widen(dy[r * (unsigned)g.c + ch]);
        }
    }
    const double s = tree_lanes(acc, sh);
    if (threadIdx.y == 0 && col < cols)
        part[blockIdx.y * (unsigned)cols + col] = s;
}

/* ---- launchers ---- */

/* Whether the vector path applies: the channel count a multiple of kVec and every tensor aligned
 * to the vector's bytes. */
template <class T> bool vector_ok(int c, const void *a, const void *b) {
    const unsigned bytes = kVec * sizeof(T);
    return c % kVec == 0 && aligned_to(a, bytes) && aligned_to(b, bytes);
}

/* The direct filter gradient's chunks of output pixels: a fixed count per shape. */
constexpr unsigned kDirectChunkRows = 1024, kDirectMaxChunks = 2048;
unsigned direct_chunks(const mgt_conv_shape *s) {
    const unsigned rows = (unsigned)(s->n > 0 ? s->n : 0) * s->oh * s->ow;
    const unsigned ch = (rows + kDirectChunkRows - 1) / kDirectChunkRows;
    return ch < 1 ? 1 : ch > kDirectMaxChunks ? kDirectMaxChunks : ch;
}

/* The filter gradient's partials: the most any path takes for this shape. */
size_t scratch_bytes(const mgt_conv_shape *s) {
    const size_t tc = (size_t)s->kh * s->kw * (s->c > 0 ? s->c : 0);
    size_t most = direct_chunks(s);
    for (int N : {1, kVec}) {
        const dw_geom g = geom_of(s, N, PASS_FILTER);
        const size_t b = g.kind != KIND_DIRECT ? (size_t)filter_blocks(g) : 0;
        most = b > most ? b : most;
    }
    return most * tc * sizeof(double);
}

template <class T, int N>
void fwd_tiled(cudaStream_t st, const mgt_conv_shape *s, const T *x, const float *w, const float *b,
               T *y) {
    using P = vpath<T, N>;
    const dw_geom g = geom_of(s, N, PASS_FWD);
    const dim3 grid((unsigned)g.n * g.tiles_y * g.tiles_x, (unsigned)g.groups);
    const dim3 block(kLanes, kPix);
    if (g.kind == KIND_3X3 && g.s == 1)
        MGT_LAUNCH((k_dw3_rows<P, 1, false>), grid, block, st, g, x, w, b, y);
    else if (g.kind == KIND_3X3)
        MGT_LAUNCH((k_dw3_rows<P, 2, false>), grid, block, st, g, x, w, b, y);
    else
        MGT_LAUNCH(k_dw_fwd<P>, grid, block, st, g, x, w, b, y);
}

template <class T, int N>
void data_tiled(cudaStream_t st, const mgt_conv_shape *s, const float *w, const T *dy, T *dx) {
    using P = vpath<T, N>;
    const dw_geom g = geom_of(s, N, PASS_DATA);
    const dim3 grid((unsigned)g.n * g.tiles_y * g.tiles_x, (unsigned)g.groups);
    const dim3 block(kLanes, kPix);
    if (g.kind == KIND_3X3)
        MGT_LAUNCH((k_dw3_rows<P, 1, true>), grid, block, st, g, dy, w, nullptr, dx);
    else
        MGT_LAUNCH(k_dw_bwd_data<P>, grid, block, st, g, w, dy, dx);
}

template <class T, int N>
void filter_tiled(mgt_backend *be, cudaStream_t st, const mgt_conv_shape *s, const T *x,
                  const T *dy, float *dw) {
    using P = vpath<T, N>;
    const dw_geom g = geom_of(s, N, PASS_FILTER);
    const int blocks = filter_blocks(g), taps = s->kh * s->kw, cols = taps * s->c;
    double *part = (double *)mgt_gpu_workspace(be, scratch_bytes(s));
    const dim3 grid((unsigned)blocks, (unsigned)g.groups), block(kLanes, kPix);
    if (g.kind == KIND_3X3 && g.s == 1)
        MGT_LAUNCH((k_dw3_filter<P, 1>), grid, block, st, g, x, dy, part);
    else if (g.kind == KIND_3X3)
        MGT_LAUNCH((k_dw3_filter<P, 2>), grid, block, st, g, x, dy, part);
    else
        MGT_LAUNCH(k_dw_filter_part<P>, grid, block, st, g, x, dy, part);
    MGT_LAUNCH(k_dw_filter_final, (unsigned)((cols + kTreeCols - 1) / kTreeCols),
               dim3(kTreeCols, kTreeLanes), st, blocks, s->c, taps, part, dw);
}

template <class T>
void fwd(cudaStream_t st, const mgt_conv_shape *s, const T *x, const float *w, const float *b,
         T *y) {
    const dw_geom g = geom_of(s, kVec, PASS_FWD); /* the kind is the same for N = 1 */
    if (g.kind == KIND_DIRECT) {
        const unsigned total = (unsigned)g.n * g.oh * g.ow * g.c;
        MGT_LAUNCH(k_dw_fwd_direct<T>, blocks_for(total), kThreads, st, total, g, x, w, b, y);
    } else if (vector_ok<T>(s->c, x, y)) {
        fwd_tiled<T, kVec>(st, s, x, w, b, y);
    } else {
        fwd_tiled<T, 1>(st, s, x, w, b, y);
    }
}

template <class T>
void bwd(mgt_backend *be, const mgt_conv_shape *s, const T *x, const float *w, const T *dy, T *dx,
         float *dw, float *db) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    cudaStream_t st = im->stream;
    const size_t rows = (size_t)(s->n > 0 ? s->n : 0) * s->oh * s->ow;
    if (db && s->c > 0)
        colsum_matrix<T, false>(st, &im->part, rows, s->c, dy, db, nullptr);
    const size_t nx = (size_t)(s->n > 0 ? s->n : 0) * s->h * s->w * s->c;
    if (dx && nx) {
        const dw_geom g = geom_of(s, kVec, PASS_DATA);
        if (g.kind == KIND_DIRECT)
            MGT_LAUNCH(k_dw_data_direct<T>, blocks_for(nx), kThreads, st, (unsigned)nx, g, w, dy,
                       dx);
        else if (vector_ok<T>(s->c, dy, dx))
            data_tiled<T, kVec>(st, s, w, dy, dx);
        else
            data_tiled<T, 1>(st, s, w, dy, dx);
    }
    if (!dw || s->c <= 0)
        return;
    const int taps = s->kh * s->kw, cols = taps * s->c;
    if (rows == 0) {
        GPU_CHECK(CUDA, cudaMemsetAsync(dw, 0, (size_t)cols * sizeof(float), st));
        return;
    }
    const dw_geom g = geom_of(s, kVec, PASS_FILTER);
    if (g.kind != KIND_DIRECT && vector_ok<T>(s->c, x, dy)) {
        filter_tiled<T, kVec>(be, st, s, x, dy, dw);
    } else if (g.kind != KIND_DIRECT) {
        filter_tiled<T, 1>(be, st, s, x, dy, dw);
    } else {
        const unsigned chunks = direct_chunks(s), per = ((unsigned)rows + chunks - 1) / chunks;
        double *part = (double *)mgt_gpu_workspace(be, scratch_bytes(s));
        MGT_LAUNCH(k_dw_filter_direct<T>,
                   dim3((unsigned)((cols + kTreeCols - 1) / kTreeCols), chunks),
                   dim3(kTreeCols, kTreeLanes), st, (unsigned)rows, per ? per : 1, g, x, dy, part);
        MGT_LAUNCH(k_dw_filter_final, (unsigned)((cols + kTreeCols - 1) / kTreeCols),
                   dim3(kTreeCols, kTreeLanes), st, (int)chunks, s->c, taps, part, dw);
    }
}

} /* namespace */

extern "C" {

size_t mgt_gpu_dwconv_scratch(mgt_backend *be, const mgt_conv_shape *s) {
    (void)be;
    return scratch_bytes(s);
}

void mgt_gpu_dwconv_fwd(mgt_backend *be, const mgt_conv_shape *s, const float *x, const float *w,
                        const float *b, float *y) {
    if (s->n <= 0 || s->oh <= 0 || s->ow <= 0 || s->c <= 0)
        return;
    with_act_type(mgt_gpu_impl_of(be)->bf16, [&](auto t) {
        using T = decltype(t);
        fwd<T>(mgt_gpu_stream(be), s, (const T *)x, w, b, (T *)y);
    });
}

void mgt_gpu_dwconv_bwd(mgt_backend *be, const mgt_conv_shape *s, const float *x, const float *w,
                        const float *dy, float *dx, float *dw, float *db) {
    with_act_type(mgt_gpu_impl_of(be)->bf16, [&](auto t) {
        using T = decltype(t);
        bwd<T>(be, s, (const T *)x, w, (const T *)dy, (T *)dx, dw, db);
    });
}

} /* extern "C" */
