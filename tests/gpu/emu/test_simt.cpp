/* test_simt.cpp: the SIMT engine (simt.h, simt.cpp) on its own, with a stand-in for the runtime's
 * queue: a launch runs at once (or is held, to check what the launch copied), and emu::fail
 * ends the process. Errors a real GPU would punish (divergent barriers, a shuffle whose lanes
 * cannot all arrive) are checked in fork()ed children that must fail with a message naming the
 * kernel. Prints the engine's cost per thread. */
#include "simt.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "emu_test.h"

/* ---- the runtime's stand-in ---- */

namespace {
int g_enqueued;
bool g_hold;
std::vector<std::function<void()>> g_held;
cudaError_t g_last = cudaSuccess;
} // namespace

namespace emu {
cudaError_t enqueue(cudaStream_t, std::function<void()> op, const char *) {
    g_enqueued++;
    if (g_hold)
        g_held.push_back(std::move(op));
    else
        op();
    return cudaSuccess;
}

void set_last_error(cudaError_t e) {
    g_last = e;
}
} // namespace emu

namespace {

#define LAUNCH MGT_EMU_LAUNCH

constexpr unsigned kFull = 0xffffffffu;

double seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

/* ---- kernels ---- */

__global__ void k_axpy(size_t n, float a, const float *__restrict__ x, float *__restrict__ y) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = a * x[i] + y[i];
}

/* Every thread records its indices and the dimensions it sees. */
__global__ void k_indices(unsigned *out) {
    const unsigned nt = blockDim.x * blockDim.y * blockDim.z;
    const unsigned blk = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    const unsigned t = (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
    unsigned *o = out + 12 * ((size_t)blk * nt + t);
    const unsigned v[12] = {threadIdx.x, threadIdx.y, threadIdx.z, blockIdx.x,
                            blockIdx.y,  blockIdx.z,  blockDim.x,  blockDim.y,
                            blockDim.z,  gridDim.x,   gridDim.y,   gridDim.z};
    for (int k = 0; k < 12; k++)
        o[k] = v[k];
}

/* A parameter is each thread's own copy. */
__global__ void k_param_copy(int base, int *out) {
    base += (int)threadIdx.x;
    out[threadIdx.x] = base;
}

struct pair_arg {
    int a, b;
};

__global__ void k_struct_arg(pair_arg p, int *out) {
    if (threadIdx.x == 0)
        out[0] = p.a * 1000 + p.b;
}

/* 32x32 tiles through shared memory, block (32, 8): the textbook transpose. */
constexpr int kTile = 32;

__global__ void k_transpose(int rows, int cols, const float *src, float *dst) {
    __shared__ float tile[kTile][kTile + 1];
    const int c0 = blockIdx.x * kTile, r0 = blockIdx.y * kTile;
    for (int i = threadIdx.y; i < kTile; i += blockDim.y) {
        const int r = r0 + i, c = c0 + threadIdx.x;
        if (r < rows && c < cols)
            tile[i][threadIdx.x] = src[r * cols + c];
    }
    __syncthreads();
    for (int i = threadIdx.y; i < kTile; i += blockDim.y) {
        const int c = c0 + i, r = r0 + threadIdx.x;
        if (r < rows && c < cols)
            dst[c * rows + r] = tile[threadIdx.x][i];
    }
}

/* Every lane gets its warp's sum. */
__global__ void k_warp_sum(const double *x, double *out) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    double v = x[i];
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(kFull, v, o);
    out[i] = v;
}

/* Per lane: the four shuffles with sub-warp widths, on several types. */
__global__ void k_shuffles(int *idx8, int *down3w8, long long *up2w16, float *xor4w16,
                           double *xor1) {
    const int lane = (int)(threadIdx.x & 31), t = (int)threadIdx.x;
    idx8[t] = __shfl_sync(kFull, lane * 10, 5, 8);
    down3w8[t] = __shfl_down_sync(kFull, lane, 3, 8);
    up2w16[t] = __shfl_up_sync(kFull, (long long)lane << 40, 2, 16);
    xor4w16[t] = __shfl_xor_sync(kFull, (float)lane + 0.5f, 4, 16);
    xor1[t] = __shfl_xor_sync(kFull, -(double)lane, 1);
}

/* Block sum: each warp reduces, lane 0 stores its warp's sum, then warp 0 alone reduces those. */
__global__ void k_block_sum(const int *x, long long *out) {
    __shared__ long long part[32];
    const int t = (int)threadIdx.x, lane = t & 31, warp = t >> 5;
    const int nwarps = (int)(blockDim.x >> 5);
    long long v = x[(size_t)blockIdx.x * blockDim.x + t];
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_down_sync(kFull, v, o);
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < nwarps ? part[lane] : 0;
        for (int o = 16; o > 0; o >>= 1)
            v += __shfl_xor_sync(kFull, v, o);
        if (lane == 0)
            out[blockIdx.x] = v;
    }
}

__global__ void k_votes(unsigned *ballot, int *all, int *any, int *cnt, int *band, int *bor) {
    const int t = (int)threadIdx.x, lane = t & 31;
    ballot[t] = __ballot_sync(kFull, lane % 3 == 0);
    all[t] = __all_sync(kFull, lane < 40) * 2 + __all_sync(kFull, lane < 31);
    any[t] = __any_sync(kFull, lane == 17) * 2 + __any_sync(kFull, lane > 40);
    cnt[t] = __syncthreads_count(t % 5 == 0);
    band[t] = __syncthreads_and(t < 1000) * 2 + __syncthreads_and(t != 7);
    bor[t] = __syncthreads_or(t == 9) * 2 + __syncthreads_or(t > 1000);
}

/* Legal divergence: the half-warps shuffle apart from different call sites, and lane 1 syncs
 * alone before it meets lane 0. Lanes outside a shuffle's mask read as all-ones bits. */
__global__ void k_diverge_ok(int *halves, int *pair, float *outside) {
    const int t = (int)threadIdx.x, lane = t & 31;
    if (lane < 16)
        halves[t] = __shfl_xor_sync(0x0000ffffu, lane, 1);
    else
        halves[t] = __shfl_xor_sync(0xffff0000u, lane * 100, 2);
    if (lane < 2) {
        if (lane == 1)
            __syncwarp(0x2u);
        pair[t] = __shfl_sync(0x3u, lane + 7, 1 - lane);
    }
    if (lane < 16)
        outside[t] = __shfl_down_sync(0x0000ffffu, (float)lane, 8);
}

/* Every thread of several blocks updates the same words. */
__global__ void k_atomics(int *sum, int *sub, int *mn, int *mx, int *exch, int *cas, int *won,
                          float *fsum) {
    const int t = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    atomicAdd(sum, t);
    atomicSub(sub, 1);
    atomicMin(mn, 1000 - t);
    atomicMax(mx, 3 * t);
    atomicExch(exch, t);
    atomicAdd(won, atomicCAS(cas, 0, 7) == 0 ? 1 : 0);
    atomicAdd(fsum, 0.5f);
}

/* A grid whose blocks synchronise: the cost of parking. */
__global__ void k_sync_heavy(int *out) {
    __shared__ int s[256];
    s[threadIdx.x] = (int)threadIdx.x;
    __syncthreads();
    out[(size_t)blockIdx.x * blockDim.x + threadIdx.x] = s[255 - threadIdx.x];
}

/* ---- kernels that must fail ---- */

__global__ void k_sync_after_exit(int *out) {
    if (threadIdx.x < 8)
        return;
    __syncthreads();
    out[threadIdx.x] = 1;
}

__global__ void k_exit_while_sync(int *out) {
    if (threadIdx.x < 8)
        __syncthreads();
    out[threadIdx.x] = 1;
}

__global__ void k_shfl_exited_lane(float *out) {
    if ((threadIdx.x & 31) == 5)
        return;
    out[threadIdx.x] = __shfl_xor_sync(kFull, 1.0f, 1);
}

__global__ void k_shfl_partial_warp(float *out) {
    out[threadIdx.x] = __shfl_xor_sync(kFull, 1.0f, 1);
}

__global__ void k_shfl_vs_sync(float *out) {
    if ((threadIdx.x & 31) < 16)
        out[threadIdx.x] = __shfl_xor_sync(kFull, 1.0f, 1);
    else
        __syncthreads();
}

__global__ void k_shfl_masks_disagree(int *out) {
    const int lane = (int)(threadIdx.x & 31);
    out[threadIdx.x] = __shfl_xor_sync(lane < 16 ? kFull : 0xffff0001u, lane, 1);
}

__global__ void k_shfl_not_own_lane(int *out) {
    out[threadIdx.x] = __shfl_xor_sync(0x1u, 1, 1);
}

/* ---- the checks ---- */

void test_grid_stride() {
    const size_t n = (1u << 20) + 3;
    std::vector<float> x(n), y(n);
    for (size_t i = 0; i < n; i++) {
        x[i] = (float)(i % 1000);
        y[i] = 1.0f;
    }
    LAUNCH(k_axpy, 64, 256, 0, nullptr)(n, 2.0f, x.data(), y.data());
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += y[i] != 2.0f * (float)(i % 1000) + 1.0f;
    CHECK(bad == 0, "grid-stride: %zu of %zu wrong", bad, n);
}

void test_indices() {
    const dim3 grid(3, 2, 2), block(5, 3, 2);
    const unsigned nt = 30, nb = 12;
    std::vector<unsigned> out(12 * nt * nb, ~0u);
    LAUNCH(k_indices, grid, block, 0, nullptr)(out.data());
    size_t bad = 0;
    for (unsigned bz = 0; bz < 2; bz++)
        for (unsigned by = 0; by < 2; by++)
            for (unsigned bx = 0; bx < 3; bx++)
                for (unsigned tz = 0; tz < 2; tz++)
                    for (unsigned ty = 0; ty < 3; ty++)
                        for (unsigned tx = 0; tx < 5; tx++) {
                            const unsigned blk = (bz * 2 + by) * 3 + bx, t = (tz * 3 + ty) * 5 + tx;
                            const unsigned want[12] = {tx, ty, tz, bx, by, bz, 5, 3, 2, 3, 2, 2};
                            const unsigned *o = &out[12 * ((size_t)blk * nt + t)];
                            for (int k = 0; k < 12; k++)
                                bad += o[k] != want[k];
                        }
    CHECK(bad == 0, "built-in variables: %zu wrong", bad);
}

void test_params() {
    int out[64];
    LAUNCH(k_param_copy, 1, 64, 0, nullptr)(100, out);
    int bad = 0;
    for (int t = 0; t < 64; t++)
        bad += out[t] != 100 + t;
    CHECK(bad == 0, "parameters: %d threads saw another thread's copy", bad);

    /* The arguments are copied at the launch, not when the grid runs. */
    pair_arg p{3, 4};
    int got = 0;
    g_hold = true;
    LAUNCH(k_struct_arg, 1, 32, 0, nullptr)(p, &got);
    g_hold = false;
    p.a = 9;
    for (auto &op : g_held)
        op();
    g_held.clear();
    CHECK(got == 3004, "arguments copied at the launch: got %d, want 3004", got);
}

void test_transpose() {
    const int rows = 70, cols = 45;
    std::vector<float> src((size_t)rows * cols), dst((size_t)rows * cols, -1.0f);
    for (int i = 0; i < rows * cols; i++)
        src[(size_t)i] = (float)i;
    const dim3 grid((cols + kTile - 1) / kTile, (rows + kTile - 1) / kTile), block(kTile, 8);
    LAUNCH(k_transpose, grid, block, 0, nullptr)(rows, cols, src.data(), dst.data());
    int bad = 0;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            bad += dst[(size_t)c * rows + r] != src[(size_t)r * cols + c];
    CHECK(bad == 0, "tiled transpose: %d of %d wrong", bad, rows * cols);
}

void test_warp_sum() {
    const int n = 4 * 256;
    std::vector<double> x(n), out(n);
    for (int i = 0; i < n; i++)
        x[(size_t)i] = i * 0.5;
    LAUNCH(k_warp_sum, 4, 256, 0, nullptr)(x.data(), out.data());
    int bad = 0;
    for (int i = 0; i < n; i++) {
        const int w0 = i & ~31;
        const double want = 0.5 * (32.0 * w0 + 31.0 * 32.0 / 2.0);
        bad += out[(size_t)i] != want;
    }
    CHECK(bad == 0, "warp sum (__shfl_xor_sync): %d of %d lanes wrong", bad, n);
}

void test_shuffles() {
    const int n = 64;
    int idx8[n], down[n];
    long long up[n];
    float bfly[n];
    double x1[n];
    LAUNCH(k_shuffles, 1, n, 0, nullptr)(idx8, down, up, bfly, x1);
    int bad = 0;
    for (int t = 0; t < n; t++) {
        const int l = t & 31;
        bad += idx8[t] != ((l & ~7) | 5) * 10;
        bad += down[t] != ((l & 7) + 3 < 8 ? l + 3 : l);
        bad += up[t] != (long long)((l & 15) >= 2 ? l - 2 : l) << 40;
        bad += bfly[t] != (float)(l ^ 4) + 0.5f;
        bad += x1[t] != -(double)(l ^ 1);
    }
    CHECK(bad == 0, "shuffle modes and widths: %d wrong", bad);
}

void test_block_sum() {
    const int blocks[][2] = {{1024, 3}, {96, 5}, {32, 2}};
    for (const auto &cfg : blocks) {
        const int nt = cfg[0], nb = cfg[1];
        std::vector<int> x((size_t)nt * nb);
        std::vector<long long> out((size_t)nb, -1);
        for (size_t i = 0; i < x.size(); i++)
            x[i] = (int)i;
        LAUNCH(k_block_sum, nb, nt, 0, nullptr)(x.data(), out.data());
        int bad = 0;
        for (int b = 0; b < nb; b++) {
            const long long lo = (long long)b * nt, hi = lo + nt - 1;
            bad += out[(size_t)b] != (lo + hi) * nt / 2;
        }
        CHECK(bad == 0, "block sum, %d threads: %d of %d blocks wrong", nt, bad, nb);
    }
}

void test_votes() {
    const int n = 96;
    unsigned ballot[n];
    int all[n], any[n], cnt[n], band[n], bor[n];
    LAUNCH(k_votes, 1, n, 0, nullptr)(ballot, all, any, cnt, band, bor);
    unsigned want_ballot = 0;
    for (int l = 0; l < 32; l += 3)
        want_ballot |= 1u << l;
    int bad = 0;
    for (int t = 0; t < n; t++)
        bad += ballot[t] != want_ballot || all[t] != 2 || any[t] != 2 || cnt[t] != 20 ||
               band[t] != 2 || bor[t] != 2;
    CHECK(bad == 0, "votes and counting barriers: %d threads wrong", bad);
}

void test_diverge_ok() {
    const int n = 64;
    int halves[n], pair[n];
    float outside[n];
    for (int t = 0; t < n; t++)
        pair[t] = -1;
    LAUNCH(k_diverge_ok, 1, n, 0, nullptr)(halves, pair, outside);
    int bad = 0;
    for (int t = 0; t < n; t++) {
        const int l = t & 31;
        bad += halves[t] != (l < 16 ? l ^ 1 : (l ^ 2) * 100);
        bad += pair[t] != (l < 2 ? (1 - l) + 7 : -1);
        if (l < 8)
            bad += outside[t] != (float)(l + 8);
        else if (l < 16)
            bad += !std::isnan(outside[t]);
    }
    CHECK(bad == 0, "legal divergence: %d wrong", bad);
}

void test_atomics() {
    const int n = 4 * 64;
    int sum = 0, sub = 0, mn = 1 << 30, mx = -1, exch = -1, cas = 0, won = 0;
    float fsum = 0.0f;
    LAUNCH(k_atomics, 4, 64, 0, nullptr)(&sum, &sub, &mn, &mx, &exch, &cas, &won, &fsum);
    CHECK(sum == n * (n - 1) / 2 && sub == -n && mn == 1000 - (n - 1) && mx == 3 * (n - 1) &&
              fsum == 0.5f * n,
          "atomicAdd/Sub/Min/Max: sum %d sub %d min %d max %d float sum %g", sum, sub, mn, mx,
          (double)fsum);
    CHECK(exch >= 0 && exch < n && cas == 7 && won == 1,
          "atomicExch/CAS: exch %d, cas %d, %d threads won the CAS", exch, cas, won);
}

void test_config() {
    struct cfg {
        dim3 grid, block;
        size_t smem;
        bool ok;
    };
    const cfg cases[] = {
        {dim3(1), dim3(1024), 0, true},
        {dim3(1), dim3(1, 1, 64), 0, true},
        {dim3(1), dim3(32, 32), 48 * 1024, true},
        {dim3(0x7fffffffu, 65535, 65535), dim3(1), 0, true},
        {dim3(1), dim3(1025), 0, false},
        {dim3(1), dim3(32, 33), 0, false},
        {dim3(1), dim3(1, 1, 65), 0, false},
        {dim3(1), dim3(0), 0, false},
        {dim3(1), dim3(1, 1025), 0, false},
        {dim3(0), dim3(32), 0, false},
        {dim3(0x80000000u), dim3(32), 0, false},
        {dim3(1, 65536), dim3(32), 0, false},
        {dim3(1, 1, 65536), dim3(32), 0, false},
        {dim3(1, 0), dim3(32), 0, false},
        {dim3(1), dim3(32), 48 * 1024 + 1, false},
    };
    g_hold = true;
    for (const cfg &c : cases) {
        g_last = cudaSuccess;
        const int before = g_enqueued;
        LAUNCH(k_axpy, c.grid, c.block, c.smem, nullptr)(0, 1.0f, nullptr, nullptr);
        const bool queued = g_enqueued == before + 1;
        CHECK(queued == c.ok && (g_last == cudaSuccess) == c.ok,
              "grid (%u,%u,%u) block (%u,%u,%u) smem %zu: queued %d, error %d", c.grid.x, c.grid.y,
              c.grid.z, c.block.x, c.block.y, c.block.z, c.smem, (int)queued, (int)g_last);
    }
    g_held.clear(); /* the valid ones are not run: some are huge */
    g_hold = false;
    g_last = cudaSuccess;
}

/* Runs f in a child that must end through emu::fail with a message containing each of `want`. */
void expect_failure(const char *what, void (*f)(), std::initializer_list<const char *> want) {
    const emu_test::Death d = emu_test::run_child(f);
    bool named = true;
    for (const char *w : want)
        named = named && d.err.find(w) != std::string::npos;
    CHECK(d.failed && named, "%s: want a failure naming the fault, got status 0x%x, stderr: %s",
          what, d.status, d.err.c_str());
    if (d.failed && named)
        printf("  %s -> %s", what, d.err.c_str());
}

int g_iout[2048];
float g_fout[2048];

void run_sync_after_exit() {
    LAUNCH(k_sync_after_exit, 2, 64, 0, nullptr)(g_iout);
}
void run_exit_while_sync() {
    LAUNCH(k_exit_while_sync, 1, dim3(16, 2), 0, nullptr)(g_iout);
}
void run_shfl_exited_lane() {
    LAUNCH(k_shfl_exited_lane, 1, 64, 0, nullptr)(g_fout);
}
void run_shfl_partial_warp() {
    LAUNCH(k_shfl_partial_warp, 1, 48, 0, nullptr)(g_fout);
}
void run_shfl_vs_sync() {
    LAUNCH(k_shfl_vs_sync, 1, 32, 0, nullptr)(g_fout);
}
void run_shfl_masks_disagree() {
    LAUNCH(k_shfl_masks_disagree, 1, 32, 0, nullptr)(g_iout);
}
void run_shfl_not_own_lane() {
    LAUNCH(k_shfl_not_own_lane, 1, 32, 0, nullptr)(g_iout);
}
void run_sync_on_host() {
    __syncthreads();
}

void test_failures() {
    expect_failure("__syncthreads after some threads exited", run_sync_after_exit,
                   {"k_sync_after_exit", "block (0,0,0)",
                    "thread (8,0,0) reached __syncthreads after thread (0,0,0) has exited"});
    expect_failure("threads exit while others wait at __syncthreads", run_exit_while_sync,
                   {"k_exit_while_sync", "thread (8,0,0) has exited", "__syncthreads"});
    expect_failure("shuffle naming an exited lane", run_shfl_exited_lane,
                   {"k_shfl_exited_lane", "__shfl_xor_sync", "(5,0,0)", "exited"});
    expect_failure("full-mask shuffle in a partial warp", run_shfl_partial_warp,
                   {"k_shfl_partial_warp", "only 16 threads"});
    expect_failure("shuffle against __syncthreads", run_shfl_vs_sync,
                   {"k_shfl_vs_sync", "__shfl_xor_sync", "__syncthreads"});
    expect_failure("lanes disagree on the mask", run_shfl_masks_disagree,
                   {"k_shfl_masks_disagree", "mask 0xffffffff", "mask 0xffff0001"});
    expect_failure("mask without the caller's lane", run_shfl_not_own_lane,
                   {"k_shfl_not_own_lane", "does not name its own lane 1"});
    expect_failure("__syncthreads outside a kernel", run_sync_on_host,
                   {"__syncthreads called outside a kernel"});
}

/* Nanoseconds per thread of a grid of `blocks` x 256 threads. */
template <class F> double ns_per_thread(unsigned blocks, F launch) {
    launch(); /* warm: stacks mapped, pages touched */
    const double t0 = seconds();
    launch();
    return (seconds() - t0) * 1e9 / ((double)blocks * 256);
}

void report_costs() {
    const unsigned blocks = 16384; /* 4M threads */
    const size_t n = (size_t)blocks * 256;
    std::vector<float> x(n, 1.0f), y(n, 0.0f);
    std::vector<int> iy(n);
    std::vector<double> dx(n, 1.0), dy(n);
    const double plain = ns_per_thread(blocks, [&] {
        LAUNCH(k_axpy, blocks, 256, 0, nullptr)(n, 2.0f, x.data(), y.data());
    });
    int *iyp = iy.data();
    const double sync = ns_per_thread(blocks, [&] {
        LAUNCH(k_sync_heavy, blocks, 256, 0, nullptr)(iyp); /* one __syncthreads per thread */
    });
    const double shfl = ns_per_thread(blocks, [&] {
        LAUNCH(k_warp_sum, blocks, 256, 0, nullptr)(dx.data(), dy.data());
    });
    CHECK(y[12345] == 4.0f && iy[256 + 3] == 252 && dy[77] == 32.0, "timed kernels' results");
    printf("cost per thread: %.1f ns without synchronisation, %.1f ns with one __syncthreads, "
           "%.1f ns with five shuffles\n",
           plain, sync, shfl);
}

} // namespace

int main() {
    test_grid_stride();
    test_indices();
    test_params();
    test_transpose();
    test_warp_sum();
    test_shuffles();
    test_block_sum();
    test_votes();
    test_diverge_ok();
    test_atomics();
    test_config();
    test_failures();
    report_costs();
    return emu_test::finish("test_simt");
}
