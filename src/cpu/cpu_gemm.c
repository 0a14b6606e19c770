/* cpu_gemm.c: the CPU backend's GEMMs, split across its lanes (cpu_lanes.c), with what a dense
 * layer writes around each lane's part of the product (bias, ReLU, a ReLU's gradient mask).
 *
 * OpenBLAS runs single-threaded in this backend (mgt_cpu_backend_init): its own threads
 * busy-wait for work, so that after every threaded call they spun on the cores the lanes were
 * using, and under load a threaded call waited for a descheduled helper (the seed ConvNet's
 * 15488 -> 128 dense layer at batch 128 took 440 ms with two OpenBLAS threads on a busy 2-core
 * EPYC, 26-48 ms with one). The larger GEMMs are split here instead: the larger of C's two
 * dimensions is cut into at most GEMM_PARTS parts, as many as parts of GEMM_PART_MIN rows or
 * columns would take, the units of 16 shared out evenly (mgt_cpu_lanes_parts: the MLP's 784
 * columns in 192, 192, 192 and 208, where 208, 208, 208 and 160 left a lane of two waiting for
 * the other),
 * fixed by the shape alone, which the lanes take as they come. Each part is one cblas_sgemm on
 * the same rows of op(A) or columns of op(B), so every element of C is computed by the same
 * call whatever the number of threads (OpenBLAS's result for an element can depend on where in
 * the call it lies: a change of the cuts changes bits). Each part copies the operand it
 * shares in whole (OpenBLAS packs it), which is why the parts are few and large: the packing
 * costs about as much as a part's multiply-adds over some twenty rows of it, so parts of 64 rows
 * lost a third of their time to it, parts of 128 a sixth. Measured with two lanes on a 2-core
 * Xeon (SkylakeX kernel), the MLP's GEMMs at batch 256 took 487 / 162 / 136 us (784 -> 256
 * forward, 256 -> 256 forward, 256 -> 256 input gradient) in 4 parts of 64 rows, 416 / 138 / 125
 * in 2 of 128. Where C is square the columns are cut: a 256 x 256 x 784 product with B
 * transposed (a dense layer's forward at batch 256) ran 7% faster in two 256 x 128 parts than in
 * two 128 x 256 ones on the same Xeon (bench/layer_times, relative to the unchanged backward in
 * each of 4 interleaved runs), and 256 x 256 x 256 3%. */
#include <cblas.h>
#include <string.h>

#include "cpu_internal.h"

enum { GEMM_PARTS = 4, GEMM_PART_MIN = 128 };
#define GEMM_SPLIT_MACS ((double)(1 << 22)) /* below: one call (a split saves < ~20 us) */

typedef struct {
    mgt_cpu_gemm_args a;
    int by_rows;
    mgt_cpu_gemm_epi epi; /* what each part writes around its product */
} gemm_job;

/* One cblas_sgemm on the m x n block of C at row r0, column c0, with its part of the epilogue
 * around it (mgt_cpu_gemm_epi). For beta = 0 the block is cleared here and the product added onto it (beta = 1):
 * OpenBLAS clears C in a pass of its own (sgemm_beta) that ran at a tenth of memset's speed with
 * its Zen kernel, 4% of the MLP's step on a 2-core EPYC (perf). The same bits: its product is
 * added onto the zeros it writes too. */
static void gemm_block(const gemm_job *g, int r0, int c0, int m, int n) {
    const mgt_cpu_gemm_args *a = &g->a;
    const float *A = a->A + (a->ta == CblasNoTrans ? (size_t)r0 * a->lda : (size_t)r0);
    const float *B = a->B + (a->tb == CblasNoTrans ? (size_t)c0 : (size_t)c0 * a->ldb);
    float *C = a->C + (size_t)r0 * a->ldc + c0;
    const mgt_cpu_gemm_epi *e = &g->epi;
    float beta = a->beta;
    if (e->bias) {
        for (int i = 0; i < m; i++)
            memcpy(C + (size_t)i * a->ldc, e->bias + c0, sizeof(float) * (size_t)n);
        beta = 1.0f;
    } else if (beta == 0.0f) {
        if (a->ldc == n)
            memset(C, 0, sizeof(float) * (size_t)m * (size_t)n);
        else
            for (int i = 0; i < m; i++)
                memset(C + (size_t)i * a->ldc, 0, sizeof(float) * (size_t)n);
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, a->ta, a->tb, m, n, a->K, a->alpha, A, a->lda, B, a->ldb, beta, C,
                a->ldc);
    if (e->relu)
        mgt_cpu_relu_rows(m, n, a->ldc, C);
    if (e->mask)
        mgt_cpu_keep_pos_rows(m, n, a->ldc, C, e->mask + (size_t)r0 * a->ldc + c0);
}

static void gemm_part(void *p, size_t lo, size_t hi) {
    const gemm_job *g = p;
    const int k = (int)lo, n = (int)(hi - lo);
    if (g->by_rows) /* rows [lo, hi) of C: the same rows of op(A) */
        gemm_block(g, k, 0, n, g->a.N);
    else /* columns [lo, hi) of C: the same columns of op(B) */
        gemm_block(g, 0, k, g->a.M, n);
}

/* The split of a product: its job, the dimension cut (*dim) and the part size (*part). */
static gemm_job gemm_split(const mgt_cpu_gemm_args *a, size_t *dim, size_t *part) {
    const gemm_job g = {.a = *a, .by_rows = a->M > a->N};
    *dim = (size_t)(g.by_rows ? a->M : a->N);
    size_t p = (*dim + GEMM_PARTS - 1) / GEMM_PARTS;
    p = mgt_cpu_pad_up(p, MGT_CPU_SPLIT_ALIGN);
    if (p < GEMM_PART_MIN)
        p = GEMM_PART_MIN;
    if ((double)a->M * a->N * (a->K > 0 ? a->K : 0) < GEMM_SPLIT_MACS)
        p = *dim;
    *part = p;
    return g;
}

static void gemm_run(mgt_cpu_lanes *l, gemm_job *g, size_t dim, size_t part) {
    if (g->a.M <= 0 || g->a.N <= 0)
        return;
    mgt_cpu_lanes_parts(l, dim, (dim + part - 1) / part, gemm_part, g);
}

void mgt_cpu_gemm_with(mgt_cpu_lanes *l, const mgt_cpu_gemm_args *a, const mgt_cpu_gemm_epi *e) {
    size_t dim, part;
    gemm_job g = gemm_split(a, &dim, &part);
    if (e)
        g.epi = *e;
    gemm_run(l, &g, dim, part);
}

void mgt_cpu_gemm(mgt_cpu_lanes *l, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K,
                  float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                  float *C, int ldc) {
    const mgt_cpu_gemm_args a = {ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc};
    mgt_cpu_gemm_with(l, &a, NULL);
}

/* ---- two independent products at once ----------------------------------------------------- *
 * A backward's weight and input gradients are two products of the same size that need each
 * other's nothing. Split as above, each is cut in two and each half packs the operand the halves
 * share. Whole, one per lane, each packs its operands once: the backward of the MLP's 256 -> 256
 * layer at batch 256 (two 256x256x256 products) went from 0.36-0.39 to 0.28-0.30 ms on a 2-core
 * Xeon (bench/layer_times, interleaved runs). So where both would be cut in at most two parts
 * (no more than two lanes busy with either), the pair runs whole. */
typedef struct {
    gemm_job g[2];
} pair_job;

static void pair_lane(void *p, int lane) {
    const gemm_job *g = &((const pair_job *)p)->g[lane];
    gemm_part((void *)g, 0, (size_t)(g->by_rows ? g->a.M : g->a.N));
}

void mgt_cpu_gemm_pair(mgt_cpu_lanes *l, const mgt_cpu_gemm_args *a, const mgt_cpu_gemm_args *b,
                       const mgt_cpu_gemm_epi *b_epi) {
    size_t da, pa, db, pb;
    pair_job j = {{gemm_split(a, &da, &pa), gemm_split(b, &db, &pb)}};
    if (b_epi)
        j.g[1].epi = *b_epi;
    const int whole = a->M > 0 && a->N > 0 && b->M > 0 && b->N > 0 &&
                      (da + pa - 1) / pa <= 2 && (db + pb - 1) / pb <= 2;
    if (!whole) {
        gemm_run(l, &j.g[0], da, pa);
        gemm_run(l, &j.g[1], db, pb);
        return;
    }
    mgt_cpu_lanes_run(l, 2, pair_lane, &j);
}
