/* test_gpu_fallback.c: what must hold in a build with the GPU backend on ANY machine, with or
 * without a GPU (so this test runs, and passes, on the CPU-only CI machines too):
 *   - mgt_gpu_count answers without crashing: -1 or 0 with a reason when no GPU can be used
 *     (then mgt_gpu_backend_init fails cleanly with a message, leaving the backend empty), or
 *     the device count, each device described by name, PCI bus id and memory;
 *   - the device RNG, compiled for the host from the very source the dropout kernel uses, is
 *     util.h's RNG bit for bit (the GPU's dropout masks are the CPU's);
 *   - the convolution scratch size is a pure function of the shape (no GPU needed): 0 for an
 *     empty batch, at least the 16 MiB allowance otherwise, never less for a larger batch. */
#include "gpu_internal.h"
#include "gpu_test.h"
#include "model.h"

static void test_count(void) {
    char why[256] = "";
    int n = mgt_gpu_count(why, sizeof why);
    printf("mgt_gpu_count: %d%s%s%s\n", n, n <= 0 ? " (" : "", n <= 0 ? why : "",
           n <= 0 ? ")" : "");
    if (n <= 0) {
        CHECK(why[0] != 0, "no GPU but no reason given");
        mgt_backend be = {0};
        mgt_err e = {{0}};
        int rc = mgt_gpu_backend_init(&be, 0, 0, &e);
        CHECK(rc == -1, "mgt_gpu_backend_init returned %d without a GPU", rc);
        CHECK(strstr(e.msg, "no usable GPU") != NULL, "init's message: \"%s\"", e.msg);
        CHECK(be.ops == NULL && be.impl == NULL, "a failed init left a backend behind");
        printf("mgt_gpu_backend_init: %s\n", e.msg);
    } else {
        for (int d = 0; d < n; d++) {
            char desc[160] = "";
            mgt_gpu_describe(d, desc, sizeof desc);
            printf("GPU %d: %s\n", d, desc);
            CHECK(strstr(desc, "PCI") != NULL && strstr(desc, "GiB") != NULL,
                  "describe(%d) = \"%s\"", d, desc);
        }
    }
}

static void test_rng_twin(void) {
    long bad = 0;
    for (uint64_t k = 0; k < 64; k++) {
        const uint64_t key = k < 32 ? mgt_key3(k, 0x44524f50ULL, k * 7) : mgt_rand64(k, ~k);
        for (uint64_t i = 0; i < 20000; i++) {
            const uint64_t ctr = i < 10000 ? i : mgt_rand64(key, i); /* small and huge counters */
            if (mgt_gpu_rand64_twin(key, ctr) != mgt_rand64(key, ctr))
                bad++;
            const float a = mgt_gpu_uniform_twin(key, ctr), b = mgt_uniform(key, ctr);
            if (memcmp(&a, &b, sizeof a) != 0)
                bad++;
        }
    }
    CHECK(bad == 0, "the device RNG differs from util.h's in %ld of 2560000 draws", bad);
}

static void test_scratch(void) {
    /* 28x28x16 -> 32, 3x3 "same": stride 1 pads 1 all round */
    mgt_conv_shape s = mgt_conv2d_geometry(0, 28, 28, 16, 32, 3, 3, 1, 1);
    CHECK(mgt_gpu_conv2d_scratch(&s) == 0, "scratch for n = 0 is %zu", mgt_gpu_conv2d_scratch(&s));
    s.n = 8;
    size_t a = mgt_gpu_conv2d_scratch(&s);
    s.n = 512;
    size_t b = mgt_gpu_conv2d_scratch(&s);
    CHECK(a >= ((size_t)16 << 20) && b >= a, "scratch %zu for n = 8, %zu for n = 512", a, b);
    /* asymmetric "same" (stride 2 on an even size, 14x14 out): no padding at the top/left, one
     * row/column at the bottom/right; the padded input is part of it */
    mgt_conv_shape t = mgt_conv2d_geometry(512, 28, 28, 16, 32, 3, 3, 2, 1);
    size_t pad = (size_t)512 * 29 * 29 * 16 * 4;
    CHECK(mgt_gpu_conv2d_scratch(&t) >= pad, "scratch %zu misses the padded input (%zu)",
          mgt_gpu_conv2d_scratch(&t), pad);
}

int main(void) {
    test_count();
    test_rng_twin();
    test_scratch();
    return finish("test_gpu_fallback");
}
