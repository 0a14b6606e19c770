/* test_gpu_nccl.c: the NCCL transport on one rank (MPI world of 1; NCCL allows one rank per GPU,
 * and a test machine has one GPU): start-up over MPI with a non-blocking communicator, in-place
 * all-reduces of known buffers through the transport's own op (mgt_allreduce_sum skips the call
 * in a world of one), an empty all-reduce, and an orderly destroy.
 * Needs a GPU: without one it prints SKIPPED and exits 77. */
#include <mpi.h>

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
    int rc = mgt_comm_init_nccl(&c, MPI_COMM_WORLD, &be, 30.0, &e);
    CHECK(rc == 0, "mgt_comm_init_nccl failed: %s", rc ? e.msg : "");
    if (rc == 0) {
        CHECK(!strcmp(c.ops->name, "nccl"), "transport named %s", c.ops->name);
        CHECK(c.world == 1 && c.rank == 0, "world %d, rank %d", c.world, c.rank);
        const size_t sizes[] = {1, 1000, 3u << 20}; /* up to 12 MiB: NCCL's larger protocols */
        for (size_t t = 0; t < sizeof sizes / sizeof sizes[0]; t++) {
            size_t n = sizes[t];
            float *h = hf(n);
            for (size_t i = 0; i < n; i++)
                h[i] = (float)(i % 1000) * 0.5f - 100.0f;
            float *d = dput(&be, h, n);
            c.ops->allreduce_sum_f32(&c, d, n); /* the sum over one rank is the buffer itself */
            char what[64];
            snprintf(what, sizeof what, "NCCL all-reduce of %zu floats on one rank", n);
            expect_same(what, &be, d, h, n * sizeof(float));
            mgt_allreduce_sum(&c, d, n, "test all-reduce"); /* world 1: a no-op */
            expect_same("mgt_allreduce_sum in a world of one", &be, d, h, n * sizeof(float));
            dfree_all();
            hfree_all();
        }
        float *d = dbuf(&be, 16);
        c.ops->allreduce_sum_f32(&c, d, 0);
        CHECK(1, "empty all-reduce returned");
        dfree_all();
        mgt_comm_destroy(&c);
    }
    mgt_backend_destroy(&be);
    MPI_Finalize();
    return finish("test_gpu_nccl");
}
