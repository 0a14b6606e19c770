/* test_gpu_nccl.c: the NCCL transport: start-up over MPI with a non-blocking communicator,
 * in-place all-reduces of known buffers through the transport's own op (rank r contributes
 * (r + 1) times the buffer, so the sum is world(world+1)/2 times it), an empty all-reduce, and an
 * orderly destroy. Run alone it is one rank on GPU 0; under mpirun every rank uses GPU 0 too,
 * which NCCL's user guide calls unsupported: NCCL 2.28 accepts it when each rank names a
 * different host through the undocumented NCCL_HOSTID (the ranks then count as separate nodes
 * and talk over sockets); NCCL 2.30 adds the documented, experimental
 * NCCL_MULTI_RANK_GPU_ENABLE=1.
 * With --free-behind-a-stopped-peer (2 ranks): rank 1 stops (it never joins the collective),
 * rank 0 starts an all-reduce request and then frees a tensor. cudaFree waits for the whole
 * device, the stuck collective's stream too, forever; the backend must first drain every stream
 * by polled waits, which watch --comm-timeout (3 s here), so that the job ends with NCCL's
 * timeout message instead of hanging: this program then never returns normally.
 * Needs a GPU: without one it prints SKIPPED and exits 77. */
#include <mpi.h>
#include <unistd.h>

#include "comm.h"
#include "gpu_test.h"

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    char why[256] = "";
    if (mgt_gpu_count(why, sizeof why) <= 0) {
        printf("SKIPPED: no usable GPU (%s)\n", why[0] ? why : "no CUDA device is visible");
        MPI_Finalize();
        return 77;
    }
    mgt_backend be = {0};
    mgt_err e;
    if (mgt_gpu_backend_init(&be, 0, 0, &e) < 0) {
        fprintf(stderr, "GPU backend: %s\n", e.msg);
        MPI_Finalize();
        return 2;
    }
    mgt_comm c;
    const int stopped = argc > 1 && !strcmp(argv[1], "--free-behind-a-stopped-peer");
    int rc = mgt_comm_init_nccl(&c, MPI_COMM_WORLD, &be, stopped ? 3.0 : 30.0, &e);
    CHECK(rc == 0, "mgt_comm_init_nccl failed: %s", rc ? e.msg : "");
    if (rc == 0 && stopped) {
        int rank = 0;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        if (rank == 1)
            sleep(60); /* stopped: the job ends from rank 0 before this */
        float *d = dmem(&be, 1000 * sizeof(float)), *x = dmem(&be, 16);
        CHECK(c.ops->reserve(&c, 1, &e) == 0, "a request slot");
        c.ops->start(&c, 0, MGT_COLL_ALLREDUCE, d, 0, 1000);
        be.ops->free(&be, x); /* must end the job within the 3 s */
        CHECK(0, "a free behind a collective whose peer stopped returned");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (rc == 0) {
        CHECK(!strcmp(c.ops->name, "nccl"), "transport named %s", c.ops->name);
        int world = 0, rank = 0;
        MPI_Comm_size(MPI_COMM_WORLD, &world);
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        CHECK(c.world == world && c.rank == rank, "world %d, rank %d", c.world, c.rank);
        const float times = 0.5f * (float)world * (float)(world + 1);
        const size_t sizes[] = {1, 1000, 3u << 20}; /* up to 12 MiB: NCCL's larger protocols */
        for (size_t t = 0; t < sizeof sizes / sizeof sizes[0]; t++) {
            size_t n = sizes[t];
            float *h = hf(n), *want = hf(n);
            for (size_t i = 0; i < n; i++) { /* small integers: every sum is exact */
                h[i] = ((float)(i % 1000) - 500.0f) * (float)(rank + 1);
                want[i] = ((float)(i % 1000) - 500.0f) * times;
            }
            float *d = dput(&be, h, n);
            c.ops->allreduce_sum_f32(&c, d, n);
            char what[64];
            snprintf(what, sizeof what, "NCCL all-reduce of %zu floats on %d rank(s)", n, world);
            expect_same(what, &be, d, want, n * sizeof(float));
            dfree_all();
            hfree_all();
        }
        float *d = dmem(&be, 16);
        c.ops->allreduce_sum_f32(&c, d, 0);
        CHECK(1, "empty all-reduce returned");
        dfree_all();
    }
    mgt_comm_destroy(&c); /* also after a failed init: it releases what the init set up */
    mgt_backend_destroy(&be);
    MPI_Finalize();
    return finish("test_gpu_nccl");
}
