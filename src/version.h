/* version.h: what `mgtrain --version` prints: the version, the backends this binary was built
 * with and the libraries they use. */
#ifndef MGT_VERSION_H
#define MGT_VERSION_H

#include <stddef.h>

/* The lines of `mgtrain --version`, each ending in '\n', into buf (cut at n - 1 bytes). */
void mgt_version_text(char *buf, size_t n);

#ifdef MGT_HAVE_CUDA
/* The GPU backend's line (cuda/gpu_version.c): "CUDA 13.0, cuDNN 9.19.0, NCCL 2.28.9", the
 * versions of the libraries loaded, with the headers' where they differ. No GPU needed. */
void mgt_gpu_version(char *buf, size_t n);
#endif

#endif
