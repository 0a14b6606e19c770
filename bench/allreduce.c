/* allreduce.c: all-reduce micro-benchmark over mgtrain's own collective layer (comm.h), the one
 * collective of every training step, measured and reported the way nccl-tests' all_reduce_perf
 * does, so the figures compare with published ones.
 *
 *   mpirun -np N mgt_allreduce_bench [--min-bytes 4K] [--max-bytes 256M] [--factor 2]
 *                                    [--warmup 5] [--iters 20] [--nccl]
 *
 * For each message size: a check pass, warm-up iterations, then timed iterations of the in-place
 * float32 sum mgt_allreduce_sum, with an MPI_Barrier before the timed loop; time = the loop's
 * time / iterations, the largest over ranks. Then, as in nccl-tests:
 *   algbw = size / time                 (size in bytes, GB/s = 1e9 bytes/s)
 *   busbw = algbw * 2(n-1)/n            (the bytes each rank's link carries in a ring all-reduce)
 *
 * The check: every rank fills its buffer with rank+1, one all-reduce, every element must equal
 * n(n+1)/2 on every rank (exact in float32). It runs before the timed iterations and again after
 * them; any wrong element on any rank ends the run with no figure for that size, so a broken
 * reduction cannot produce a bandwidth. The timed iterations work on a zeroed buffer (a fixed
 * point of the sum, so values never grow to infinity over many iterations).
 *
 * --nccl (builds with MGT_HAVE_CUDA only): device buffers on GPU <local rank>, the GPU backend of
 * gpu.h and its NCCL transport (mgt_comm_init_nccl); the timed loop ends with the backend's sync.
 * Without it: host buffers and the MPI transport (mgt_comm_init_mpi), as the CPU backend uses. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "bench_args.h"
#include "comm.h"
#include "gpu.h"
#include "runtime.h"
#include "util.h"

typedef struct opts {
    size_t min_bytes, max_bytes;
    long factor, warmup, iters;
    int nccl;
    double timeout;
} opts;

/* "4096", "4K", "16M", "1G" (binary multiples, as nccl-tests' -b/-e) -> bytes. */
static size_t parse_bytes(const char *flag, const char *v) {
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    unsigned long long mul = 1;
    if (end == v)
        mgt_die_all("%s %s: expected a size such as 4096, 4K, 16M or 1G", flag, v);
    if (*end == 'K' || *end == 'k')
        mul = 1ull << 10;
    else if (*end == 'M' || *end == 'm')
        mul = 1ull << 20;
    else if (*end == 'G' || *end == 'g')
        mul = 1ull << 30;
    else if (*end != '\0')
        mgt_die_all("%s %s: unknown suffix '%s'; use K, M or G", flag, v, end);
    if (*end && end[1] != '\0' && strcmp(end + 1, "B") && strcmp(end + 1, "iB"))
        mgt_die_all("%s %s: unknown suffix '%s'; use K, M or G", flag, v, end);
    x *= mul;
    if (x < sizeof(float) || x % sizeof(float))
        mgt_die_all("%s %s: the size must be a positive multiple of 4 bytes (float32)", flag, v);
    return (size_t)x;
}

static void usage(void) {
    printf("usage: mpirun -np N mgt_allreduce_bench [flags]\n"
           "  --min-bytes S    smallest message (default 4K; K, M, G are powers of 1024)\n"
           "  --max-bytes S    largest message (default 256M)\n"
           "  --factor F       size multiplier from one row to the next (default 2)\n"
           "  --warmup N       untimed iterations per size (default 5)\n"
           "  --iters N        timed iterations per size (default 20)\n"
           "  --nccl           device buffers and the NCCL transport (GPU builds only)\n"
           "  --comm-timeout S end the job when one all-reduce waits longer (default 300)\n");
}

static void parse(int argc, char **argv, opts *o, mgt_runtime *rt) {
    int rank = rt->rank;
    *o = (opts){.min_bytes = 4 << 10,
                .max_bytes = 256 << 20,
                .factor = 2,
                .warmup = 5,
                .iters = 20,
                .timeout = 300};
    static const struct option lo[] = {{"min-bytes", required_argument, 0, 'b'},
                                       {"max-bytes", required_argument, 0, 'e'},
                                       {"factor", required_argument, 0, 'f'},
                                       {"warmup", required_argument, 0, 'w'},
                                       {"iters", required_argument, 0, 'n'},
                                       {"nccl", no_argument, 0, 'g'},
                                       {"comm-timeout", required_argument, 0, 't'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
    int ch;
    opterr = rank == 0;
    while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (ch) {
        case 'b':
            o->min_bytes = parse_bytes("--min-bytes", optarg);
            break;
        case 'e':
            o->max_bytes = parse_bytes("--max-bytes", optarg);
            break;
        case 'f':
            o->factor = bench_need_long("--factor", optarg, 2);
            break;
        case 'w':
            o->warmup = bench_need_long("--warmup", optarg, 0);
            break;
        case 'n':
            o->iters = bench_need_long("--iters", optarg, 1);
            break;
        case 'g':
            o->nccl = 1;
            break;
        case 't':
            o->timeout = (double)bench_need_long("--comm-timeout", optarg, 0);
            break;
        case 'h':
            if (rank == 0)
                usage();
            mgt_runtime_finalize(rt);
            exit(0);
        default:
            mgt_die_all("unknown flag; see mgt_allreduce_bench --help");
        }
    }
    if (optind < argc)
        mgt_die_all("unexpected argument '%s'; see mgt_allreduce_bench --help", argv[optind]);
    if (o->min_bytes > o->max_bytes)
        mgt_die_all("--min-bytes is larger than --max-bytes");
}

/* Picks the backend and transport: the CPU backend with MPI, or a GPU with NCCL. */
static void init_transport(const opts *o, mgt_runtime *rt, mgt_backend *be, mgt_comm *comm,
                           char *desc, size_t n) {
    if (o->nccl) {
#ifdef MGT_HAVE_CUDA
        char why[256] = "";
        int ngpu = mgt_gpu_count(why, sizeof why);
        if (ngpu <= 0)
            mgt_die_all("--nccl: no usable GPU on %s (%s)", rt->host,
                        ngpu == 0 ? "no device is visible" : why);
        if (rt->local_size > ngpu)
            mgt_die_all("--nccl: %d ranks on %s but %d GPUs are visible; start at most %d ranks "
                        "per node",
                        rt->local_size, rt->host, ngpu, ngpu);
        mgt_err e;
        if (mgt_gpu_backend_init(be, rt->local_rank, 0, &e) < 0)
            mgt_die("%s", e.msg);
        if (mgt_comm_init_nccl(comm, MPI_COMM_WORLD, be, o->timeout, &e) < 0)
            mgt_die("%s", e.msg);
        char gpu[128];
        mgt_gpu_describe(rt->local_rank, gpu, sizeof gpu);
        snprintf(desc, n, "device buffers, rank 0 on %s", gpu);
        return;
#else
        (void)rt;
        mgt_die_all("--nccl: this build has no GPU backend (no CUDA toolkit was found when it was "
                    "built); run without --nccl for the MPI transport");
#endif
    }
    if (mgt_cpu_backend_init(be, 1) < 0)
        mgt_die("cannot start the CPU backend");
    mgt_comm_init_mpi(comm, MPI_COMM_WORLD, o->timeout);
    snprintf(desc, n, "host buffers");
}

/* Fills every rank's buffer with rank+1, reduces once, and counts the elements (over all ranks)
 * that differ from n(n+1)/2. */
static long check_pass(mgt_backend *be, mgt_comm *comm, float *dev, float *host, size_t count) {
    const mgt_ops *ops = be->ops;
    float want = (float)comm->world * (float)(comm->world + 1) / 2.0f;
    for (size_t i = 0; i < count; i++)
        host[i] = (float)(comm->rank + 1);
    ops->to_device(be, dev, host, count * sizeof(float));
    mgt_allreduce_sum(comm, dev, count, "all-reduce benchmark (check)");
    ops->to_host(be, host, dev, count * sizeof(float));
    double bad = 0;
    for (size_t i = 0; i < count; i++)
        bad += host[i] != want;
    mgt_allreduce_host_f64(comm, &bad, 1, "all-reduce benchmark (check count)");
    return (long)bad;
}

/* The largest value over ranks (a world of one may run without MPI at all). */
static double max_over_ranks(mgt_comm *comm, double x) {
    double m = x;
    if (comm->world > 1)
        MPI_Allreduce(&x, &m, 1, MPI_DOUBLE, MPI_MAX, comm->mpi);
    return m;
}

int main(int argc, char **argv) {
    mgt_runtime rt;
    mgt_runtime_init(&rt, &argc, &argv);
    opts o;
    parse(argc, argv, &o, &rt);
    mgt_backend be;
    mgt_comm comm;
    char desc[200];
    if (rt.world < 2)
        mgt_die_all("a world of one has nothing to reduce (mgt_allreduce_sum returns at once): "
                    "start 2 or more ranks, e.g. mpirun -np 2 mgt_allreduce_bench");
    init_transport(&o, &rt, &be, &comm, desc, sizeof desc);
    const mgt_ops *ops = be.ops;
    float *dev = ops->alloc(&be, o.max_bytes);
    float *host = malloc(o.max_bytes);
    if (!dev || !host)
        mgt_die("out of memory for two buffers of %zu bytes", o.max_bytes);
    int n = comm.world;
    double bus = 2.0 * (n - 1) / n;
    if (rt.rank == 0) {
        printf("# mgt_allreduce_bench: in-place all-reduce, sum of float32, through mgtrain's "
               "mgt_allreduce_sum\n"
               "# transport %s (%s), %d rank%s on %d node%s\n"
               "# time: per all-reduce, mean of %ld timed iterations after %ld warm-up ones, "
               "MPI_Barrier before, largest over ranks\n"
               "# algbw = size / time; busbw = algbw * 2(n-1)/n = algbw * %.4f "
               "(nccl-tests' all_reduce_perf definitions; GB/s = 1e9 B/s)\n"
               "# check: rank r sends r+1, every element must be n(n+1)/2 = %g, before and after "
               "the timed iterations\n",
               comm.ops->name, desc, n, n > 1 ? "s" : "", rt.nodes, rt.nodes > 1 ? "s" : "",
               o.iters, o.warmup, bus, (double)n * (n + 1) / 2.0);
        printf("%12s %12s %6s %12s %12s %12s %7s\n", "size(B)", "count", "type", "time(us)",
               "algbw(GB/s)", "busbw(GB/s)", "#wrong");
        fflush(stdout);
    }
    for (size_t bytes = o.min_bytes; bytes <= o.max_bytes;) {
        size_t count = bytes / sizeof(float);
        long wrong = check_pass(&be, &comm, dev, host, count);
        ops->zero(&be, dev, bytes);
        for (long i = 0; i < o.warmup; i++)
            mgt_allreduce_sum(&comm, dev, count, "all-reduce benchmark (warm-up)");
        ops->sync(&be);
        if (comm.world > 1)
            MPI_Barrier(comm.mpi);
        double t0 = mgt_now();
        for (long i = 0; i < o.iters; i++)
            mgt_allreduce_sum(&comm, dev, count, "all-reduce benchmark");
        ops->sync(&be);
        double t = max_over_ranks(&comm, (mgt_now() - t0) / (double)o.iters);
        wrong += check_pass(&be, &comm, dev, host, count);
        if (wrong) {
            if (rt.rank == 0)
                printf("%12zu %12zu %6s %12s %12s %12s %7ld\n", bytes, count, "float", "-", "-",
                       "-", wrong);
            mgt_die_all("the all-reduce of %zu bytes gave %ld wrong elements over %d ranks "
                        "(expected every element = %g): no figure reported",
                        bytes, wrong, n, (double)n * (n + 1) / 2.0);
        }
        double algbw = (double)bytes / t / 1e9;
        if (rt.rank == 0) {
            printf("%12zu %12zu %6s %12.2f %12.3f %12.3f %7ld\n", bytes, count, "float", t * 1e6,
                   algbw, algbw * bus, wrong);
            fflush(stdout);
        }
        if (bytes > o.max_bytes / (size_t)o.factor)
            break;
        bytes *= (size_t)o.factor;
    }
    ops->free(&be, dev);
    free(host);
    mgt_comm_destroy(&comm);
    mgt_backend_destroy(&be);
    mgt_runtime_finalize(&rt);
    return 0;
}
