/* emu_util.h: what the emulated libraries (emu_cublas.cpp, emu_cudnn.cpp) share: the registry of
 * live handles and descriptors, the destruction of a handle, and TF32 rounding. Header-only, so
 * that each library stays one source file. */
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

} // namespace emu

#endif
