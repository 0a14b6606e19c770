/* gpu.h: what the trainer asks of the GPU backend in cuda/. The functions exist only in builds
 * that found a CUDA toolkit (MGT_HAVE_CUDA); every other build has the CPU backend alone.
 *
 * A build with CUDA still runs on a machine without a GPU: mgt_gpu_count then returns -1 with the
 * driver's reason, and --device auto falls back to the CPU. */
#ifndef MGT_GPU_H
#define MGT_GPU_H

#include <stddef.h>

#include "backend.h"
#include "comm.h"
#include "util.h"

#ifdef MGT_HAVE_CUDA
/* 1 when the GPU backend's code is at hand (its library loads, or it is linked in); 0 when it
 * cannot be loaded here (then the functions below report that, or count nothing). */
int mgt_gpu_loadable(void);
/* 0 when this machine cannot have a usable GPU because NVIDIA's driver library (libcuda.so.1)
 * cannot be loaded: --device auto asks this first, so that a CPU machine never maps the CUDA
 * libraries (cuDNN, cuBLAS and NCCL are hundreds of MiB, and loading them costs every process
 * of a CPU job time at start-up) only to hear that there is no driver. 1 otherwise, and where
 * the backend is linked in: then mgt_gpu_count answers. --device gpu does not ask, so that its
 * message names what is missing, the driver or a library. */
int mgt_gpu_may_exist(void);
/* Visible CUDA devices (after CUDA_VISIBLE_DEVICES), or -1 with the reason in why. */
int mgt_gpu_count(char *why, size_t n);
/* "NVIDIA H100 80GB HBM3, PCI 0000:18:00.0, 79 GiB" for messages and the start-up block. */
void mgt_gpu_describe(int device, char *buf, size_t n);
/* What mgt_gpu_backend_init's `math` may hold (or'ed): MGT_GPU_TF32 lets cuDNN and cuBLAS use
 * TF32 tensor cores for float32 (--tf32); MGT_GPU_BF16 gives the dense layers and convolutions
 * bfloat16 inputs with float accumulation (--precision bf16); MGT_GPU_DETERMINISTIC
 * (--reproducible) makes each convolution shape's algorithm a deterministic one that depends on
 * the shape alone. 0: plain fp32. */
enum { MGT_GPU_TF32 = 1, MGT_GPU_BF16 = 2, MGT_GPU_DETERMINISTIC = 4 };
/* Binds this process to `device` and builds the GPU op table on it (cuDNN, cuBLAS, kernels),
 * with the arithmetic `math` asks for. */
int mgt_gpu_backend_init(mgt_backend *be, int device, int math, mgt_err *err);
/* The most device memory the backend has held at once: its own allocations (tensors, arenas,
 * workspaces), the CUDA context and the libraries' handles excluded, as PyTorch's
 * torch.cuda.max_memory_allocated counts. */
size_t mgt_gpu_peak_bytes(const mgt_backend *be);
/* --algo-cache FILE: each convolution shape's algorithm per direction is taken from FILE where
 * an earlier run on the same GPU model and cuDNN version measured it, and measured otherwise;
 * at the end rank 0 writes FILE again with what this run measured (atomically). -1 with the
 * reason when FILE exists but is not such a file. */
int mgt_gpu_algo_cache(mgt_backend *be, const char *path, mgt_err *err);
/* Several ranks on one GPU (`same_gpu`: a communicator of those ranks; the backend takes it and
 * frees it): the convolution algorithms are measured once per GPU, by the lowest rank of
 * same_gpu, whose choices the others take (MPI_Bcast at each shape's first call, which every rank
 * makes in the same order; `c`'s watchdog times it), rather than measured again by every rank
 * under the others' load. */
void mgt_gpu_share_measurements(mgt_backend *be, MPI_Comm same_gpu, mgt_comm *c);
/* The rate of a large device-to-device copy on this backend's GPU, in bytes read and written
 * per second, measured at the first call (a few copies of 256 MiB, fewer where memory is short,
 * timed with device events; the memory is the backend's for a moment, outside its account of
 * what it holds), and the GPU's name into `name` (n bytes). 0 where it cannot be measured. */
double mgt_gpu_copy_rate(mgt_backend *be, char *name, size_t n);
/* The convolution workspace a shape comes to hold with `math` (as mgt_gpu_backend_init takes
 * it): the copies the convolution makes (transposed filters, padded input, bfloat16 or NCHW
 * copies) and the allowance for cuDNN's own workspace. The backend holds the largest of its
 * layers' (for `mgtrain summary`'s memory estimate). */
size_t mgt_gpu_conv_workspace(const mgt_conv_shape *s, int math);
/* The same for a depthwise convolution's filter gradient (its partial sums). */
size_t mgt_gpu_dwconv_workspace(const mgt_conv_shape *s);
/* The workspace the backend holds now. */
size_t mgt_gpu_workspace_bytes(const mgt_backend *be);
/* The NCCL transport for device buffers, bootstrapped over `mpi` (rank 0's unique id broadcast
 * with MPI_Bcast). Host-side collectives (broadcast, gathers, metric sums) stay on MPI. Returns
 * 0, -1 on an error of this rank alone, or MGT_NCCL_FAILED_ALL when the communicator failed to
 * start and every rank knows it (the message, the same on every rank, names the rank). */
enum { MGT_NCCL_FAILED_ALL = -2 };
int mgt_comm_init_nccl(mgt_comm *c, MPI_Comm mpi, mgt_backend *be, double timeout_s, mgt_err *err);
/* For tests only (--share-gpu): lets several ranks of one communicator use the same GPU, by
 * NCCL's route for it (NCCL_MULTI_RANK_GPU_ENABLE from NCCL 2.30, else a host id per rank and
 * sockets; nccl_comm.c). Call before any NCCL communicator exists; `nodes`: the job's node
 * count. Writes the route into `route` and returns the NCCL version code (0: unknown). */
int mgt_nccl_share_gpu(int rank, int nodes, char *route, size_t n);
/* The backend's line of `mgtrain --version` (gpu_version.c): "CUDA 13.0, cuDNN 9.19.0, NCCL
 * 2.28.9", the versions of the libraries loaded, with the headers' where they differ. No GPU
 * needed. */
void mgt_gpu_version(char *buf, size_t n);
#endif

#endif
