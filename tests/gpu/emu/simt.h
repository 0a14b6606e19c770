/* simt.h: CUDA's execution model on the host, for the emulation (emu.h). Force-included
 * (g++ -x c++ -include tests/gpu/emu/simt.h -DMGT_EMU) when cuda/'s kernel files are compiled
 * without nvcc, so that the kernels run unchanged on the CPU with CUDA's SIMT semantics.
 *
 * Model (the engine is simt.cpp):
 *   - A launch (MGT_EMU_LAUNCH) checks its configuration as cudaLaunchKernel does, copies the
 *     arguments and queues the grid on its stream (emu::enqueue). The grid runs block after block
 *     on the thread that runs the stream's work.
 *   - The threads of a block are fibers (64 KiB stacks, reused). A thread runs until it exits or
 *     reaches __syncthreads or a warp operation; there it parks until its partners arrive. A
 *     kernel without either costs about a function call per thread.
 *   - __syncthreads waits for every thread of the block: a thread that exits while others wait
 *     there is a divergence error (emu::fail), not the silent "exited threads count as arrived"
 *     of real hardware. Warps are 32 consecutive threads of the flattened index
 *     x + y * blockDim.x + z * blockDim.x * blockDim.y; a *_sync operation waits for every lane
 *     its mask names, and a mask naming a lane that has exited, or that the block does not have,
 *     is an error. Lanes meet at any *_sync call of the same kind and mask (sm_70 and later:
 *     the call sites need not be the same). A shuffle from a lane outside the mask returns
 *     all-ones bits (NaN for floats).
 *   - __shared__ variables are static thread_local: the threads of a block share them, blocks
 *     run one after another, and two host threads running kernels do not collide. Like CUDA's,
 *     they are not reset between blocks. Dynamic shared memory (extern __shared__) is not
 *     supported.
 *   - Atomics are plain read-modify-writes: threads switch only at the synchronisation points. */
#ifndef MGT_EMU_SIMT_H
#define MGT_EMU_SIMT_H

/* The real CUDA headers first: without nvcc they declare the runtime API and the vector types
 * (dim3, uint3) and define the execution-space keywords as nothing; threadIdx and the device
 * functions are nvcc-only, and are defined below. */
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include "emu.h"

/* ---- execution spaces ---- */
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __launch_bounds__
#undef __shared__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
/* thread_local implies static at block scope, so "static __shared__" still compiles. */
#define __shared__ thread_local

namespace emu {
namespace simt {

/* The built-in variables of the thread that runs now (set by the engine at every switch). */
struct regs_t {
    uint3 tid{}, bid{};
    dim3 bdim, gdim;
};
inline thread_local regs_t regs{};

/* ---- engine (simt.cpp) ---- */

/* Runs the grid now, block after block; thunk(args) is one thread's body. */
void run_grid(const char *name, dim3 grid, dim3 block, void (*thunk)(const void *),
              const void *args);

/* __syncthreads with a predicate: the number of threads of the block that passed non-zero. */
int barrier(int pred);

/* Warp operations: every lane named in mask arrives with (bits, b, c); see PTX shfl.sync. */
enum warp_kind { W_IDX, W_UP, W_DOWN, W_BFLY, W_SYNC, W_BALLOT, W_ALL, W_ANY };
uint64_t warp_op(int kind, unsigned mask, uint64_t bits, int b, int c, int size);

/* ---- launches ---- */

/* cudaLaunchKernel's checks of a configuration (before any opt-in to more shared memory). */
inline bool config_ok(const dim3 &g, const dim3 &b, size_t smem) {
    const unsigned long long threads = (unsigned long long)b.x * b.y * b.z;
    return threads >= 1 && threads <= 1024 && b.x <= 1024 && b.y <= 1024 && b.z <= 64 && g.x >= 1 &&
           g.x <= 0x7fffffffu && g.y >= 1 && g.y <= 65535 && g.z >= 1 && g.z <= 65535 &&
           smem <= 48 * 1024;
}

/* One thread: the kernel called with (copies of) the launch's arguments, as each CUDA thread
 * gets its own copy of the parameters. */
template <auto K, class Args> void thunk(const void *args) {
    std::apply(K, *static_cast<const Args *>(args));
}

template <auto K, class F = decltype(K)> class launcher;

template <auto K, class... P> class launcher<K, void (*)(P...)> {
    static_assert(!(std::is_reference_v<P> || ...), "kernel parameters are passed by value");

  public:
    launcher(const char *name, dim3 grid, dim3 block, size_t smem, cudaStream_t stream)
        : name_(name), grid_(grid), block_(block), smem_(smem), stream_(stream) {}

    /* The arguments convert to the parameter types here, at the launch, as with <<<>>>. */
    void operator()(P... args) const {
        if (!config_ok(grid_, block_, smem_)) {
            ::emu::set_last_error(cudaErrorInvalidConfiguration);
            return;
        }
        using Args = std::tuple<P...>;
        (void)::emu::enqueue(/* its failure is the last error, as a launch's */
                             stream_,
                             [name = name_, grid = grid_, block = block_, args = Args(args...)] {
                                 run_grid(name, grid, block, &thunk<K, Args>, &args);
                             },
                             name_);
    }

  private:
    const char *name_;
    dim3 grid_, block_;
    size_t smem_;
    cudaStream_t stream_;
};

template <auto K>
launcher<K> launch(const char *name, dim3 grid, dim3 block, size_t smem, cudaStream_t stream) {
    return launcher<K>(name, grid, block, smem, stream);
}

template <class T> inline uint64_t bits_of(T v) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "");
    uint64_t u = 0;
    std::memcpy(&u, &v, sizeof v);
    return u;
}

template <class T> inline T from_bits(uint64_t u) {
    T v;
    std::memcpy(&v, &u, sizeof v);
    return v;
}

template <class To, class From> inline To bit_cast(From v) {
    static_assert(sizeof(To) == sizeof(From), "");
    To t;
    std::memcpy(&t, &v, sizeof t);
    return t;
}

template <class T> inline T shfl(int kind, unsigned mask, T v, int b, int c) {
    return from_bits<T>(warp_op(kind, mask, bits_of(v), b, c, (int)sizeof(T)));
}

/* An atomic that always stores: *p = f(old), returning old. A plain read-modify-write suffices, as
 * threads switch only at the synchronisation points. */
template <class T, class F> inline T atomic_update(T *p, F f) {
    const T old = *p;
    *p = f(old);
    return old;
}

} // namespace simt
} // namespace emu

/* k<<<grid, block, smem, stream>>>(args...) is
 * MGT_EMU_LAUNCH(k, grid, block, smem, stream)(args...). */
#define MGT_EMU_LAUNCH(k, grid, block, smem, stream)                                               \
    ::emu::simt::launch<&k>(#k, grid, block, smem, stream)

/* ---- built-in variables (read-only, as in CUDA) ---- */
#define threadIdx (static_cast<const uint3 &>(::emu::simt::regs.tid))
#define blockIdx (static_cast<const uint3 &>(::emu::simt::regs.bid))
#define blockDim (static_cast<const dim3 &>(::emu::simt::regs.bdim))
#define gridDim (static_cast<const dim3 &>(::emu::simt::regs.gdim))
static constexpr int warpSize = 32;

/* ---- synchronisation ---- */
inline void __syncthreads() {
    (void)::emu::simt::barrier(1);
}
inline int __syncthreads_count(int pred) {
    return ::emu::simt::barrier(pred);
}
inline int __syncthreads_and(int pred) {
    return ::emu::simt::barrier(pred) == (int)(blockDim.x * blockDim.y * blockDim.z);
}
inline int __syncthreads_or(int pred) {
    return ::emu::simt::barrier(pred) != 0;
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
    (void)::emu::simt::warp_op(::emu::simt::W_SYNC, mask, 0, 0, 0, 0);
}
inline void __threadfence() {}
inline void __threadfence_block() {}
inline void __threadfence_system() {}

inline unsigned __ballot_sync(unsigned mask, int pred) {
    return (unsigned)::emu::simt::warp_op(::emu::simt::W_BALLOT, mask, pred != 0, 0, 0, 0);
}
inline int __all_sync(unsigned mask, int pred) {
    return (unsigned)::emu::simt::warp_op(::emu::simt::W_ALL, mask, pred != 0, 0, 0, 0) == mask;
}
inline int __any_sync(unsigned mask, int pred) {
    return ::emu::simt::warp_op(::emu::simt::W_ANY, mask, pred != 0, 0, 0, 0) != 0;
}

/* The c operand of shfl.sync for a width, as CUDA's own wrappers compute it. */
#define MGT_SIMT_SHFL(T)                                                                           \
    inline T __shfl_sync(unsigned mask, T v, int src, int width = warpSize) {                      \
        return ::emu::simt::shfl(::emu::simt::W_IDX, mask, v, src,                                 \
                                 ((warpSize - width) << 8) | 0x1f);                                \
    }                                                                                              \
    inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {            \
        return ::emu::simt::shfl(::emu::simt::W_UP, mask, v, (int)delta, (warpSize - width) << 8); \
    }                                                                                              \
    inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {          \
        return ::emu::simt::shfl(::emu::simt::W_DOWN, mask, v, (int)delta,                         \
                                 ((warpSize - width) << 8) | 0x1f);                                \
    }                                                                                              \
    inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = warpSize) {            \
        return ::emu::simt::shfl(::emu::simt::W_BFLY, mask, v, lane_mask,                          \
                                 ((warpSize - width) << 8) | 0x1f);                                \
    }
MGT_SIMT_SHFL(int)
MGT_SIMT_SHFL(unsigned)
MGT_SIMT_SHFL(long)
MGT_SIMT_SHFL(unsigned long)
MGT_SIMT_SHFL(long long)
MGT_SIMT_SHFL(unsigned long long)
MGT_SIMT_SHFL(float)
MGT_SIMT_SHFL(double)
#undef MGT_SIMT_SHFL

/* ---- device functions without a host twin ----
 * glibc declares __expf, __logf and the like itself (its internal names), so those are macros
 * for the precise functions; the fast versions' lower accuracy is not emulated. */
#define __expf(x) ::expf(x)
#define __exp10f(x) ::powf(10.0f, (x))
#define __logf(x) ::logf(x)
#define __log2f(x) ::log2f(x)
#define __log10f(x) ::log10f(x)
#define __sinf(x) ::sinf(x)
#define __cosf(x) ::cosf(x)
#define __tanf(x) ::tanf(x)
#define __powf(x, y) ::powf((x), (y))

inline float rsqrtf(float x) {
    return 1.0f / ::sqrtf(x);
}
inline double rsqrt(double x) {
    return 1.0 / ::sqrt(x);
}
inline float __fdividef(float x, float y) {
    return x / y;
}
inline float __frcp_rn(float x) {
    return 1.0f / x;
}
inline float __fsqrt_rn(float x) {
    return ::sqrtf(x);
}
inline float __fadd_rn(float x, float y) {
    return x + y;
}
inline float __fmul_rn(float x, float y) {
    return x * y;
}
inline float __fmaf_rn(float x, float y, float z) {
    return ::fmaf(x, y, z);
}
inline float __saturatef(float x) {
    return x >= 1.0f ? 1.0f : (x > 0.0f ? x : 0.0f);
}

inline unsigned __float_as_uint(float x) {
    return ::emu::simt::bit_cast<unsigned>(x);
}
inline float __uint_as_float(unsigned x) {
    return ::emu::simt::bit_cast<float>(x);
}
inline int __float_as_int(float x) {
    return ::emu::simt::bit_cast<int>(x);
}
inline float __int_as_float(int x) {
    return ::emu::simt::bit_cast<float>(x);
}
inline long long __double_as_longlong(double x) {
    return ::emu::simt::bit_cast<long long>(x);
}
inline double __longlong_as_double(long long x) {
    return ::emu::simt::bit_cast<double>(x);
}

inline int __popc(unsigned x) {
    return __builtin_popcount(x);
}
inline int __popcll(unsigned long long x) {
    return __builtin_popcountll(x);
}
inline int __clz(int x) {
    return x ? __builtin_clz((unsigned)x) : 32;
}
inline int __clzll(long long x) {
    return x ? __builtin_clzll((unsigned long long)x) : 64;
}
inline int __ffs(int x) {
    return __builtin_ffs(x);
}
inline int __ffsll(long long x) {
    return __builtin_ffsll(x);
}
inline unsigned __brev(unsigned x) {
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
    return __builtin_bswap32(x);
}

template <class T> inline T __ldg(const T *p) {
    return *p;
}

template <class T> inline T atomicAdd(T *p, T v) {
    return ::emu::simt::atomic_update(p, [v](T old) { return old + v; });
}
template <class T> inline T atomicSub(T *p, T v) {
    return ::emu::simt::atomic_update(p, [v](T old) { return old - v; });
}
template <class T> inline T atomicExch(T *p, T v) {
    return ::emu::simt::atomic_update(p, [v](T) { return v; });
}
template <class T> inline T atomicMin(T *p, T v) {
    return ::emu::simt::atomic_update(p, [v](T old) { return v < old ? v : old; });
}
template <class T> inline T atomicMax(T *p, T v) {
    return ::emu::simt::atomic_update(p, [v](T old) { return v > old ? v : old; });
}
template <class T> inline T atomicCAS(T *p, T cmp, T v) {
    const T old = *p;
    if (old == cmp) /* no store otherwise */
        *p = v;
    return old;
}

#endif
