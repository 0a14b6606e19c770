/* emu.h: the internal interface of the host emulation of the CUDA stack (tests/gpu/emu/).
 *
 * The emulation lets the GPU backend's own code -- the host files of cuda/ and its kernel files (gpu_*.cu) --
 * run on a machine without a GPU, so that its logic (indexing, layouts, stream order, the NCCL
 * polling, placement) is tested in every CI run. It is compiled against the REAL CUDA, cuBLAS,
 * cuDNN and NCCL headers and provides the functions the backend calls, in place of libcudart,
 * libcublas, libcudnn and libnccl. It checks NVIDIA's documented semantics, not NVIDIA's
 * libraries: a real GPU run remains the only test of those.
 *
 * Model:
 *   - Device memory is one reserved address range, inaccessible (PROT_NONE) to host code. It is
 *     opened only while queued work runs, so a host dereference of a device pointer crashes at
 *     once, as on a real machine. Fresh allocations are filled with NaN bytes (0xff).
 *   - Every stream is a FIFO of operations. Work does not run when it is queued: it runs, in
 *     stream order, when the host waits (synchronize, event query, a blocking copy). An operation
 *     may be "not ready" (an event it waits for, an MPI request behind an NCCL collective); then
 *     its stream stalls there, as on a GPU.
 *   - Pageable host memory given to an async host-to-device copy is snapshotted at the call (the
 *     driver stages it); pinned memory (cudaHostAlloc) is read when the copy runs, so a host that
 *     overwrites a pinned buffer too early is caught by the results.
 */
#ifndef MGT_EMU_H
#define MGT_EMU_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
#include <functional>

namespace emu {

/* Queues `op` on stream `s` (0 = the legacy default stream). `what` names it in diagnostics.
 * Returns cudaErrorStreamCaptureInvalidated (also as the last error), queueing nothing, when s is
 * capturing and its capture has been invalidated: as CUDA, every call that queues work on such a
 * stream fails until the capture ends. */
cudaError_t enqueue(cudaStream_t s, std::function<void()> op, const char *what);

/* Queues a gate: the stream's later operations wait until ready() returns true. ready() runs
 * with device memory open, on the thread that waits; it must not block. Returns as enqueue. */
cudaError_t enqueue_gate(cudaStream_t s, std::function<bool()> ready, const char *what);

/* What MGT_EMU_CAPTURE=LIB-CALL asks of library `lib` ("cudnn", "cublas") called on stream s:
 * when s is capturing, the call a library may make inside a capture that CUDA cannot hold
 * (CALL: "query", cudaStreamQuery of s; "sync", cudaStreamSynchronize of s; "alloc", cudaMalloc),
 * made here, which invalidates the capture. Nothing otherwise. */
void library_call_in_capture(const char *lib, cudaStream_t s);

/* The error cudaGetLastError() reports next (a failed launch configuration, say). */
void set_last_error(cudaError_t e);

/* Whether [p, p + bytes) lies inside one live device allocation. */
bool is_device(const void *p, size_t bytes);

/* Runs queued work of every stream as far as it can go without waiting; returns whether any ran. */
bool progress(void);

/* The machine's index of the current device (CUDA_VISIBLE_DEVICES maps visible to physical). */
int physical_device(void);

/* Ends the process with "emulated GPU: <message>" on stderr: a misuse a real GPU would punish
 * (an illegal address, a host pointer given where device memory is required). */
[[noreturn]] void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

} // namespace emu
#endif

#endif
