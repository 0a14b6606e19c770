/* placement.c: this rank's backend, GPU and transport, and the start-up block (see placement.h). */
#include "placement.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu.h"

#ifdef MGT_HAVE_CUDA
/* This rank's GPU among the ngpu visible ones: the i-th --gpus id for local rank i, else
 * visible GPU i. Ends the job when the node has more ranks than GPUs to give them. */
static int pick_gpu(const mgt_runtime *rt, const mgt_place_opts *o, int ngpu) {
    const int *ids = o->gpu_ids, nids = o->ngpu_ids;
    for (int i = 0; i < nids; i++)
        if (ids[i] >= ngpu)
            mgt_die_all("--gpus %s: device %d does not exist on %s: %d GPUs are visible "
                        "(numbered 0 to %d)",
                        o->gpus_given, ids[i], rt->host, ngpu, ngpu - 1);
    /* --share-gpu (tests only): local rank i takes GPU i modulo those it may use */
    if (o->share_gpu)
        return nids ? ids[rt->local_rank % nids] : rt->local_rank % ngpu;
    int have = nids ? nids : ngpu;
    int dev = nids ? ids[rt->local_rank] : rt->local_rank;
    /* A launcher that binds one GPU to each task (Slurm's --gpus-per-task=1) shows every rank
     * its own GPU as device 0: fine when the ranks of the node see DIFFERENT GPUs. */
    if (!nids && ngpu == 1 && rt->local_size > 1 && rt->mpi) {
        char mine[128], *all = malloc(sizeof mine * (size_t)rt->local_size);
        if (!all)
            mgt_die("out of host memory");
        mgt_gpu_describe(0, mine, sizeof mine);
        MPI_Allgather(mine, sizeof mine, MPI_CHAR, all, sizeof mine, MPI_CHAR, rt->node_comm);
        int distinct = 1;
        for (int a = 0; a < rt->local_size && distinct; a++)
            for (int b = a + 1; b < rt->local_size && distinct; b++)
                distinct = strcmp(all + (size_t)a * sizeof mine, all + (size_t)b * sizeof mine);
        free(all);
        if (distinct) {
            have = rt->local_size;
            dev = 0;
        }
    }
    if (rt->local_size > have) {
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        mgt_die("rank %d on node %s: %d ranks on this node but only %d GPUs %s "
                "(CUDA_VISIBLE_DEVICES=%s); start fewer ranks or list more GPUs (tests may share "
                "GPUs: --share-gpu)",
                rt->rank, rt->host, rt->local_size, have,
                nids ? "are listed in --gpus" : "are visible", vis ? vis : "unset");
    }
    return dev;
}

static void share_measurements(mgt_placement *p, const mgt_runtime *rt, const char *desc);

static void start_gpu(mgt_placement *p, const mgt_runtime *rt, const mgt_place_opts *o, int dev) {
    const mgt_transport tr = o->transport;
    mgt_err e;
    if (tr == MGT_TRANSPORT_SHM)
        mgt_die_all("--transport shm is for the CPU backend, and this rank found a GPU; add "
                    "--device cpu, or use --transport auto");
    if (o->bf16 && o->tf32 && rt->rank == 0)
        fprintf(stderr, "notice: --tf32 changes nothing with --precision bf16: its dense layers "
                        "and convolutions take bfloat16 inputs\n");
    const int math = (o->tf32 ? MGT_GPU_TF32 : 0) | (o->bf16 ? MGT_GPU_BF16 : 0) |
                     (o->deterministic ? MGT_GPU_DETERMINISTIC : 0);
    if (mgt_gpu_backend_init(&p->be, dev, math, &e) < 0)
        mgt_die("%s", e.msg);
    if (o->algo_cache && mgt_gpu_algo_cache(&p->be, o->algo_cache, &e) < 0)
        mgt_die_all("%s", e.msg); /* the same file on every rank */
    /* NCCL for more than one rank (a world of one has nothing to reduce), unless the transport
     * is named: then it runs even for one rank, so that its cost can be timed. */
    if (tr == MGT_TRANSPORT_MPI && rt->world > 1) {
        if (mgt_comm_init_mpi_staged(&p->comm, MPI_COMM_WORLD, &p->be, o->comm_timeout, &e) < 0)
            mgt_die("%s", e.msg);
    } else if (tr == MGT_TRANSPORT_NCCL || (tr == MGT_TRANSPORT_AUTO && rt->world > 1)) {
        if (o->share_gpu) {
            char route[256];
            mgt_nccl_share_gpu(rt->rank, rt->nodes, route, sizeof route);
            if (rt->rank == 0)
                fprintf(stderr,
                        "notice: --share-gpu (for tests): ranks share GPUs, up to %d on "
                        "one; %s\n",
                        rt->max_local_size, route);
        }
        const int rc = mgt_comm_init_nccl(&p->comm, MPI_COMM_WORLD, &p->be, o->comm_timeout, &e);
        if (rc == MGT_NCCL_FAILED_ALL)
            mgt_die_all("%s", e.msg);
        if (rc < 0)
            mgt_die("%s", e.msg);
        p->comm.always = tr == MGT_TRANSPORT_NCCL;
    } else {
        mgt_comm_init_mpi(&p->comm, MPI_COMM_WORLD, o->comm_timeout);
    }
    char desc[128];
    mgt_gpu_describe(dev, desc, sizeof desc);
    snprintf(p->desc, sizeof p->desc, "GPU %d: %s", dev, desc);
    if (rt->mpi && rt->local_size > 1 && !o->deterministic)
        share_measurements(p, rt, desc);
}

/* Ranks of this node on one GPU (--share-gpu; the PCI address in desc tells which GPU, whatever
 * each rank's CUDA_VISIBLE_DEVICES numbers it) measure cuDNN's algorithms once, on the lowest of
 * them, rather than each under the others' load (mgt_gpu_share_measurements). */
static void share_measurements(mgt_placement *p, const mgt_runtime *rt, const char *desc) {
    enum { D = 128 };
    char mine[D], *all = malloc((size_t)D * (size_t)rt->local_size);
    if (!all)
        mgt_die("out of host memory");
    snprintf(mine, sizeof mine, "%s", desc);
    MPI_Allgather(mine, D, MPI_CHAR, all, D, MPI_CHAR, rt->node_comm);
    int color = rt->local_rank, n = 0;
    for (int r = rt->local_size - 1; r >= 0; r--)
        if (!strncmp(all + (size_t)r * D, mine, D)) {
            color = r;
            n++;
        }
    free(all);
    MPI_Comm same;
    MPI_Comm_split(rt->node_comm, color, rt->rank, &same);
    if (n > 1)
        mgt_gpu_share_measurements(&p->be, same, &p->comm);
    else
        MPI_Comm_free(&same);
}
#endif

void mgt_place_init(mgt_placement *p, mgt_runtime *rt, const mgt_place_opts *o) {
    memset(p, 0, sizeof *p);
    const mgt_transport tr = o->transport;
    const int nids = o->ngpu_ids;
#ifdef MGT_HAVE_CUDA
    char why[256] = "";
    const int asked = o->device == MGT_DEVICE_GPU || nids; /* auto otherwise: the GPU if usable */
    int ngpu = o->device == MGT_DEVICE_CPU || (!asked && !mgt_gpu_may_exist())
                   ? -1
                   : mgt_gpu_count(why, sizeof why);
    /* Without NVIDIA's kernel driver the CUDA runtime says its driver is "insufficient", which
     * reads as a version problem: say what is missing instead. */
    char none[512] = "";
    if (ngpu <= 0)
        snprintf(none, sizeof none, "no usable GPU on %s: %s (%s)", rt->host,
                 access("/proc/driver/nvidia/version", F_OK) != 0 ? "no NVIDIA driver or GPU found"
                 : ngpu == 0                                      ? "no device is visible"
                                                                  : "CUDA cannot use it",
                 ngpu == 0 ? "the CUDA runtime sees 0 devices" : why);
    if (ngpu <= 0 && asked)
        mgt_die_all("%s: %s; run with --device cpu", nids ? "--gpus" : "--device gpu", none);
    if (ngpu > 0) {
        start_gpu(p, rt, o, pick_gpu(rt, o, ngpu));
        return;
    }
    /* --device auto where a GPU may be (the driver's files or library are there) but none can be
     * used: a CPU run that was not wanted, said once with the reason (a driver older than the
     * CUDA the backend was built with, a GPU library missing, no device visible). Where no sign of
     * a GPU exists the CPU is simply the device, and nothing is said. */
    if (o->device == MGT_DEVICE_AUTO && why[0]) {
        if (o->bf16)
            mgt_die_all("--precision bf16 is for GPUs, and --device auto found none: %s; fix that, "
                        "or leave --precision out to train in fp32 on the CPU",
                        none);
        if (rt->rank == 0)
            fprintf(stderr,
                    "notice: --device auto trains on the CPU: %s; --device gpu makes this an "
                    "error, --device cpu says the CPU is meant\n",
                    none);
    }
#else
    if (o->device == MGT_DEVICE_GPU || nids)
        mgt_die_all("%s: this build of mgtrain has no GPU backend (no CUDA toolkit was found "
                    "when it was built); run with --device cpu",
                    nids ? "--gpus" : "--device gpu");
#endif
    if (o->bf16)
        mgt_die_all("--precision bf16 is for GPUs: the CPU backend computes in fp32 only; leave "
                    "--precision out or run on a GPU");
    if (o->tf32 && rt->rank == 0)
        fprintf(stderr, "notice: --tf32 has no effect on the CPU backend\n");
    if (o->algo_cache && rt->rank == 0)
        fprintf(stderr, "notice: --algo-cache has no effect on the CPU backend (it keeps cuDNN's "
                        "measured convolution algorithms)\n");
    if (tr == MGT_TRANSPORT_NCCL)
        mgt_die_all("--transport nccl needs a GPU, and none is usable here; use --transport auto");
    int cores = o->one_thread ? 1 : mgt_runtime_cores(rt);
    char unfit[320];
    if (mgt_cpu_blas_unfit(unfit, sizeof unfit)) /* (mgtrain has refused before MPI started) */
        mgt_die("%s", unfit);
    if (mgt_cpu_backend_init(&p->be, cores) < 0)
        mgt_die("cannot start the CPU backend");
    /* Shared memory when it is named (it runs even for one rank, so that its cost can be timed);
     * MPI otherwise (bench/overlap compares the two). */
    if (tr == MGT_TRANSPORT_SHM) {
        mgt_err e;
        if (!rt->mpi)
            mgt_die_all("--transport shm needs MPI: start the job with mpirun or srun");
        if (mgt_comm_init_shm(&p->comm, MPI_COMM_WORLD, o->comm_timeout, &e) < 0)
            mgt_die_all("%s", e.msg); /* (the same on every rank) */
        p->comm.always = 1;
    } else {
        mgt_comm_init_mpi(&p->comm, MPI_COMM_WORLD, o->comm_timeout);
    }
    char note[128];
    mgt_cpu_blas_notice(note, sizeof note);
    snprintf(p->desc, sizeof p->desc, "cpu (%d BLAS thread%s)%s%s", cores, cores == 1 ? "" : "s",
             *note ? "; " : "", note);
}

void mgt_place_report(mgt_placement *p, const mgt_runtime *rt, const mgt_place_run *run) {
    const mgt_model *m = run->m;
    char mine[256];
    snprintf(mine, sizeof mine, "rank %d: %s, node %d, local rank %d, %s", rt->rank, rt->host,
             rt->node, rt->local_rank, p->desc);
    char *all = rt->rank == 0 ? malloc(sizeof mine * (size_t)rt->world) : NULL;
    size_t *counts = rt->rank == 0 ? malloc(sizeof(size_t) * (size_t)rt->world) : NULL;
    if (rt->rank == 0 && (!all || !counts))
        mgt_die("out of host memory for the start-up block of %d ranks", rt->world);
    for (int r = 0; rt->rank == 0 && r < rt->world; r++)
        counts[r] = sizeof mine;
    mgt_gather_host(&p->comm, mine, sizeof mine, all, counts, 0, "start-up gather");
    if (rt->rank == 0 && !run->quiet) {
        int64_t b = run->batch;
        size_t params, frozen;
        const int nfrozen = mgt_model_count_params(m, &params, &frozen);
        char fz[96] = "";
        if (nfrozen)
            snprintf(fz, sizeof fz, " (%zu more in %d frozen layer%s)", frozen, nfrozen,
                     nfrozen == 1 ? "" : "s");
        printf("mgtrain %s: %s %s (%s)\n", MGT_VERSION, run->what, m->name, m->path);
        printf("  world: %d rank%s on %d node%s, up to %d per node; backend %s, transport %s\n",
               rt->world, rt->world > 1 ? "s" : "", rt->nodes, rt->nodes > 1 ? "s" : "",
               rt->max_local_size, p->be.ops->name, p->comm.ops->name);
        for (int r = 0; r < rt->world; r++)
            printf("  %s\n", all + (size_t)r * sizeof mine);
        printf("  data: %s\n", run->data);
        if (run->chunk > 0) /* --reproducible: whole chunks per rank (data/shard.h) */
            printf("  batch: global %lld in %lld chunks of %lld (the last %lld), whole chunks per "
                   "rank; reproducible on any rank count\n",
                   (long long)b, (long long)((b + run->chunk - 1) / run->chunk),
                   (long long)run->chunk, (long long)(b - (b - 1) / run->chunk * run->chunk));
        else
            printf("  batch: global %lld, per rank %lld%s\n", (long long)b,
                   (long long)(b / rt->world), b % rt->world ? " or one more" : "");
        printf("  model: %zu trainable parameters%s; %s, learning rate %g; out: %s\n", params, fz,
               run->optimizer, run->lr, run->out);
        fflush(stdout);
    }
    free(all);
    free(counts);
}

void mgt_place_free(mgt_placement *p) {
    mgt_comm_destroy(&p->comm);
    mgt_backend_destroy(&p->be);
}
