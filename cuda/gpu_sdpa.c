/* gpu_sdpa.c: attention through cuDNN's fused flash attention, built on cuDNN's graph (backend)
 * API, for the bfloat16 activations of --precision bf16; gpu_attn.cu's own kernels do the rest.
 *
 * The graphs. cuDNN has no one-call attention: its fused engines recognise the operation graph
 * that a scaled dot-product attention is made of (the graph NVIDIA's cudnn-frontend builds for its
 * SDPA node on cuDNN 9 before 9.21, the one the engines are tuned for), and run it as one kernel
 * that keeps no t x t matrix. Here, for one (sequence, head) as four-dimensional tensors
 * [n][heads][t][d], d = c / heads, described by strides straight on mgtrain's rows (no copies):
 * Q, K and V are the three c-wide parts of each qkv row ([n][t][3c]: strides 3tc, d, 3c, 1, at
 * offsets 0, c and 2c), O and dO are y and dy ([n][t][c]), dQ, dK and dV the parts of dqkv.
 *
 *   forward:  S = Q K^T (K^T: K's strides swapped), S *= scale (1/sqrt(d), a by-value scalar);
 *             causal: S = row >= col ? S : -inf (GEN_INDEX of the rows and the columns, CMP_GE,
 *             BINARY_SELECT); m = max_j S, E = exp(S - m), l = sum_j E, Stats = m + log l (the
 *             layer's lse, in the same units: backend.h), P = E / l rounded to bfloat16,
 *             O = P V.
 *   backward: D = sum_e dO O (a float [n][heads][t] in the scratch, as the frontend keeps it),
 *             S as in the forward, P = exp(S - Stats) (masked the same way), dV = P^T dO,
 *             dP = dO V^T, dS = P (dP - D) scale, dK = dS^T Q, dQ = dS K accumulated in float
 *             in the scratch, then rounded into dqkv (IDENTITY).
 * The matrix products take bfloat16 operands and accumulate in float, the softmax's statistics
 * are float: the same arithmetic as the own kernels up to the order of the sums and the rounding
 * of P to bfloat16 before P V (which the frontend's graph asks for, as FlashAttention does).
 *
 * Where it runs. Only where the own kernels' results would be no better: bfloat16 activations
 * (cuDNN's fused engines take fp16 and bf16 only), no dropout (cuDNN draws its own masks, which
 * would not be mgtrain's: the same samples would drop different weights on another rank count),
 * not under --reproducible (the fused backward adds dQ with atomics), heads of a multiple of 8
 * channels up to 128, and 16-byte aligned rows. A shape cuDNN refuses (no engine for the graph,
 * none whose plan builds) is remembered and runs the own kernels. MGT_GPU_ATTENTION in the
 * environment chooses: "auto" (the default: as above), "own" (never cuDNN) or "cudnn" (a shape
 * the fused path cannot take ends the job with the reason: for checking that it runs).
 *
 * Plans are cached per (direction, n, t, c, heads, causal), with every descriptor they were made
 * of, and built where the layer reserves its scratch (mgt_gpu_attn_scratch) for the largest batch,
 * so that the step loop only executes them; another batch size (a last partial batch) builds its
 * own at its first call. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cudnn.h>

#include "gpu_internal.h"
#include "gpu_sdpa.h"
#include "runtime.h"

/* The most descriptors a plan takes: 73 for the causal backward, and up to 17 more for each of
 * the two heuristics modes (the heuristics, 8 configurations, their plans). */
enum { MAX_DESC = 160 };

/* The tensors a plan's variant pack names, by unique id (1.. in the order below). */
enum {
    U_Q = 1,
    U_K,
    U_V,
    U_O,
    U_STATS,
    U_SCALE,
    U_NEGINF,
    U_ONE,
    U_DO,
    U_DQ,
    U_DK,
    U_DV,
    U_DSUM,
    U_DQACC,
    U_VIRTUAL /* the first id of the graph's virtual tensors */
};

typedef struct sdpa_plan {
    int bwd, n, t, c, heads, causal;
    cudnnBackendDescriptor_t plan; /* NULL: cuDNN refused the shape; the own kernels run it */
    int64_t ws;                    /* the plan's workspace, bytes */
    cudnnBackendDescriptor_t desc[MAX_DESC]; /* everything the plan was made of */
    int ndesc;
} sdpa_plan;

struct mgt_gpu_sdpa_cache {
    sdpa_plan **p;
    int np, cap;
    int mode; /* 0 auto, 1 own, 2 cudnn */
};

/* ---- building a graph ---------------------------------------------------------------------- */

typedef struct builder {
    sdpa_plan *pl;
    int64_t next_uid;
    cudnnStatus_t st; /* the first failure */
    const char *what; /* and which call it was */
} builder;

static int failed(builder *b, cudnnStatus_t st, const char *what) {
    if (st != CUDNN_STATUS_SUCCESS && b->st == CUDNN_STATUS_SUCCESS) {
        b->st = st;
        b->what = what;
    }
    return b->st != CUDNN_STATUS_SUCCESS;
}

static cudnnBackendDescriptor_t make(builder *b, cudnnBackendDescriptorType_t type) {
    if (b->st != CUDNN_STATUS_SUCCESS)
        return NULL;
    if (b->pl->ndesc >= MAX_DESC) {
        failed(b, CUDNN_STATUS_INTERNAL_ERROR, "too many descriptors");
        return NULL;
    }
    cudnnBackendDescriptor_t d = NULL;
    if (failed(b, cudnnBackendCreateDescriptor(type, &d), "cudnnBackendCreateDescriptor"))
        return NULL;
    b->pl->desc[b->pl->ndesc++] = d;
    return d;
}

static void set(builder *b, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                cudnnBackendAttributeType_t type, int64_t count, const void *v) {
    if (b->st == CUDNN_STATUS_SUCCESS)
        failed(b, cudnnBackendSetAttribute(d, name, type, count, v), "cudnnBackendSetAttribute");
}

/* op's attribute `name`: the descriptor d (NULL: not set). */
static void link(builder *b, cudnnBackendDescriptor_t op, cudnnBackendAttributeName_t name,
                 cudnnBackendDescriptor_t d) {
    if (d)
        set(b, op, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d);
}

static void finalize(builder *b, cudnnBackendDescriptor_t d, const char *what) {
    if (b->st == CUDNN_STATUS_SUCCESS)
        failed(b, cudnnBackendFinalize(d), what);
}

/* A tensor of four dimensions: uid 0 takes the next virtual id. */
static cudnnBackendDescriptor_t tensor(builder *b, int64_t uid, cudnnDataType_t type,
                                       const int64_t dim[4], const int64_t stride[4], int virt,
                                       int by_value) {
    cudnnBackendDescriptor_t d = make(b, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    if (!uid)
        uid = b->next_uid++;
    const int64_t align = 16;
    const bool is_virtual = virt != 0, is_by_value = by_value != 0;
    set(b, d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    set(b, d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim);
    set(b, d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, stride);
    set(b, d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    set(b, d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    set(b, d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    if (by_value)
        set(b, d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &is_by_value);
    finalize(b, d, "a tensor descriptor");
    return d;
}

/* A float scalar passed by value (its value goes in the variant pack). */
static cudnnBackendDescriptor_t scalar(builder *b, int64_t uid) {
    static const int64_t one[4] = {1, 1, 1, 1};
    return tensor(b, uid, CUDNN_DATA_FLOAT, one, one, 0, 1);
}

/* A virtual tensor of the given dimensions, packed, of type `type`. */
static cudnnBackendDescriptor_t packed(builder *b, cudnnDataType_t type, int64_t d0, int64_t d1,
                                       int64_t d2, int64_t d3) {
    const int64_t dim[4] = {d0, d1, d2, d3}, stride[4] = {d1 * d2 * d3, d2 * d3, d3, 1};
    return tensor(b, 0, type, dim, stride, 1, 0);
}

/* y = mode(x[, in1[, t]]), computed in `prec`; axis for GEN_INDEX (else -1). */
static cudnnBackendDescriptor_t pointwise(builder *b, cudnnPointwiseMode_t mode,
                                          cudnnDataType_t prec, int64_t axis,
                                          cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t in1,
                                          cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t pw = make(b, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    set(b, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    set(b, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0)
        set(b, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    finalize(b, pw, "a pointwise descriptor");
    cudnnBackendDescriptor_t op = make(b, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    const float one = 1.0f;
    link(b, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
    link(b, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    link(b, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, in1);
    link(b, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    link(b, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one);
    set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one);
    finalize(b, op, "a pointwise operation");
    return op;
}

/* c = a b, batched over the first two dimensions, accumulated in float. */
static cudnnBackendDescriptor_t matmul(builder *b, cudnnBackendDescriptor_t a,
                                       cudnnBackendDescriptor_t bb, cudnnBackendDescriptor_t c) {
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t mm = make(b, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    set(b, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    finalize(b, mm, "a matmul descriptor");
    cudnnBackendDescriptor_t op = make(b, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    link(b, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    link(b, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, bb);
    link(b, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    link(b, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    finalize(b, op, "a matmul operation");
    return op;
}

/* y = the sum (or maximum) of x over the dimensions where y has 1. */
static cudnnBackendDescriptor_t reduce(builder *b, cudnnReduceTensorOp_t how,
                                       cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t r = make(b, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    set(b, r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &how);
    set(b, r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    finalize(b, r, "a reduction descriptor");
    cudnnBackendDescriptor_t op = make(b, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    link(b, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    link(b, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    link(b, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, r);
    finalize(b, op, "a reduction operation");
    return op;
}

/* y: x's elements seen through y's dimensions and strides (a transpose, here). */
static cudnnBackendDescriptor_t reshape(builder *b, cudnnBackendDescriptor_t x,
                                        cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op = make(b, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    link(b, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    link(b, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    finalize(b, op, "a reshape operation");
    return op;
}

/* S masked to the causal band: row >= col ? s : -inf. */
static cudnnBackendDescriptor_t causal_mask(builder *b, cudnnBackendDescriptor_t s,
                                            cudnnBackendDescriptor_t neginf,
                                            cudnnBackendDescriptor_t *ops, int *nops, int64_t n,
                                            int64_t h, int64_t t) {
    cudnnBackendDescriptor_t row = packed(b, CUDNN_DATA_INT32, n, h, t, t);
    cudnnBackendDescriptor_t col = packed(b, CUDNN_DATA_INT32, n, h, t, t);
    cudnnBackendDescriptor_t keep = packed(b, CUDNN_DATA_BOOLEAN, n, h, t, t);
    cudnnBackendDescriptor_t out = packed(b, CUDNN_DATA_FLOAT, n, h, t, t);
    ops[(*nops)++] =
        pointwise(b, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, 2, s, NULL, NULL, row);
    ops[(*nops)++] =
        pointwise(b, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, 3, s, NULL, NULL, col);
    ops[(*nops)++] =
        pointwise(b, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, -1, row, col, NULL, keep);
    ops[(*nops)++] =
        pointwise(b, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, -1, s, neginf, keep, out);
    return out;
}

/* The operation graph of ops, the heuristics' engine configurations in order, the first whose
 * plan finalizes. */
static void make_plan(builder *b, cudnnHandle_t handle, cudnnBackendDescriptor_t *ops, int nops) {
    cudnnBackendDescriptor_t g = make(b, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set(b, g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    set(b, g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, nops, ops);
    finalize(b, g, "the operation graph");
    static const cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    for (int m = 0; m < 2 && b->st == CUDNN_STATUS_SUCCESS; m++) {
        cudnnBackendDescriptor_t heur = make(b, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
        link(b, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, g);
        set(b, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[m]);
        finalize(b, heur, "the engine heuristics");
        int64_t count = 0;
        if (b->st != CUDNN_STATUS_SUCCESS ||
            failed(b,
                   cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                            CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL),
                   "the heuristics' count"))
            return;
        if (count > 8)
            count = 8;
        cudnnBackendDescriptor_t cfg[8];
        for (int64_t i = 0; i < count; i++)
            cfg[i] = make(b, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
        int64_t got = 0;
        if (count == 0 || b->st != CUDNN_STATUS_SUCCESS ||
            failed(b,
                   cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                            CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, cfg),
                   "the heuristics' results"))
            continue;
        for (int64_t i = 0; i < got && i < count; i++) {
            cudnnBackendDescriptor_t plan = make(b, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
            set(b, plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
            link(b, plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg[i]);
            if (b->st != CUDNN_STATUS_SUCCESS)
                return;
            if (cudnnBackendFinalize(plan) != CUDNN_STATUS_SUCCESS)
                continue; /* this configuration does not take the graph; the next may */
            int64_t ws = 0, nws = 0;
            if (failed(b,
                       cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                CUDNN_TYPE_INT64, 1, &nws, &ws),
                       "the plan's workspace size"))
                return;
            b->pl->plan = plan;
            b->pl->ws = ws;
            return;
        }
    }
    failed(b, CUDNN_STATUS_NOT_SUPPORTED, "no engine of the heuristics takes the graph");
}

/* The forward graph of pl (see the top). */
static void build_fwd(builder *b, cudnnHandle_t handle) {
    const sdpa_plan *pl = b->pl;
    const int64_t n = pl->n, h = pl->heads, t = pl->t, c = pl->c, d = c / h;
    const int64_t qdim[4] = {n, h, t, d}, qstr[4] = {t * 3 * c, d, 3 * c, 1};
    const int64_t kdim[4] = {n, h, d, t}, kstr[4] = {t * 3 * c, d, 1, 3 * c}; /* K^T */
    const int64_t odim[4] = {n, h, t, d}, ostr[4] = {t * c, d, c, 1};
    const int64_t ldim[4] = {n, h, t, 1}, lstr[4] = {h * t, t, 1, 1};
    cudnnBackendDescriptor_t ops[24];
    int nops = 0;
    cudnnBackendDescriptor_t Q = tensor(b, U_Q, CUDNN_DATA_BFLOAT16, qdim, qstr, 0, 0);
    cudnnBackendDescriptor_t KT = tensor(b, U_K, CUDNN_DATA_BFLOAT16, kdim, kstr, 0, 0);
    cudnnBackendDescriptor_t V = tensor(b, U_V, CUDNN_DATA_BFLOAT16, qdim, qstr, 0, 0);
    cudnnBackendDescriptor_t O = tensor(b, U_O, CUDNN_DATA_BFLOAT16, odim, ostr, 0, 0);
    cudnnBackendDescriptor_t stats = tensor(b, U_STATS, CUDNN_DATA_FLOAT, ldim, lstr, 0, 0);
    cudnnBackendDescriptor_t scale = scalar(b, U_SCALE);
    cudnnBackendDescriptor_t neginf = pl->causal ? scalar(b, U_NEGINF) : NULL;

    cudnnBackendDescriptor_t s = packed(b, CUDNN_DATA_FLOAT, n, h, t, t);
    ops[nops++] = matmul(b, Q, KT, s);
    cudnnBackendDescriptor_t ss = packed(b, CUDNN_DATA_FLOAT, n, h, t, t);
    ops[nops++] = pointwise(b, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, -1, s, scale, NULL, ss);
    if (pl->causal)
        ss = causal_mask(b, ss, neginf, ops, &nops, n, h, t);
    cudnnBackendDescriptor_t m = packed(b, CUDNN_DATA_FLOAT, n, h, t, 1);
    ops[nops++] = reduce(b, CUDNN_REDUCE_TENSOR_MAX, ss, m);
    cudnnBackendDescriptor_t sm = packed(b, CUDNN_DATA_FLOAT, n, h, t, t);
    ops[nops++] = pointwise(b, CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, -1, ss, m, NULL, sm);
    cudnnBackendDescriptor_t e = packed(b, CUDNN_DATA_FLOAT, n, h, t, t);
    ops[nops++] = pointwise(b, CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, -1, sm, NULL, NULL, e);
    cudnnBackendDescriptor_t l = packed(b, CUDNN_DATA_FLOAT, n, h, t, 1);
    ops[nops++] = reduce(b, CUDNN_REDUCE_TENSOR_ADD, e, l);
    cudnnBackendDescriptor_t logl = packed(b, CUDNN_DATA_FLOAT, n, h, t, 1);
    ops[nops++] = pointwise(b, CUDNN_POINTWISE_LOG, CUDNN_DATA_FLOAT, -1, l, NULL, NULL, logl);
    ops[nops++] = pointwise(b, CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, -1, m, logl, NULL, stats);
    cudnnBackendDescriptor_t p = packed(b, CUDNN_DATA_BFLOAT16, n, h, t, t);
    ops[nops++] = pointwise(b, CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, -1, e, l, NULL, p);
    ops[nops++] = matmul(b, p, V, O);
    if (b->st == CUDNN_STATUS_SUCCESS)
        make_plan(b, handle, ops, nops);
}

/* The backward graph of pl (see the top). */
static void build_bwd(builder *b, cudnnHandle_t handle) {
    const sdpa_plan *pl = b->pl;
    const int64_t n = pl->n, h = pl->heads, t = pl->t, c = pl->c, d = c / h;
    const int64_t qdim[4] = {n, h, t, d}, qstr[4] = {t * 3 * c, d, 3 * c, 1};
    const int64_t tdim[4] = {n, h, d, t}, tstr[4] = {t * 3 * c, d, 1, 3 * c}; /* K^T, V^T */
    const int64_t odim[4] = {n, h, t, d}, ostr[4] = {t * c, d, c, 1};
    const int64_t ldim[4] = {n, h, t, 1}, lstr[4] = {h * t, t, 1, 1};
    const int64_t adim[4] = {n, h, t, d}, astr[4] = {h * t * d, t * d, d, 1};
    const int64_t trd[4] = {n, h, t, t}, trs[4] = {h * t * t, t * t, 1, t}; /* [.][.][j][i] */
    cudnnBackendDescriptor_t ops[32];
    int nops = 0;
    cudnnBackendDescriptor_t Q = tensor(b, U_Q, CUDNN_DATA_BFLOAT16, qdim, qstr, 0, 0);
    cudnnBackendDescriptor_t KT = tensor(b, U_K, CUDNN_DATA_BFLOAT16, tdim, tstr, 0, 0);
    cudnnBackendDescriptor_t VT = tensor(b, U_V, CUDNN_DATA_BFLOAT16, tdim, tstr, 0, 0);
    cudnnBackendDescriptor_t O = tensor(b, U_O, CUDNN_DATA_BFLOAT16, odim, ostr, 0, 0);
    cudnnBackendDescriptor_t dO = tensor(b, U_DO, CUDNN_DATA_BFLOAT16, odim, ostr, 0, 0);
    cudnnBackendDescriptor_t stats = tensor(b, U_STATS, CUDNN_DATA_FLOAT, ldim, lstr, 0, 0);
    cudnnBackendDescriptor_t dQ = tensor(b, U_DQ, CUDNN_DATA_BFLOAT16, qdim, qstr, 0, 0);
    cudnnBackendDescriptor_t dK = tensor(b, U_DK, CUDNN_DATA_BFLOAT16, qdim, qstr, 0, 0);
    cudnnBackendDescriptor_t dV = tensor(b, U_DV, CUDNN_DATA_BFLOAT16, qdim, qstr, 0, 0);
    cudnnBackendDescriptor_t dsum = tensor(b, U_DSUM, CUDNN_DATA_FLOAT, ldim, lstr, 0, 0);
    cudnnBackendDescriptor_t dqacc = tensor(b, U_DQACC, CUDNN_DATA_FLOAT, adim, astr, 0, 0);
    cudnnBackendDescriptor_t scale = scalar(b, U_SCALE), one = scalar(b, U_ONE);
    cudnnBackendDescriptor_t neginf = pl->causal ? scalar(b, U_NEGINF) : NULL;

    /* D = sum_e dO O */
    cudnnBackendDescriptor_t dOO = packed(b, CUDNN_DATA_FLOAT, n, h, t, d);
    ops[nops++] = pointwise(b, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, -1, dO, O, NULL, dOO);
    cudnnBackendDescriptor_t D = packed(b, CUDNN_DATA_FLOAT, n, h, t, 1);
    ops[nops++] = reduce(b, CUDNN_REDUCE_TENSOR_ADD, dOO, D);
    ops[nops++] = pointwise(b, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, -1, D, one, NULL, dsum);
    /* P = exp(S scale - Stats), masked */
    cudnnBackendDescriptor_t s = packed(b, CUDNN_DATA_FLOAT, n, h, t, t);
    ops[nops++] = matmul(b, Q, KT, s);
    cudnnBackendDescriptor_t ss = packed(b, CUDNN_DATA_FLOAT, n, h, t, t);
    ops[nops++] = pointwise(b, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, -1, s, scale, NULL, ss);
    cudnnBackendDescriptor_t sl = packed(b, CUDNN_DATA_FLOAT, n, h, t, t);
    ops[nops++] = pointwise(b, CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, -1, ss, stats, NULL, sl);
    if (pl->causal)
        sl = causal_mask(b, sl, neginf, ops, &nops, n, h, t);
    cudnnBackendDescriptor_t p = packed(b, CUDNN_DATA_FLOAT, n, h, t, t);
    ops[nops++] = pointwise(b, CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, -1, sl, NULL, NULL, p);
    /* dV = P^T dO */
    cudnnBackendDescriptor_t pt = tensor(b, 0, CUDNN_DATA_BFLOAT16, trd, trs, 1, 0);
    ops[nops++] = reshape(b, p, pt);
    ops[nops++] = matmul(b, pt, dO, dV);
    /* dS = P (dO V^T - D) scale */
    cudnnBackendDescriptor_t dp = packed(b, CUDNN_DATA_FLOAT, n, h, t, t);
    ops[nops++] = matmul(b, dO, VT, dp);
    cudnnBackendDescriptor_t dpd = packed(b, CUDNN_DATA_FLOAT, n, h, t, t);
    ops[nops++] = pointwise(b, CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, -1, dp, dsum, NULL, dpd);
    cudnnBackendDescriptor_t ds0 = packed(b, CUDNN_DATA_FLOAT, n, h, t, t);
    ops[nops++] = pointwise(b, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, -1, dpd, p, NULL, ds0);
    cudnnBackendDescriptor_t ds = packed(b, CUDNN_DATA_FLOAT, n, h, t, t);
    ops[nops++] = pointwise(b, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, -1, ds0, scale, NULL, ds);
    /* dK = dS^T Q */
    cudnnBackendDescriptor_t dst = tensor(b, 0, CUDNN_DATA_BFLOAT16, trd, trs, 1, 0);
    ops[nops++] = reshape(b, ds, dst);
    ops[nops++] = matmul(b, dst, Q, dK);
    /* dQ = dS K, accumulated in float, then rounded into dqkv */
    const int64_t kdim2[4] = {n, h, t, d};
    cudnnBackendDescriptor_t K = tensor(b, 0, CUDNN_DATA_BFLOAT16, kdim2, qstr, 1, 0);
    ops[nops++] = reshape(b, KT, K);
    ops[nops++] = matmul(b, ds, K, dqacc);
    ops[nops++] =
        pointwise(b, CUDNN_POINTWISE_IDENTITY, CUDNN_DATA_FLOAT, -1, dqacc, NULL, NULL, dQ);
    if (b->st == CUDNN_STATUS_SUCCESS)
        make_plan(b, handle, ops, nops);
}

/* ---- the cache ------------------------------------------------------------------------------ */

static void plan_free(sdpa_plan *pl) {
    for (int i = pl->ndesc - 1; i >= 0; i--)
        (void)cudnnBackendDestroyDescriptor(pl->desc[i]);
    free(pl);
}

void mgt_gpu_sdpa_free(mgt_gpu_impl *im) {
    struct mgt_gpu_sdpa_cache *c = im->sdpa;
    if (!c)
        return;
    for (int i = 0; i < c->np; i++)
        plan_free(c->p[i]);
    free(c->p);
    free(c);
    im->sdpa = NULL;
}

static struct mgt_gpu_sdpa_cache *cache_of(mgt_gpu_impl *im) {
    if (!im->sdpa) {
        im->sdpa = calloc(1, sizeof *im->sdpa);
        if (!im->sdpa)
            return NULL;
        const char *e = getenv("MGT_GPU_ATTENTION");
        im->sdpa->mode = !e || !*e || !strcmp(e, "auto") ? 0 : !strcmp(e, "own") ? 1 : 2;
        if (e && *e && strcmp(e, "auto") && strcmp(e, "own") && strcmp(e, "cudnn")) {
            mgt_die("MGT_GPU_ATTENTION=%s is not a choice: use auto (cuDNN's fused attention "
                    "where it can run, mgtrain's own kernels otherwise), own or cudnn",
                    e);
        }
    }
    return im->sdpa;
}

/* Why the fused path cannot take shape s at all (NULL: it can try). */
static const char *unfit(mgt_gpu_impl *im, const mgt_attn_shape *s) {
    if (!im->bf16)
        return "the activations are not bfloat16 (cuDNN's fused attention takes 16-bit data)";
    if (s->rate > 0)
        return "attention dropout (cuDNN's masks would not be mgtrain's)";
    if (im->deterministic)
        return "--reproducible (cuDNN's fused backward is not deterministic)";
    const int d = s->heads > 0 ? s->c / s->heads : 0;
    if (d % 8 || d > 128 || s->c % s->heads)
        return "heads of a channel count that is not a multiple of 8 up to 128";
    return NULL;
}

static sdpa_plan *find(mgt_gpu_impl *im, int bwd, const mgt_attn_shape *s) {
    struct mgt_gpu_sdpa_cache *c = cache_of(im);
    if (!c || c->mode == 1)
        return NULL;
    const char *why = unfit(im, s);
    if (why) {
        if (c->mode == 2) {
            mgt_die("MGT_GPU_ATTENTION=cudnn, but cuDNN's fused attention cannot run this "
                    "model's attention: %s; unset it to run mgtrain's own kernels",
                    why);
        }
        return NULL;
    }
    for (int i = 0; i < c->np; i++) {
        sdpa_plan *p = c->p[i];
        if (p->bwd == bwd && p->n == s->n && p->t == s->t && p->c == s->c && p->heads == s->heads &&
            p->causal == s->causal)
            return p;
    }
    if (c->np == c->cap) {
        const int cap = c->cap ? 2 * c->cap : 8;
        sdpa_plan **np = realloc(c->p, sizeof *np * (size_t)cap);
        if (!np)
            return NULL;
        c->p = np;
        c->cap = cap;
    }
    sdpa_plan *pl = calloc(1, sizeof *pl);
    if (!pl)
        return NULL;
    *pl = (sdpa_plan){
        .bwd = bwd, .n = s->n, .t = s->t, .c = s->c, .heads = s->heads, .causal = s->causal};
    builder b = {.pl = pl, .next_uid = U_VIRTUAL, .st = CUDNN_STATUS_SUCCESS};
    if (bwd)
        build_bwd(&b, (cudnnHandle_t)im->cudnn);
    else
        build_fwd(&b, (cudnnHandle_t)im->cudnn);
    if (b.st != CUDNN_STATUS_SUCCESS)
        pl->plan = NULL;
    if (!pl->plan) {
        char why[160];
        snprintf(why, sizeof why, "%s: %s", b.what ? b.what : "the plan",
                 cudnnGetErrorString(b.st));
        (void)cudaGetLastError(); /* a refusal leaves no error behind for the next launch */
        char last[256] = "";
        cudnnGetLastErrorString(last, sizeof last);
        if (c->mode == 0)
            mgt_log0("notice: cuDNN refused its fused attention for n=%d t=%d c=%d heads=%d "
                     "(%s): %s%s%s; mgtrain's own kernels run it\n",
                     s->n, s->t, s->c, s->heads, bwd ? "backward" : "forward", why,
                     *last ? "; " : "", last);
        if (c->mode == 2) {
            mgt_die("MGT_GPU_ATTENTION=cudnn, but cuDNN refused its fused attention for n=%d "
                    "t=%d c=%d heads=%d (%s): %s%s%s; unset it to run mgtrain's own kernels",
                    s->n, s->t, s->c, s->heads, bwd ? "backward" : "forward", why,
                    *last ? "; " : "", last);
        }
    }
    c->p[c->np++] = pl;
    return pl;
}

/* Bytes of the scratch each direction needs beyond the plan's workspace: D and dQ's float
 * accumulator (backward), each on a 256-byte boundary. */
static size_t round_up(size_t v) {
    return (v + 255) & ~(size_t)255;
}
static size_t extra_of(int bwd, const mgt_attn_shape *s) {
    if (!bwd)
        return 0;
    return round_up(sizeof(float) * (size_t)s->n * s->heads * s->t) +
           round_up(sizeof(float) * (size_t)s->n * s->t * s->c);
}

size_t mgt_gpu_sdpa_scratch(mgt_backend *be, const mgt_attn_shape *s) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    size_t most = 0;
    for (int bwd = 0; bwd < 2; bwd++) {
        sdpa_plan *p = s->n > 0 ? find(im, bwd, s) : NULL;
        if (p && p->plan) {
            const size_t need = round_up((size_t)p->ws) + extra_of(bwd, s);
            most = need > most ? need : most;
        }
    }
    return most;
}

static int aligned(const void *p) {
    return ((uintptr_t)p & 15) == 0;
}

/* Runs the plan on the compute stream with the variant pack of uids and pointers. */
static void execute(mgt_backend *be, sdpa_plan *p, const int64_t *uid, void *const *ptr, int n,
                    void *ws) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    cudnnBackendDescriptor_t pack = NULL;
    GPU_CHECK(CUDNN, cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack));
    GPU_CHECK(CUDNN, cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
                                              CUDNN_TYPE_INT64, n, uid));
    GPU_CHECK(CUDNN, cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                              CUDNN_TYPE_VOID_PTR, n, ptr));
    GPU_CHECK(CUDNN, cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                                              CUDNN_TYPE_VOID_PTR, 1, &ws));
    GPU_CHECK(CUDNN, cudnnBackendFinalize(pack));
    GPU_CHECK_ON(im->stream, CUDNN, cudnnBackendExecute((cudnnHandle_t)im->cudnn, p->plan, pack));
    (void)cudnnBackendDestroyDescriptor(pack);
}

int mgt_gpu_sdpa_fwd(mgt_backend *be, const mgt_attn_shape *s, const float *qkv, float *y,
                     float *lse) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    if (!aligned(qkv) || !aligned(y) || !aligned(lse))
        return 0;
    sdpa_plan *p = find(im, 0, s);
    if (!p || !p->plan)
        return 0;
    const uint16_t *q = (const uint16_t *)qkv; /* bfloat16 rows */
    const size_t c = (size_t)s->c;
    float scale = 1.0f / sqrtf((float)(s->c / s->heads)), neginf = -INFINITY;
    const int64_t uid[7] = {U_Q, U_K, U_V, U_O, U_STATS, U_SCALE, U_NEGINF};
    void *ptr[7] = {(void *)q, (void *)(q + c), (void *)(q + 2 * c), y, lse, &scale, &neginf};
    void *ws = mgt_gpu_workspace(be, round_up((size_t)p->ws));
    execute(be, p, uid, ptr, s->causal ? 7 : 6, ws); /* -inf: the causal mask's alone */
    return 1;
}

int mgt_gpu_sdpa_bwd(mgt_backend *be, const mgt_attn_shape *s, const float *qkv, const float *y,
                     const float *lse, const float *dy, float *dqkv) {
    mgt_gpu_impl *im = mgt_gpu_impl_of(be);
    if (!aligned(qkv) || !aligned(y) || !aligned(lse) || !aligned(dy) || !aligned(dqkv))
        return 0;
    sdpa_plan *p = find(im, 1, s);
    if (!p || !p->plan)
        return 0;
    const uint16_t *q = (const uint16_t *)qkv;
    uint16_t *g = (uint16_t *)dqkv;
    const size_t c = (size_t)s->c;
    float scale = 1.0f / sqrtf((float)(s->c / s->heads)), neginf = -INFINITY, one = 1.0f;
    const size_t wsb = round_up((size_t)p->ws);
    const size_t dsum = round_up(sizeof(float) * (size_t)s->n * s->heads * s->t);
    char *ws = (char *)mgt_gpu_workspace(be, wsb + extra_of(1, s));
    const int64_t uid[14] = {U_Q,  U_K,  U_V,    U_O,     U_DO,    U_STATS, U_DQ,
                             U_DK, U_DV, U_DSUM, U_DQACC, U_SCALE, U_ONE,   U_NEGINF};
    void *ptr[14] = {
        (void *)q, (void *)(q + c), (void *)(q + 2 * c), (void *)y, (void *)dy,      (void *)lse,
        g,         g + c,           g + 2 * c,           ws + wsb,  ws + wsb + dsum, &scale,
        &one,      &neginf};
    /* before cuDNN 9.6 the engines added dQ into an accumulator the caller had zeroed */
    if (cudnnGetVersion() < 90600)
        GPU_CHECK_ON(im->stream, CUDA,
                     cudaMemsetAsync(ws + wsb + dsum, 0, sizeof(float) * (size_t)s->n * s->t * c,
                                     im->stream));
    execute(be, p, uid, ptr, s->causal ? 14 : 13, ws);
    return 1;
}
