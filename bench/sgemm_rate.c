/* sgemm_rate.c: the machine's float32 GEMM rate through OpenBLAS, the ceiling that bench/peer
 * measures mgtrain and PyTorch against.
 *
 *   mpirun -np W sgemm_rate [--threads T] [--size N] [--reps R]
 *
 * Every rank runs cblas_sgemm on N x N x N matrices with T OpenBLAS threads (default: the cores
 * this rank may use, shared with the other ranks on the node, as mgtrain does), all ranks at the
 * same time, so W ranks of T threads measure the ceiling of a W-rank training run on the same
 * cores. Rate = W * R * 2 N^3 / (the slowest rank's time for its R calls), after one untimed
 * call. A plain ./sgemm_rate is a world of one (no MPI). Rank 0 prints one JSON line.
 *
 * OpenBLAS's kernel is the one mgtrain runs: where OpenBLAS falls back to an old one on a CPU it
 * does not know, this program too executes itself again with OPENBLAS_CORETYPE set
 * (src/cpu/cpu_blas.c), and "kernel" in its line says which runs and why.
 *
 * The result is checked (A = 1, B = 1/N => every element of C is 1) so a broken BLAS or a wrong
 * thread setting cannot produce a figure. */
#include <cblas.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend.h"
#include "bench_args.h"
#include "runtime.h"
#include "util.h"

int main(int argc, char **argv) {
    mgt_cpu_blas_choose(argv);
    mgt_runtime rt;
    mgt_runtime_init(&rt, &argc, &argv);
    long n = 2048, reps = 10, threads = 0;
    static const struct option opts[] = {{"size", required_argument, 0, 'n'},
                                         {"reps", required_argument, 0, 'r'},
                                         {"threads", required_argument, 0, 't'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (ch) {
        case 'n':
            n = bench_need_long("--size", optarg, 16);
            break;
        case 'r':
            reps = bench_need_long("--reps", optarg, 1);
            break;
        case 't':
            threads = bench_need_long("--threads", optarg, 1);
            break;
        case 'h':
            if (rt.rank == 0)
                printf("usage: mpirun -np W sgemm_rate [--size N (2048)] [--reps R (10)] "
                       "[--threads T (this rank's share of the cores)]\n");
            mgt_runtime_finalize(&rt);
            return 0;
        default:
            mgt_die_all("unknown flag; see sgemm_rate --help");
        }
    }
    if (threads == 0)
        threads = mgt_runtime_cores(&rt);
    openblas_set_num_threads((int)threads);

    size_t nn = (size_t)n * (size_t)n;
    float *a = malloc(nn * sizeof(float)), *b = malloc(nn * sizeof(float)),
          *c = malloc(nn * sizeof(float));
    if (!a || !b || !c)
        mgt_die("out of host memory for three %ld x %ld matrices", n, n);
    /* 1/N is a power of two only for power-of-two N; the check's tolerance covers the others. */
    for (size_t i = 0; i < nn; i++) {
        a[i] = 1.0f;
        b[i] = 1.0f / (float)n;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)n, (int)n, 1.0f, a, (int)n,
                b, (int)n, 0.0f, c, (int)n); /* untimed: threads start, pages fault in */
    if (rt.mpi) /* a world of one started without mpirun runs without MPI */
        MPI_Barrier(MPI_COMM_WORLD);
    double t0 = mgt_now();
    for (long r = 0; r < reps; r++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)n, (int)n, (int)n, 1.0f, a,
                    (int)n, b, (int)n, 0.0f, c, (int)n);
    double mine = mgt_now() - t0, slowest = mine;
    long bad = 0, all_bad = 0;
    for (size_t i = 0; i < nn; i++)
        bad += fabsf(c[i] - 1.0f) > 1e-3f;
    all_bad = bad;
    if (rt.mpi) {
        MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(&bad, &all_bad, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    }
    if (all_bad)
        mgt_die_all("cblas_sgemm gave %ld wrong elements of %zu (expected all 1): no rate "
                    "reported; check the OpenBLAS installation",
                    all_bad, nn * (size_t)rt.world);
    double flop = 2.0 * (double)n * (double)n * (double)n * (double)reps;
    if (rt.rank == 0) {
        char kernel[160];
        mgt_cpu_blas_notice(kernel, sizeof kernel);
        /* openblas_get_config(): "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY SkylakeX MAX_THREADS=64"
         */
        printf("{\"bench\": \"sgemm_rate\", \"size\": %ld, \"reps\": %ld, \"ranks\": %d, "
               "\"threads_per_rank\": %ld, \"seconds\": %.6f, \"gflops_per_rank\": %.2f, "
               "\"gflops\": %.2f, \"openblas\": \"%s\", \"core\": \"%s\", \"kernel\": \"%s\"}\n",
               n, reps, rt.world, threads, slowest, flop / slowest / 1e9,
               (double)rt.world * flop / slowest / 1e9, openblas_get_config(),
               openblas_get_corename(), kernel);
        fflush(stdout);
    }
    free(a);
    free(b);
    free(c);
    mgt_runtime_finalize(&rt);
    return 0;
}
