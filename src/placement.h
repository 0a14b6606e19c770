/* placement.h: where this rank computes and how its gradients travel, chosen once at start-up.
 *
 * Owns the choice of the compute backend (--device cpu|gpu|auto: the GPU when one is usable),
 * of this rank's GPU (local rank i takes visible GPU i, or the i-th id of --gpus; a launcher that
 * shows each rank its own single GPU is recognised; for tests, --share-gpu lets ranks share GPUs
 * over NCCL's route for that), and of the gradient transport (--transport:
 * NCCL between GPUs when there is more than one rank, MPI otherwise; "shm": shared memory between
 * CPU ranks all on one node; "mpi" on GPUs stages through host memory; "nccl" and "shm" run even
 * for one rank). The request comes resolved and checked as far as it can be without looking at
 * the machine (run_plan.c); what the machine cannot give is refused here, before any work, naming
 * the flag and what to do. Also prints the start-up block, which says where every rank ended up. */
#ifndef MGT_PLACEMENT_H
#define MGT_PLACEMENT_H

#include "backend.h"
#include "comm.h"
#include "model.h"
#include "runtime.h"

typedef enum { MGT_DEVICE_AUTO = 0, MGT_DEVICE_CPU, MGT_DEVICE_GPU } mgt_device;
typedef enum {
    MGT_TRANSPORT_AUTO = 0,
    MGT_TRANSPORT_NCCL,
    MGT_TRANSPORT_MPI,
    MGT_TRANSPORT_SHM
} mgt_transport;

enum { MGT_MAX_GPU_IDS = 256 };

typedef struct mgt_place_opts {
    mgt_device device;
    /* --gpus: local rank i takes GPU gpu_ids[i] (ngpu_ids 0: local rank i takes GPU i); the list
     * as given, for messages. */
    int gpu_ids[MGT_MAX_GPU_IDS];
    int ngpu_ids;
    const char *gpus_given;
    int share_gpu; /* tests only: several ranks may share a GPU (--share-gpu) */
    mgt_transport transport;
    int tf32;               /* let cuDNN and cuBLAS use TF32 */
    int bf16;               /* --precision bf16: bfloat16 GEMM and convolution inputs (GPU only) */
    const char *algo_cache; /* GPU: --algo-cache FILE (NULL: none) */
    double comm_timeout;    /* seconds a collective may wait before the job ends */
    int one_thread;         /* CPU: one BLAS thread per rank, whatever its cores (--reproducible:
                             * OpenBLAS's results depend on its thread count) */
    int deterministic;      /* GPU: convolution algorithms that depend on the shape alone and are
                             * deterministic (--reproducible) */
} mgt_place_opts;

typedef struct mgt_placement {
    mgt_backend be;
    mgt_comm comm;
    char desc[160]; /* this rank's device, for the start-up block */
} mgt_placement;

/* Starts the backend and the transport; ends the job on a bad request or a failed start. */
void mgt_place_init(mgt_placement *p, mgt_runtime *rt, const mgt_place_opts *o);

/* What the start-up block says besides the placement (rank 0 prints it). */
typedef struct mgt_place_run {
    const char *what;      /* "training", "resuming" */
    const mgt_model *m;    /* name, file, parameters */
    int64_t batch;         /* the global batch */
    const char *optimizer; /* its name */
    float lr;              /* the learning rate */
    const char *data;      /* the data's description */
    const char *out;       /* the output folder */
    int64_t chunk; /* --reproducible: ranks take whole chunks of this many samples (0: off) */
    int quiet;     /* --verbose 0: the block is gathered but not printed */
} mgt_place_run;

/* Collective: gathers every rank's placement; rank 0 prints the start-up block. */
void mgt_place_report(mgt_placement *p, const mgt_runtime *rt, const mgt_place_run *run);

void mgt_place_free(mgt_placement *p);

#endif
