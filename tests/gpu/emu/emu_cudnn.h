/* emu_cudnn.h: what the emulated cuDNN's classic API (emu_cudnn.cpp, which owns the handles and
 * the last error) shares with its backend API (emu_cudnn_graph.cpp). */
#ifndef MGT_EMU_CUDNN_H
#define MGT_EMU_CUDNN_H

#include <cudnn.h>

namespace emu {

/* The stream of handle h (cudnnSetStream). A handle that is not live (destroyed, or never
 * created) ends the process through emu::fail, naming `fn`, as the real library would
 * dereference it. h must not be NULL. */
cudaStream_t cudnn_stream(cudnnHandle_t h, const char *fn);

/* Sets the message cudnnGetLastErrorString reports next on this thread; returns st. */
cudnnStatus_t cudnn_error(cudnnStatus_t st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

} // namespace emu

#endif
