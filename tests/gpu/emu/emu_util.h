/* emu_util.h: what the emulated libraries (emu_cublas.cpp, emu_cudnn.cpp, emu_cudnn_graph.cpp)
 * share: the registry of live handles and descriptors, the destruction of a handle, and TF32 and
 * bfloat16 rounding. Header-only, so that each of them stays one source file. */
#ifndef MGT_EMU_UTIL_H
#define MGT_EMU_UTIL_H

#include <cstdint>
#include <cstring>
#include <mutex>
#include <unordered_set>

#include "emu.h"

namespace emu {

/* The objects a library has created and not yet destroyed. A pointer that is not here is a use
 * after destroy (or garbage), which the real library would dereference. */
class LiveSet {
  public:
    void add(const void *p) {
        std::lock_guard<std::mutex> g(mu_);
        set_.insert(p);
    }
    /* Whether p was live. */
    bool remove(const void *p) {
        std::lock_guard<std::mutex> g(mu_);
        return set_.erase(p) != 0;
    }
    bool contains(const void *p) const {
        std::lock_guard<std::mutex> g(mu_);
        return set_.count(p) != 0;
    }

  private:
    mutable std::mutex mu_;
    std::unordered_set<const void *> set_;
};

/* cublasDestroy and cudnnDestroy, once the handle is known to be live: first the implicit device
 * synchronisation they document (queued work holds copies of everything it needs, so running what
 * can run is enough), then the handle. */
template <typename H> void destroy_handle(LiveSet &live, H *h) {
    while (progress()) {
    }
    live.remove(h);
    delete h;
}

/* Round-to-nearest-even to TF32's 10 mantissa bits, as tensor cores read float inputs; Inf and
 * NaN pass through. */
inline float to_tf32(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7f800000u) != 0x7f800000u) {
        u += 0x0fffu + ((u >> 13) & 1u);
        u &= ~0x1fffu;
    }
    std::memcpy(&f, &u, sizeof f);
    return f;
}

/* bfloat16: the top 16 bits of a float (8 exponent bits, 8 significant bits, unit roundoff
 * 2^-8). Widening is exact. */
inline float bf16_to_float(uint16_t b) {
    const uint32_t u = (uint32_t)b << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

/* Round-to-nearest-even of a float to bfloat16 (what __float2bfloat16_rn does); NaN stays a
 * (quiet) NaN, infinities stay. */
inline uint16_t bf16_from_float(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Round-to-nearest-even of a double to bfloat16 in one rounding. Rounding to float first is
 * exact enough except where the float lands exactly halfway between two bfloat16 values while
 * the double does not: then the double's side decides (the midpoints are floats, so a double
 * on one side of one rounds to a float on the same side or onto it). */
inline uint16_t bf16_from_double(double d) {
    const float f = (float)d;
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7f800000u) != 0x7f800000u && (u & 0xffffu) == 0x8000u && (double)f != d) {
        const bool away = (d < 0 ? -d : d) > (f < 0 ? -(double)f : (double)f);
        return (uint16_t)((u >> 16) + (away ? 1u : 0u));
    }
    return bf16_from_float(f);
}

} // namespace emu

#endif
