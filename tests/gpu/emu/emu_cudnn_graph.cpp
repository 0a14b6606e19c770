/* emu_cudnn_graph.cpp: cuDNN's backend (graph) API (cudnn_graph.h, 9.x), emulated on the host
 * (see emu.h) as a generic interpreter of operation graphs. The handles and the last error
 * (cudnnGetLastErrorString) are emu_cudnn.cpp's (emu_cudnn.h).
 *
 * Descriptors follow the backend API's life cycle as NVIDIA's documentation gives it:
 *   - cudnnBackendCreateDescriptor makes a descriptor of one of the types below (another type:
 *     CUDNN_STATUS_NOT_SUPPORTED); cudnnBackendSetAttribute stores an attribute generically (its
 *     name, type, element count and bytes), checking at once its type and count against the
 *     descriptor type (BAD_PARAM), that the descriptors it names are live, finalized and of the
 *     right type (BAD_PARAM), and cheap enumerant ranges; an attribute that exists in cuDNN for
 *     the descriptor type but is not emulated answers NOT_SUPPORTED, one that does not exist or
 *     that the descriptor computes (a count, a workspace size) BAD_PARAM. Setting an attribute
 *     of a finalized descriptor answers CUDNN_STATUS_NOT_INITIALIZED, as documented;
 *   - cudnnBackendFinalize checks the attributes together (a required one missing, inconsistent
 *     shapes: BAD_PARAM; what the emulation does not compute: NOT_SUPPORTED) and freezes the
 *     descriptor (finalizing it again: BAD_PARAM). A finalized descriptor is never changed again:
 * descriptors that name it hold its frozen state, so it may be destroyed right after use, as
 * cuDNN's may;
 *   - cudnnBackendGetAttribute on a descriptor that is not finalized answers
 *     CUDNN_STATUS_NOT_INITIALIZED; *elementCount gets the number of elements the attribute has
 *     and at most requestedElementCount of them are written; descriptor-valued attributes are
 *     copied into the caller's descriptors (created ones of the right type);
 *   - cudnnGetLastErrorString says which check failed.
 * Descriptor types and attributes (every tensor has 1 to 8 dimensions, strides in elements):
 *   TENSOR (DATA_TYPE, DIMENSIONS, STRIDES, UNIQUE_ID, BYTE_ALIGNMENT required; IS_VIRTUAL,
 *   IS_BY_VALUE: a scalar of dimensions all 1 whose value the variant pack gives as a host
 *   pointer, read at cudnnBackendExecute's call; VECTOR_COUNT 1, REORDERING_MODE NONE); POINTWISE
 *   (MODE, MATH_PREC, AXIS for GEN_INDEX); OPERATION_POINTWISE (PW_DESCRIPTOR, XDESC, BDESC for
 *   the binary modes and BINARY_SELECT, TDESC for BINARY_SELECT, YDESC, ALPHA1 and ALPHA2 of 1);
 *   MATMUL (COMP_TYPE); OPERATION_MATMUL (ADESC, BDESC, CDESC, DESC); REDUCTION (OPERATOR,
 *   COMP_TYPE); OPERATION_REDUCTION (XDESC, YDESC, DESC); OPERATION_RESHAPE (XDESC, YDESC);
 *   OPERATIONGRAPH (HANDLE, OPS; get ENGINE_GLOBAL_COUNT); ENGINEHEUR (OPERATION_GRAPH, MODE;
 *   get RESULTS); ENGINE (OPERATION_GRAPH, GLOBAL_INDEX); ENGINECFG (ENGINE; get WORKSPACE_SIZE);
 *   EXECUTION_PLAN (HANDLE, ENGINE_CONFIG; get WORKSPACE_SIZE); VARIANT_PACK (UNIQUE_IDS,
 *   DATA_POINTERS, WORKSPACE).
 *
 * Operations (each checked at its own finalize: equal ranks, the shapes below):
 *   - pointwise: Y = mode(X[, B[, T]]), X, B and T broadcast to Y along their dimensions of size
 *     1. Modes ADD, SUB, MUL, DIV, EXP, LOG, IDENTITY, CMP_EQ, CMP_NEQ, CMP_GT, CMP_GE, CMP_LT,
 *     CMP_LE (1 or 0), GEN_INDEX (Y = the element's index along AXIS; X gives only the shape,
 *     which Y must have) and BINARY_SELECT (Y = T ? X : B); any other mode is refused at the
 *     graph's finalize with NOT_SUPPORTED;
 *   - matmul: C[.., m, n] = sum_k A[.., m, k] B[.., k, n] over the last two dimensions, batched
 *     over the leading ones (where A or B has 1 it is broadcast); every operand strided as its
 *     descriptor says, so a transpose is a matter of strides;
 *   - reduction (ADD, MAX): Y = X reduced over every dimension where Y has 1 and X more;
 *   - reshape: Y is a new view of X's storage: the same element count, and Y's element at index
 *     i is the element of X's storage at Y's strided offset of i (Y's extent must lie within
 *     X's), converted to Y's data type where the two differ. For a non-virtual X, Y reads X's
 *     memory; a non-virtual Y gets the values at its offsets in its own memory.
 * The operation graph's finalize orders the operations by their data (the caller's order does
 * not matter) and checks (BAD_PARAM): tensors connect by unique id (one id, one tensor), every
 * virtual tensor is produced by exactly one operation, no tensor is produced twice, no cycle,
 * nothing writes a by-value tensor, every output's strides map its elements one to one; and
 * refuses with NOT_SUPPORTED what the emulation does not compute: data types other than FLOAT,
 * BFLOAT16, INT32 and BOOLEAN (BOOLEAN in virtual tensors only), math precisions other than
 * FLOAT (INT32 and BOOLEAN for the comparisons, GEN_INDEX, IDENTITY and BINARY_SELECT; INT32
 * for ADD, SUB and MUL too), compute types other than FLOAT, reductions other than ADD and MAX,
 * a non-virtual tensor whose BYTE_ALIGNMENT claim is below 16 bytes, a matmul operand with
 * neither of its last two dimensions of stride 1.
 *
 * Engines. ENGINE_GLOBAL_COUNT is 2; engines 0 and 1 are the same fused engine (they differ in
 * workspace) and take a graph when, as cuDNN's fused flash attention:
 *   - every matmul's A and B are 16-bit (BFLOAT16; HALF is not emulated at all), or FLOAT and
 *     virtual while the other is 16-bit (an intermediate the kernel holds in registers and
 *     feeds to the tensor cores rounded to bfloat16); a matmul of two float inputs, or of a
 *     float one in memory, has no engine;
 *   - every non-virtual tensor's innermost dimension (its smallest stride among the dimensions
 *     above 1) has stride 1;
 *   - every non-virtual matmul operand's innermost dimension (the head dimension) is a multiple
 *     of 8 and at most 256.
 * The heuristics (any mode) return both engines' configurations, engine 0 first, for such a
 * graph, and none (elementCount 0) otherwise or whenever MGT_EMU_CUDNN_NO_ENGINE is set to
 * anything but "" or "0" (so that a caller's way out is exercised); when they return none, the
 * last error says why (cuDNN would only log it). An ENGINE made directly by its global index
 * finalizes under the same rules (NOT_SUPPORTED otherwise). With MGT_EMU_CUDNN_STALE=all (as for
 * the convolutions, emu_cudnn.cpp) engine 0 is a stale heuristics entry: its execution plan's
 * finalize answers NOT_SUPPORTED, so that a caller's loop over the configurations is exercised;
 * by default and with MGT_EMU_CUDNN_STALE=none every configuration builds. The plan's workspace
 * is (engine + 1) (4096 + 8 r) bytes, r the element count of every reduction output of the
 * graph together, rounded up to 256 bytes: never zero.
 *
 * cudnnBackendExecute(handle, plan, pack) checks that every non-virtual tensor of the graph has
 * a pointer in the variant pack (BAD_PARAM: a missing id, a NULL pointer, a pointer not aligned
 * to the tensor's BYTE_ALIGNMENT claim; repeated ids are BAD_PARAM at the pack's finalize), that
 * each is device memory for its strided extent and the workspace device memory of the plan's
 * size not overlapping the tensors (else the process ends through emu::fail, as a GPU would
 * fault), reads the by-value scalars from their host pointers (device memory there ends the
 * process: cuDNN reads them on the host), then queues the whole graph on the handle's stream,
 * which overwrites the workspace with garbage as a GPU would. Overlaps between the tensors
 * themselves are not checked (mgtrain's Q, K and V interleave in one allocation).
 *
 * Numerics. Every tensor is a strided view. Virtual tensors hold their values in their data
 * type, in a buffer laid out by their strides (fresh NaN bytes, so a gap a reshape reads shows):
 * BFLOAT16 rounds every value stored to bfloat16 (to nearest even), FLOAT holds floats, INT32
 * and BOOLEAN exact values. Non-virtual outputs are stored in their data type the same way (a
 * BFLOAT16 one rounded once, to nearest even). Pointwise operations compute per element in
 * their math precision as a GPU does: FLOAT rounds the inputs to float (exact for bfloat16 and
 * small integers) and computes in float (EXP, LOG: expf, logf; exp(-inf) = 0, log(0) = -inf);
 * INT32 in integers; BOOLEAN compares the values as they are. Matmuls and reductions
 * accumulate in double (the products of 16-bit inputs are exact, and a GPU's float accumulation
 * is within its own rounding of this sum) and round once to the output's type; the bfloat16
 * rounding of a float virtual matmul input (above) comes first. */
#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif

#include <cudnn.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "emu.h"
#include "emu_cudnn.h"
#include "emu_util.h"

namespace {

constexpr int kMaxDims = 8;       /* CUDNN_DIM_MAX */
constexpr int64_t kEngines = 2;   /* ENGINE_GLOBAL_COUNT */
constexpr int64_t kMinAlign = 16; /* what the fused engines assume of every pointer */

__attribute__((format(printf, 2, 3))) cudnnStatus_t err(cudnnStatus_t st, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return emu::cudnn_error(st, "%s", msg);
}

/* ---- names, for messages ---- */

const char *type_name(cudnnBackendDescriptorType_t t) {
    switch (t) {
#define NAME(x)                                                                                    \
    case CUDNN_BACKEND_##x:                                                                        \
        return "CUDNN_BACKEND_" #x;
        NAME(TENSOR_DESCRIPTOR)
        NAME(POINTWISE_DESCRIPTOR)
        NAME(OPERATION_POINTWISE_DESCRIPTOR)
        NAME(MATMUL_DESCRIPTOR)
        NAME(OPERATION_MATMUL_DESCRIPTOR)
        NAME(REDUCTION_DESCRIPTOR)
        NAME(OPERATION_REDUCTION_DESCRIPTOR)
        NAME(OPERATION_RESHAPE_DESCRIPTOR)
        NAME(OPERATIONGRAPH_DESCRIPTOR)
        NAME(ENGINEHEUR_DESCRIPTOR)
        NAME(ENGINE_DESCRIPTOR)
        NAME(ENGINECFG_DESCRIPTOR)
        NAME(EXECUTION_PLAN_DESCRIPTOR)
        NAME(VARIANT_PACK_DESCRIPTOR)
#undef NAME
    default:
        return "descriptor type the emulation does not have";
    }
}

const char *dtype_name(cudnnDataType_t t) {
    switch (t) {
    case CUDNN_DATA_FLOAT:
        return "FLOAT";
    case CUDNN_DATA_DOUBLE:
        return "DOUBLE";
    case CUDNN_DATA_HALF:
        return "HALF";
    case CUDNN_DATA_INT8:
        return "INT8";
    case CUDNN_DATA_INT32:
        return "INT32";
    case CUDNN_DATA_UINT8:
        return "UINT8";
    case CUDNN_DATA_BFLOAT16:
        return "BFLOAT16";
    case CUDNN_DATA_INT64:
        return "INT64";
    case CUDNN_DATA_BOOLEAN:
        return "BOOLEAN";
    default:
        return "another data type";
    }
}

const char *mode_name(cudnnPointwiseMode_t m) {
    switch (m) {
    case CUDNN_POINTWISE_ADD:
        return "ADD";
    case CUDNN_POINTWISE_SUB:
        return "SUB";
    case CUDNN_POINTWISE_MUL:
        return "MUL";
    case CUDNN_POINTWISE_DIV:
        return "DIV";
    case CUDNN_POINTWISE_EXP:
        return "EXP";
    case CUDNN_POINTWISE_LOG:
        return "LOG";
    case CUDNN_POINTWISE_IDENTITY:
        return "IDENTITY";
    case CUDNN_POINTWISE_CMP_EQ:
        return "CMP_EQ";
    case CUDNN_POINTWISE_CMP_NEQ:
        return "CMP_NEQ";
    case CUDNN_POINTWISE_CMP_GT:
        return "CMP_GT";
    case CUDNN_POINTWISE_CMP_GE:
        return "CMP_GE";
    case CUDNN_POINTWISE_CMP_LT:
        return "CMP_LT";
    case CUDNN_POINTWISE_CMP_LE:
        return "CMP_LE";
    case CUDNN_POINTWISE_GEN_INDEX:
        return "GEN_INDEX";
    case CUDNN_POINTWISE_BINARY_SELECT:
        return "BINARY_SELECT";
    default:
        return nullptr; /* not emulated */
    }
}

/* ---- the attributes each descriptor type takes ---- */

constexpr int kNotRef = -2; /* a value attribute */
constexpr int kAnyOp = -1;  /* names an operation descriptor of any kind */

struct Spec {
    cudnnBackendDescriptorType_t desc;
    cudnnBackendAttributeName_t name;
    const char *text;
    cudnnBackendAttributeType_t type, alt; /* the type it takes (alt: a second accepted one) */
    int64_t min, max;                      /* element count */
    int ref;                               /* descriptor-valued: the descriptor type it names */
};

#define SPEC(D, A, T, ALT, MIN, MAX, REF)                                                          \
    {                                                                                              \
        CUDNN_BACKEND_##D##_DESCRIPTOR, CUDNN_ATTR_##A, "CUDNN_ATTR_" #A, CUDNN_TYPE_##T,          \
            CUDNN_TYPE_##ALT, MIN, MAX, REF                                                        \
    }
#define VAL(D, A, T, MIN, MAX) SPEC(D, A, T, T, MIN, MAX, kNotRef)
#define REF(D, A, R, MIN, MAX)                                                                     \
    SPEC(D, A, BACKEND_DESCRIPTOR, BACKEND_DESCRIPTOR, MIN, MAX,                                   \
         (int)CUDNN_BACKEND_##R##_DESCRIPTOR)
constexpr int64_t kMany = INT64_MAX;
const Spec specs[] = {
    VAL(TENSOR, TENSOR_DATA_TYPE, DATA_TYPE, 1, 1),
    VAL(TENSOR, TENSOR_DIMENSIONS, INT64, 1, kMaxDims),
    VAL(TENSOR, TENSOR_STRIDES, INT64, 1, kMaxDims),
    VAL(TENSOR, TENSOR_UNIQUE_ID, INT64, 1, 1),
    VAL(TENSOR, TENSOR_BYTE_ALIGNMENT, INT64, 1, 1),
    VAL(TENSOR, TENSOR_IS_VIRTUAL, BOOLEAN, 1, 1),
    VAL(TENSOR, TENSOR_IS_BY_VALUE, BOOLEAN, 1, 1),
    VAL(TENSOR, TENSOR_VECTOR_COUNT, INT64, 1, 1),
    VAL(TENSOR, TENSOR_VECTORIZED_DIMENSION, INT64, 1, 1),
    VAL(TENSOR, TENSOR_REORDERING_MODE, TENSOR_REORDERING_MODE, 1, 1),
    VAL(POINTWISE, POINTWISE_MODE, POINTWISE_MODE, 1, 1),
    VAL(POINTWISE, POINTWISE_MATH_PREC, DATA_TYPE, 1, 1),
    VAL(POINTWISE, POINTWISE_AXIS, INT64, 1, 1),
    REF(OPERATION_POINTWISE, OPERATION_POINTWISE_PW_DESCRIPTOR, POINTWISE, 1, 1),
    REF(OPERATION_POINTWISE, OPERATION_POINTWISE_XDESC, TENSOR, 1, 1),
    REF(OPERATION_POINTWISE, OPERATION_POINTWISE_BDESC, TENSOR, 1, 1),
    REF(OPERATION_POINTWISE, OPERATION_POINTWISE_TDESC, TENSOR, 1, 1),
    REF(OPERATION_POINTWISE, OPERATION_POINTWISE_YDESC, TENSOR, 1, 1),
    SPEC(OPERATION_POINTWISE, OPERATION_POINTWISE_ALPHA1, FLOAT, DOUBLE, 1, 1, kNotRef),
    SPEC(OPERATION_POINTWISE, OPERATION_POINTWISE_ALPHA2, FLOAT, DOUBLE, 1, 1, kNotRef),
    VAL(MATMUL, MATMUL_COMP_TYPE, DATA_TYPE, 1, 1),
    REF(OPERATION_MATMUL, OPERATION_MATMUL_ADESC, TENSOR, 1, 1),
    REF(OPERATION_MATMUL, OPERATION_MATMUL_BDESC, TENSOR, 1, 1),
    REF(OPERATION_MATMUL, OPERATION_MATMUL_CDESC, TENSOR, 1, 1),
    REF(OPERATION_MATMUL, OPERATION_MATMUL_DESC, MATMUL, 1, 1),
    VAL(REDUCTION, REDUCTION_OPERATOR, REDUCTION_OPERATOR_TYPE, 1, 1),
    VAL(REDUCTION, REDUCTION_COMP_TYPE, DATA_TYPE, 1, 1),
    VAL(REDUCTION, REDUCTION_IS_DETERMINISTIC, BOOLEAN, 1, 1),
    REF(OPERATION_REDUCTION, OPERATION_REDUCTION_XDESC, TENSOR, 1, 1),
    REF(OPERATION_REDUCTION, OPERATION_REDUCTION_YDESC, TENSOR, 1, 1),
    REF(OPERATION_REDUCTION, OPERATION_REDUCTION_DESC, REDUCTION, 1, 1),
    REF(OPERATION_RESHAPE, OPERATION_RESHAPE_XDESC, TENSOR, 1, 1),
    REF(OPERATION_RESHAPE, OPERATION_RESHAPE_YDESC, TENSOR, 1, 1),
    VAL(OPERATIONGRAPH, OPERATIONGRAPH_HANDLE, HANDLE, 1, 1),
    SPEC(OPERATIONGRAPH, OPERATIONGRAPH_OPS, BACKEND_DESCRIPTOR, BACKEND_DESCRIPTOR, 1, kMany,
         kAnyOp),
    VAL(OPERATIONGRAPH, OPERATIONGRAPH_IS_DYNAMIC_SHAPE_ENABLED, BOOLEAN, 1, 1),
    REF(ENGINEHEUR, ENGINEHEUR_OPERATION_GRAPH, OPERATIONGRAPH, 1, 1),
    VAL(ENGINEHEUR, ENGINEHEUR_MODE, HEUR_MODE, 1, 1),
    VAL(ENGINEHEUR, ENGINEHEUR_SM_COUNT_TARGET, INT32, 1, 1),
    REF(ENGINE, ENGINE_OPERATION_GRAPH, OPERATIONGRAPH, 1, 1),
    VAL(ENGINE, ENGINE_GLOBAL_INDEX, INT64, 1, 1),
    VAL(ENGINE, ENGINE_SM_COUNT_TARGET, INT32, 1, 1),
    REF(ENGINECFG, ENGINECFG_ENGINE, ENGINE, 1, 1),
    VAL(EXECUTION_PLAN, EXECUTION_PLAN_HANDLE, HANDLE, 1, 1),
    REF(EXECUTION_PLAN, EXECUTION_PLAN_ENGINE_CONFIG, ENGINECFG, 1, 1),
    VAL(VARIANT_PACK, VARIANT_PACK_UNIQUE_IDS, INT64, 0, kMany),
    VAL(VARIANT_PACK, VARIANT_PACK_DATA_POINTERS, VOID_PTR, 0, kMany),
    VAL(VARIANT_PACK, VARIANT_PACK_WORKSPACE, VOID_PTR, 1, 1),
};
#undef REF
#undef VAL
#undef SPEC

/* The attributes each type has in cuDNN: their names lie in these ranges. One of them that the
 * table above lacks exists but is not emulated (NOT_SUPPORTED); any other is not an attribute
 * of the type at all (BAD_PARAM). */
struct Family {
    cudnnBackendDescriptorType_t desc;
    int lo, hi;
};
const Family families[] = {
    {CUDNN_BACKEND_POINTWISE_DESCRIPTOR, 0, 99},
    {CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, 200, 299},
    {CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, 300, 399},
    {CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, 400, 499},
    {CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, 750, 769},
    {CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, 800, 899},
    {CUDNN_BACKEND_TENSOR_DESCRIPTOR, 900, 999},
    {CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, 1000, 1099},
    {CUDNN_BACKEND_ENGINE_DESCRIPTOR, 1300, 1399},
    {CUDNN_BACKEND_MATMUL_DESCRIPTOR, 1500, 1519},
    {CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, 1520, 1599},
    {CUDNN_BACKEND_REDUCTION_DESCRIPTOR, 1600, 1609},
    {CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, 1610, 1619},
    {CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, 2200, 2249},
};

bool emulated_type(cudnnBackendDescriptorType_t t) {
    for (const Family &f : families)
        if (f.desc == t)
            return true;
    return false;
}

bool is_operation(cudnnBackendDescriptorType_t t) {
    return t == CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR ||
           t == CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR ||
           t == CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR ||
           t == CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR;
}

/* The attributes a descriptor computes: they are read, never set. */
bool computed(cudnnBackendDescriptorType_t d, cudnnBackendAttributeName_t a) {
    return (d == CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR &&
            a == CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT) ||
           (d == CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR && a == CUDNN_ATTR_ENGINEHEUR_RESULTS) ||
           (d == CUDNN_BACKEND_ENGINECFG_DESCRIPTOR && a == CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE) ||
           (d == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR &&
            a == CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE);
}

const Spec *spec_of(cudnnBackendDescriptorType_t d, cudnnBackendAttributeName_t a) {
    for (const Spec &s : specs)
        if (s.desc == d && s.name == a)
            return &s;
    return nullptr;
}

/* The status and message for an attribute `a` the table lacks for type d. */
cudnnStatus_t unknown_attr(const char *fn, cudnnBackendDescriptorType_t d, int a) {
    for (const Family &f : families)
        if (f.desc == d && a >= f.lo && a <= f.hi)
            return err(CUDNN_STATUS_NOT_SUPPORTED, "%s: attribute %d of a %s is not emulated", fn,
                       a, type_name(d));
    return err(CUDNN_STATUS_BAD_PARAM, "%s: attribute %d is not an attribute of a %s", fn, a,
               type_name(d));
}

/* Bytes of one element of an attribute type. */
size_t attr_size(cudnnBackendAttributeType_t t) {
    switch (t) {
    case CUDNN_TYPE_HANDLE:
        return sizeof(cudnnHandle_t);
    case CUDNN_TYPE_DATA_TYPE:
        return sizeof(cudnnDataType_t);
    case CUDNN_TYPE_BOOLEAN:
        return sizeof(bool);
    case CUDNN_TYPE_INT64:
        return sizeof(int64_t);
    case CUDNN_TYPE_FLOAT:
        return sizeof(float);
    case CUDNN_TYPE_DOUBLE:
        return sizeof(double);
    case CUDNN_TYPE_VOID_PTR:
        return sizeof(void *);
    case CUDNN_TYPE_BACKEND_DESCRIPTOR:
        return sizeof(cudnnBackendDescriptor_t);
    case CUDNN_TYPE_INT32:
        return sizeof(int32_t);
    case CUDNN_TYPE_POINTWISE_MODE:
        return sizeof(cudnnPointwiseMode_t);
    case CUDNN_TYPE_HEUR_MODE:
        return sizeof(cudnnBackendHeurMode_t);
    case CUDNN_TYPE_REDUCTION_OPERATOR_TYPE:
        return sizeof(cudnnReduceTensorOp_t);
    case CUDNN_TYPE_TENSOR_REORDERING_MODE:
        return sizeof(cudnnBackendTensorReordering_t);
    default:
        return sizeof(int); /* the other enumerations */
    }
}

/* ---- what finalized descriptors hold ---- */

struct Tensor {
    int64_t uid = 0;
    cudnnDataType_t type = CUDNN_DATA_FLOAT;
    int nd = 0;
    int64_t dim[kMaxDims] = {}, stride[kMaxDims] = {};
    int64_t align = 0;
    bool is_virtual = false, by_value = false;

    int64_t elems() const {
        int64_t n = 1;
        for (int i = 0; i < nd; i++)
            n *= dim[i];
        return n;
    }
    /* 1 + the largest offset of an element */
    int64_t extent() const {
        int64_t e = 1;
        for (int i = 0; i < nd; i++)
            e += (dim[i] - 1) * stride[i];
        return e;
    }
    bool same(const Tensor &o) const {
        if (type != o.type || nd != o.nd || is_virtual != o.is_virtual || by_value != o.by_value)
            return false;
        for (int i = 0; i < nd; i++)
            if (dim[i] != o.dim[i] || stride[i] != o.stride[i])
                return false;
        return true;
    }
    /* The dimension of size above 1 with the smallest stride (the last such on a tie), -1 if
     * none. */
    int innermost() const {
        int best = -1;
        for (int i = 0; i < nd; i++)
            if (dim[i] > 1 && (best < 0 || stride[i] <= stride[best]))
                best = i;
        return best;
    }
    /* Whether no two elements share an offset: the dimensions above 1, by increasing stride,
     * each start past the previous one's extent. */
    bool one_to_one() const {
        std::vector<int> d;
        for (int i = 0; i < nd; i++)
            if (dim[i] > 1)
                d.push_back(i);
        std::sort(d.begin(), d.end(), [&](int a, int b) { return stride[a] < stride[b]; });
        int64_t span = 1;
        for (int i : d) {
            if (stride[i] < span)
                return false;
            span = stride[i] * dim[i];
        }
        return true;
    }
    std::string text() const {
        std::string s = "uid " + std::to_string(uid) + " [";
        for (int i = 0; i < nd; i++)
            s += (i ? "," : "") + std::to_string(dim[i]);
        s += "] strides [";
        for (int i = 0; i < nd; i++)
            s += (i ? "," : "") + std::to_string(stride[i]);
        s += std::string("] ") + dtype_name(type);
        if (is_virtual)
            s += " virtual";
        if (by_value)
            s += " by value";
        return s;
    }
};

/* Bytes of one element of a tensor data type the emulation computes (0: none). */
size_t elem_size(cudnnDataType_t t) {
    switch (t) {
    case CUDNN_DATA_FLOAT:
        return 4;
    case CUDNN_DATA_BFLOAT16:
        return 2;
    case CUDNN_DATA_INT32:
        return 4;
    case CUDNN_DATA_BOOLEAN:
        return 1;
    default:
        return 0;
    }
}

enum class Kind { Pointwise, Matmul, Reduction, Reshape };

/* One operation: its inputs in[] (pointwise: X, B, T; matmul: A, B; reduction and reshape: X)
 * and its output. */
struct Op {
    Kind kind = Kind::Pointwise;
    cudnnPointwiseMode_t mode = CUDNN_POINTWISE_IDENTITY;
    cudnnDataType_t prec = CUDNN_DATA_FLOAT; /* pointwise math precision; matmul, reduction
                                                compute type */
    int64_t axis = -1;
    cudnnReduceTensorOp_t red = CUDNN_REDUCE_TENSOR_ADD;
    Tensor in[3];
    bool has[3] = {false, false, false};
    const char *in_name[3] = {"", "", ""};
    Tensor out;
    const char *out_name = "";
    const char *text = ""; /* names it in messages */
};

/* A finalized operation graph: the operations in an order that runs every producer before its
 * readers, and its tensors by unique id. */
struct Graph {
    cudnnHandle_t handle = nullptr;
    std::vector<Op> ops;
    std::map<int64_t, Tensor> tensors;
    std::string unsupported; /* why the engines do not take it ("" if they do) */

    /* the workspace of engine e's plan (see the top) */
    size_t workspace(int64_t e) const {
        uint64_t rows = 0;
        for (const Op &op : ops)
            if (op.kind == Kind::Reduction)
                rows += (uint64_t)op.out.elems();
        const uint64_t b = (uint64_t)(e + 1) * (4096 + 8 * rows);
        return (size_t)((b + 255) & ~(uint64_t)255);
    }
};

struct State;
using Ref = std::shared_ptr<const State>;

struct Attr {
    cudnnBackendAttributeType_t type = CUDNN_TYPE_INT64;
    int64_t count = 0;
    std::vector<unsigned char> bytes; /* value attributes */
    std::vector<Ref> refs;            /* descriptor-valued attributes: the states they name */
};

/* A descriptor's state. Once finalized it never changes: other descriptors hold it. */
struct State {
    cudnnBackendDescriptorType_t type;
    bool finalized = false;
    std::map<int, Attr> attrs;
    /* what finalize derived, by type */
    Tensor tensor;                                        /* TENSOR */
    cudnnPointwiseMode_t mode = CUDNN_POINTWISE_IDENTITY; /* POINTWISE */
    cudnnDataType_t prec = CUDNN_DATA_FLOAT; /* POINTWISE math precision, MATMUL and REDUCTION
                                                compute type */
    int64_t axis = -1;
    cudnnReduceTensorOp_t red = CUDNN_REDUCE_TENSOR_ADD; /* REDUCTION */
    Op op;                                               /* OPERATION_* */
    std::shared_ptr<const Graph> graph; /* OPERATIONGRAPH, ENGINEHEUR, ENGINE, ENGINECFG, PLAN */
    Ref graph_state;                    /* ENGINEHEUR: the graph's descriptor state */
    std::vector<int64_t> engines;       /* ENGINEHEUR: its results, best first */
    int64_t engine = -1;                /* ENGINE, ENGINECFG, PLAN */
    size_t workspace = 0;               /* ENGINECFG, PLAN */
    std::vector<int64_t> uids;          /* VARIANT_PACK */
    std::vector<void *> ptrs;
    void *ws = nullptr;

    explicit State(cudnnBackendDescriptorType_t t) : type(t) {}
};

/* What a cudnnBackendDescriptor_t points to. */
struct Desc {
    std::shared_ptr<State> st;
};

emu::LiveSet live;

/* The descriptor d names; one that is not live is a use after destroy (or garbage). */
Desc *desc_of(cudnnBackendDescriptor_t d, const char *fn, const char *what) {
    if (!live.contains(d))
        emu::fail("%s: %s %p is not a live backend descriptor (destroyed, or never created)", fn,
                  what, d);
    return (Desc *)d;
}

const Attr *find(const State &s, cudnnBackendAttributeName_t a) {
    auto it = s.attrs.find((int)a);
    return it == s.attrs.end() ? nullptr : &it->second;
}

template <typename T> T value(const Attr &a, int64_t i = 0) {
    T v;
    std::memcpy(&v, a.bytes.data() + (size_t)i * sizeof(T), sizeof v);
    return v;
}

/* The single state a descriptor-valued attribute names (nullptr if unset). */
const State *ref(const State &s, cudnnBackendAttributeName_t a) {
    const Attr *at = find(s, a);
    return at && !at->refs.empty() ? at->refs[0].get() : nullptr;
}

/* A required attribute missing at finalize. */
cudnnStatus_t missing(const char *fn, const State &s, const char *attr) {
    return err(CUDNN_STATUS_BAD_PARAM, "%s: a %s needs %s", fn, type_name(s.type), attr);
}

bool env_on(const char *name) {
    const char *v = std::getenv(name);
    return v && *v && std::strcmp(v, "0") != 0;
}

bool stale_all() {
    const char *v = std::getenv("MGT_EMU_CUDNN_STALE");
    return v && !std::strcmp(v, "all");
}

/* ---- finalize, per type ---- */

cudnnStatus_t finalize_tensor(const char *fn, State &s) {
    const Attr *dt = find(s, CUDNN_ATTR_TENSOR_DATA_TYPE),
               *dims = find(s, CUDNN_ATTR_TENSOR_DIMENSIONS),
               *str = find(s, CUDNN_ATTR_TENSOR_STRIDES),
               *uid = find(s, CUDNN_ATTR_TENSOR_UNIQUE_ID),
               *al = find(s, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT);
    if (!dt)
        return missing(fn, s, "CUDNN_ATTR_TENSOR_DATA_TYPE");
    if (!dims || !str)
        return missing(fn, s, "CUDNN_ATTR_TENSOR_DIMENSIONS and CUDNN_ATTR_TENSOR_STRIDES");
    if (!uid)
        return missing(fn, s, "CUDNN_ATTR_TENSOR_UNIQUE_ID");
    if (!al)
        return missing(fn, s, "CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT");
    Tensor t;
    t.type = value<cudnnDataType_t>(*dt);
    t.uid = value<int64_t>(*uid);
    t.align = value<int64_t>(*al);
    if (dims->count != str->count)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: tensor uid %lld: %lld dimensions but %lld strides",
                   fn, (long long)t.uid, (long long)dims->count, (long long)str->count);
    t.nd = (int)dims->count;
    for (int i = 0; i < t.nd; i++) {
        t.dim[i] = value<int64_t>(*dims, i);
        t.stride[i] = value<int64_t>(*str, i);
        if (t.dim[i] <= 0 || t.stride[i] <= 0)
            return err(CUDNN_STATUS_BAD_PARAM,
                       "%s: tensor uid %lld: dimension %d is %lld with stride %lld; both must be "
                       "positive",
                       fn, (long long)t.uid, i, (long long)t.dim[i], (long long)t.stride[i]);
        if (t.dim[i] > ((int64_t)1 << 40) || t.stride[i] > ((int64_t)1 << 40))
            return err(CUDNN_STATUS_BAD_PARAM, "%s: tensor uid %lld: dimension %d too large", fn,
                       (long long)t.uid, i);
    }
    if (t.elems() > ((int64_t)1 << 40) || t.extent() > ((int64_t)1 << 40))
        return err(CUDNN_STATUS_BAD_PARAM, "%s: tensor uid %lld: too many elements", fn,
                   (long long)t.uid);
    if (t.align <= 0 || (t.align & (t.align - 1)))
        return err(CUDNN_STATUS_BAD_PARAM,
                   "%s: tensor uid %lld: byte alignment %lld is not a positive power of two", fn,
                   (long long)t.uid, (long long)t.align);
    if (const Attr *v = find(s, CUDNN_ATTR_TENSOR_IS_VIRTUAL))
        t.is_virtual = value<bool>(*v);
    if (const Attr *v = find(s, CUDNN_ATTR_TENSOR_IS_BY_VALUE))
        t.by_value = value<bool>(*v);
    if (t.is_virtual && t.by_value)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: tensor uid %lld is both virtual and by value", fn,
                   (long long)t.uid);
    if (t.by_value && t.elems() != 1)
        return err(CUDNN_STATUS_BAD_PARAM,
                   "%s: tensor uid %lld is by value but has %lld elements: a by-value tensor is "
                   "a scalar (every dimension 1)",
                   fn, (long long)t.uid, (long long)t.elems());
    if (const Attr *v = find(s, CUDNN_ATTR_TENSOR_VECTOR_COUNT))
        if (value<int64_t>(*v) != 1)
            return err(CUDNN_STATUS_NOT_SUPPORTED,
                       "%s: tensor uid %lld: vectorized tensors (vector count %lld) are not "
                       "emulated",
                       fn, (long long)t.uid, (long long)value<int64_t>(*v));
    if (const Attr *v = find(s, CUDNN_ATTR_TENSOR_REORDERING_MODE))
        if (value<cudnnBackendTensorReordering_t>(*v) != CUDNN_TENSOR_REORDERING_NONE)
            return err(CUDNN_STATUS_NOT_SUPPORTED,
                       "%s: tensor uid %lld: reordered tensors are not emulated", fn,
                       (long long)t.uid);
    s.tensor = t;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_pointwise(const char *fn, State &s) {
    const Attr *m = find(s, CUDNN_ATTR_POINTWISE_MODE),
               *p = find(s, CUDNN_ATTR_POINTWISE_MATH_PREC);
    if (!m)
        return missing(fn, s, "CUDNN_ATTR_POINTWISE_MODE");
    if (!p)
        return missing(fn, s, "CUDNN_ATTR_POINTWISE_MATH_PREC");
    s.mode = value<cudnnPointwiseMode_t>(*m);
    s.prec = value<cudnnDataType_t>(*p);
    const Attr *ax = find(s, CUDNN_ATTR_POINTWISE_AXIS);
    s.axis = ax ? value<int64_t>(*ax) : -1;
    if (s.mode == CUDNN_POINTWISE_GEN_INDEX && !ax)
        return missing(fn, s, "CUDNN_ATTR_POINTWISE_AXIS for GEN_INDEX");
    return CUDNN_STATUS_SUCCESS;
}

/* Whether `in` broadcasts to `out`: the same rank, each dimension equal or 1. */
bool broadcasts(const Tensor &in, const Tensor &out) {
    if (in.nd != out.nd)
        return false;
    for (int i = 0; i < in.nd; i++)
        if (in.dim[i] != out.dim[i] && in.dim[i] != 1)
            return false;
    return true;
}

cudnnStatus_t finalize_op_pointwise(const char *fn, State &s) {
    const State *pw = ref(s, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR);
    const State *x = ref(s, CUDNN_ATTR_OPERATION_POINTWISE_XDESC);
    const State *b = ref(s, CUDNN_ATTR_OPERATION_POINTWISE_BDESC);
    const State *t = ref(s, CUDNN_ATTR_OPERATION_POINTWISE_TDESC);
    const State *y = ref(s, CUDNN_ATTR_OPERATION_POINTWISE_YDESC);
    if (!pw)
        return missing(fn, s, "CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR");
    if (!x || !y)
        return missing(fn, s, "CUDNN_ATTR_OPERATION_POINTWISE_XDESC and _YDESC");
    for (auto a : {CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2})
        if (const Attr *al = find(s, a)) {
            const double v = al->type == CUDNN_TYPE_FLOAT ? value<float>(*al) : value<double>(*al);
            if (v != 1.0)
                return err(CUDNN_STATUS_NOT_SUPPORTED,
                           "%s: pointwise ALPHA1 and ALPHA2 other than 1 (%g) are not emulated", fn,
                           v);
        }
    Op op;
    op.kind = Kind::Pointwise;
    op.mode = pw->mode;
    op.prec = pw->prec;
    op.axis = pw->axis;
    op.text = "a pointwise operation";
    op.in[0] = x->tensor;
    op.has[0] = true;
    op.in_name[0] = "X";
    op.out = y->tensor;
    op.out_name = "Y";
    const bool unary = op.mode == CUDNN_POINTWISE_EXP || op.mode == CUDNN_POINTWISE_LOG ||
                       op.mode == CUDNN_POINTWISE_IDENTITY || op.mode == CUDNN_POINTWISE_GEN_INDEX;
    const bool select = op.mode == CUDNN_POINTWISE_BINARY_SELECT;
    const char *mn = mode_name(op.mode);
    if (mn && !unary && !b)
        return err(CUDNN_STATUS_BAD_PARAM,
                   "%s: pointwise %s needs CUDNN_ATTR_OPERATION_POINTWISE_BDESC", fn, mn);
    if (mn && select && !t)
        return err(CUDNN_STATUS_BAD_PARAM,
                   "%s: pointwise BINARY_SELECT needs CUDNN_ATTR_OPERATION_POINTWISE_TDESC", fn);
    if (mn && ((unary && (b || t)) || (!unary && !select && t)))
        return err(CUDNN_STATUS_BAD_PARAM, "%s: pointwise %s takes %s", fn, mn,
                   unary ? "X only" : "X and B only");
    if (b) {
        op.in[1] = b->tensor;
        op.has[1] = true;
        op.in_name[1] = "B";
    }
    if (t) {
        op.in[2] = t->tensor;
        op.has[2] = true;
        op.in_name[2] = "T";
    }
    if (op.mode == CUDNN_POINTWISE_GEN_INDEX) {
        if (op.in[0].nd != op.out.nd ||
            !std::equal(op.out.dim, op.out.dim + op.out.nd, op.in[0].dim))
            return err(CUDNN_STATUS_BAD_PARAM, "%s: GEN_INDEX: Y (%s) must have X's shape (%s)", fn,
                       op.out.text().c_str(), op.in[0].text().c_str());
        if (op.axis < 0 || op.axis >= op.out.nd)
            return err(CUDNN_STATUS_BAD_PARAM, "%s: GEN_INDEX: axis %lld is not a dimension of Y",
                       fn, (long long)op.axis);
        s.op = op;
        return CUDNN_STATUS_SUCCESS;
    }
    for (int i = 0; i < 3; i++)
        if (op.has[i] && !broadcasts(op.in[i], op.out))
            return err(CUDNN_STATUS_BAD_PARAM,
                       "%s: pointwise %s: %s (%s) does not broadcast to Y (%s): the same rank, "
                       "each dimension Y's or 1",
                       fn, mn ? mn : "", op.in_name[i], op.in[i].text().c_str(),
                       op.out.text().c_str());
    s.op = op;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_op_matmul(const char *fn, State &s) {
    const State *a = ref(s, CUDNN_ATTR_OPERATION_MATMUL_ADESC);
    const State *b = ref(s, CUDNN_ATTR_OPERATION_MATMUL_BDESC);
    const State *c = ref(s, CUDNN_ATTR_OPERATION_MATMUL_CDESC);
    const State *m = ref(s, CUDNN_ATTR_OPERATION_MATMUL_DESC);
    if (!a || !b || !c || !m)
        return missing(fn, s, "CUDNN_ATTR_OPERATION_MATMUL_ADESC, _BDESC, _CDESC and _DESC");
    const Tensor &A = a->tensor, &B = b->tensor, &C = c->tensor;
    const int nd = C.nd;
    if (A.nd != nd || B.nd != nd || nd < 2)
        return err(CUDNN_STATUS_BAD_PARAM,
                   "%s: matmul: A, B and C need the same rank, at least 2 (%d, %d, %d)", fn, A.nd,
                   B.nd, C.nd);
    const int64_t M = C.dim[nd - 2], N = C.dim[nd - 1], K = A.dim[nd - 1];
    if (A.dim[nd - 2] != M || B.dim[nd - 1] != N || B.dim[nd - 2] != K)
        return err(CUDNN_STATUS_BAD_PARAM,
                   "%s: matmul: A (%s) times B (%s) is not C (%s): A [.., m, k], B [.., k, n], "
                   "C [.., m, n]",
                   fn, A.text().c_str(), B.text().c_str(), C.text().c_str());
    for (int i = 0; i < nd - 2; i++)
        if ((A.dim[i] != C.dim[i] && A.dim[i] != 1) || (B.dim[i] != C.dim[i] && B.dim[i] != 1))
            return err(CUDNN_STATUS_BAD_PARAM,
                       "%s: matmul: batch dimension %d of A (%lld) or B (%lld) is neither C's "
                       "(%lld) nor 1",
                       fn, i, (long long)A.dim[i], (long long)B.dim[i], (long long)C.dim[i]);
    Op op;
    op.kind = Kind::Matmul;
    op.prec = m->prec;
    op.text = "a matmul";
    op.in[0] = A;
    op.in[1] = B;
    op.has[0] = op.has[1] = true;
    op.in_name[0] = "A";
    op.in_name[1] = "B";
    op.out = C;
    op.out_name = "C";
    s.op = op;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_op_reduction(const char *fn, State &s) {
    const State *x = ref(s, CUDNN_ATTR_OPERATION_REDUCTION_XDESC);
    const State *y = ref(s, CUDNN_ATTR_OPERATION_REDUCTION_YDESC);
    const State *r = ref(s, CUDNN_ATTR_OPERATION_REDUCTION_DESC);
    if (!x || !y || !r)
        return missing(fn, s, "CUDNN_ATTR_OPERATION_REDUCTION_XDESC, _YDESC and _DESC");
    if (!broadcasts(y->tensor, x->tensor))
        return err(CUDNN_STATUS_BAD_PARAM,
                   "%s: reduction: Y (%s) must have X's rank and, in each dimension, X's size "
                   "or 1 (X: %s)",
                   fn, y->tensor.text().c_str(), x->tensor.text().c_str());
    Op op;
    op.kind = Kind::Reduction;
    op.prec = r->prec;
    op.red = r->red;
    op.text = "a reduction";
    op.in[0] = x->tensor;
    op.has[0] = true;
    op.in_name[0] = "X";
    op.out = y->tensor;
    op.out_name = "Y";
    s.op = op;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_op_reshape(const char *fn, State &s) {
    const State *x = ref(s, CUDNN_ATTR_OPERATION_RESHAPE_XDESC);
    const State *y = ref(s, CUDNN_ATTR_OPERATION_RESHAPE_YDESC);
    if (!x || !y)
        return missing(fn, s, "CUDNN_ATTR_OPERATION_RESHAPE_XDESC and _YDESC");
    const Tensor &X = x->tensor, &Y = y->tensor;
    if (X.elems() != Y.elems())
        return err(CUDNN_STATUS_BAD_PARAM, "%s: reshape: X (%s) and Y (%s) differ in element count",
                   fn, X.text().c_str(), Y.text().c_str());
    if (Y.extent() > X.extent())
        return err(CUDNN_STATUS_BAD_PARAM,
                   "%s: reshape: Y (%s) reaches offset %lld, past X's storage (%s, %lld elements)",
                   fn, Y.text().c_str(), (long long)(Y.extent() - 1), X.text().c_str(),
                   (long long)X.extent());
    Op op;
    op.kind = Kind::Reshape;
    op.text = "a reshape";
    op.in[0] = X;
    op.has[0] = true;
    op.in_name[0] = "X";
    op.out = Y;
    op.out_name = "Y";
    s.op = op;
    return CUDNN_STATUS_SUCCESS;
}

/* What the emulation does not compute in op (NULL: it does). */
const char *not_emulated(const Op &op, char *buf, size_t n) {
    auto stored = [&](const Tensor &t) -> const char * {
        if (!elem_size(t.type)) {
            std::snprintf(buf, n,
                          "tensor %s: data type %s (%d) is not emulated (FLOAT, BFLOAT16, "
                          "INT32 and BOOLEAN are)",
                          t.text().c_str(), dtype_name(t.type), (int)t.type);
            return buf;
        }
        if (t.type == CUDNN_DATA_BOOLEAN && !t.is_virtual) {
            std::snprintf(buf, n, "tensor %s: booleans are emulated in virtual tensors only",
                          t.text().c_str());
            return buf;
        }
        return nullptr;
    };
    for (int i = 0; i < 3; i++)
        if (op.has[i])
            if (const char *w = stored(op.in[i]))
                return w;
    if (const char *w = stored(op.out))
        return w;
    switch (op.kind) {
    case Kind::Pointwise: {
        const char *mn = mode_name(op.mode);
        if (!mn) {
            std::snprintf(buf, n,
                          "pointwise mode %d is not emulated (ADD, SUB, MUL, DIV, EXP, "
                          "LOG, IDENTITY, CMP_*, GEN_INDEX, BINARY_SELECT are)",
                          (int)op.mode);
            return buf;
        }
        const bool cmp = op.mode >= CUDNN_POINTWISE_CMP_EQ && op.mode <= CUDNN_POINTWISE_CMP_LE;
        const bool pass = op.mode == CUDNN_POINTWISE_IDENTITY ||
                          op.mode == CUDNN_POINTWISE_GEN_INDEX ||
                          op.mode == CUDNN_POINTWISE_BINARY_SELECT;
        const bool intarith = op.mode == CUDNN_POINTWISE_ADD || op.mode == CUDNN_POINTWISE_SUB ||
                              op.mode == CUDNN_POINTWISE_MUL;
        const bool ok = op.prec == CUDNN_DATA_FLOAT ||
                        (op.prec == CUDNN_DATA_INT32 && (cmp || pass || intarith)) ||
                        (op.prec == CUDNN_DATA_BOOLEAN && (cmp || pass));
        if (!ok) {
            std::snprintf(buf, n, "pointwise %s with math precision %s (%d) is not emulated", mn,
                          dtype_name(op.prec), (int)op.prec);
            return buf;
        }
        return nullptr;
    }
    case Kind::Matmul:
        if (op.prec != CUDNN_DATA_FLOAT) {
            std::snprintf(buf, n, "a matmul with compute type %s (%d) is not emulated (FLOAT is)",
                          dtype_name(op.prec), (int)op.prec);
            return buf;
        }
        return nullptr;
    case Kind::Reduction:
        if (op.prec != CUDNN_DATA_FLOAT) {
            std::snprintf(buf, n,
                          "a reduction with compute type %s (%d) is not emulated (FLOAT is)",
                          dtype_name(op.prec), (int)op.prec);
            return buf;
        }
        if (op.red != CUDNN_REDUCE_TENSOR_ADD && op.red != CUDNN_REDUCE_TENSOR_MAX) {
            std::snprintf(buf, n, "reduction operator %d is not emulated (ADD and MAX are)",
                          (int)op.red);
            return buf;
        }
        return nullptr;
    case Kind::Reshape:
        return nullptr;
    }
    return nullptr;
}

bool sixteen_bit(cudnnDataType_t t) {
    return t == CUDNN_DATA_BFLOAT16 || t == CUDNN_DATA_HALF;
}

/* Why the fused engines do not take graph g ("" if they do): see the top. */
std::string engines_refuse(const Graph &g) {
    char buf[512];
    for (const Op &op : g.ops) {
        if (op.kind != Kind::Matmul)
            continue;
        for (int i = 0; i < 2; i++) {
            const Tensor &t = op.in[i], &o = op.in[1 - i];
            if (sixteen_bit(t.type) ||
                (t.type == CUDNN_DATA_FLOAT && t.is_virtual && sixteen_bit(o.type)))
                continue;
            std::snprintf(buf, sizeof buf,
                          "matmul input %s (%s) is %s: the fused engines take 16-bit matmul "
                          "inputs (BFLOAT16 or HALF; a FLOAT one only virtual, beside a 16-bit "
                          "one)",
                          op.in_name[i], t.text().c_str(), dtype_name(t.type));
            return buf;
        }
        const Tensor *operands[3] = {&op.in[0], &op.in[1], &op.out};
        for (const Tensor *t : operands) {
            const int in = t->innermost();
            if (t->is_virtual || in < 0)
                continue;
            if (t->dim[in] % 8 || t->dim[in] > 256) {
                std::snprintf(buf, sizeof buf,
                              "matmul operand %s: its head dimension (the innermost, %lld) is "
                              "not a multiple of 8 up to 256",
                              t->text().c_str(), (long long)t->dim[in]);
                return buf;
            }
        }
    }
    for (const auto &kv : g.tensors) {
        const Tensor &t = kv.second;
        const int in = t.innermost();
        if (t.is_virtual || t.by_value || in < 0 || t.stride[in] == 1)
            continue;
        std::snprintf(buf, sizeof buf,
                      "tensor %s: its innermost dimension has stride %lld; the fused engines "
                      "need 1",
                      t.text().c_str(), (long long)t.stride[in]);
        return buf;
    }
    return "";
}

cudnnStatus_t finalize_graph(const char *fn, State &s) {
    const Attr *h = find(s, CUDNN_ATTR_OPERATIONGRAPH_HANDLE),
               *ops = find(s, CUDNN_ATTR_OPERATIONGRAPH_OPS);
    if (!h)
        return missing(fn, s, "CUDNN_ATTR_OPERATIONGRAPH_HANDLE");
    if (!ops)
        return missing(fn, s, "CUDNN_ATTR_OPERATIONGRAPH_OPS");
    if (const Attr *dyn = find(s, CUDNN_ATTR_OPERATIONGRAPH_IS_DYNAMIC_SHAPE_ENABLED))
        if (value<bool>(*dyn))
            return err(CUDNN_STATUS_NOT_SUPPORTED, "%s: dynamic shapes are not emulated", fn);
    auto g = std::make_shared<Graph>();
    g->handle = value<cudnnHandle_t>(*h);
    const size_t n = ops->refs.size();
    std::vector<Op> given;
    for (const Ref &r : ops->refs)
        given.push_back(r->op);
    /* one unique id, one tensor */
    char buf[512];
    std::map<int64_t, int> producer;
    for (size_t i = 0; i < n; i++) {
        const Op &op = given[i];
        if (const char *why = not_emulated(op, buf, sizeof buf))
            return err(CUDNN_STATUS_NOT_SUPPORTED, "%s: operation %zu (%s): %s", fn, i, op.text,
                       why);
        const Tensor *ts[4] = {op.has[0] ? &op.in[0] : nullptr, op.has[1] ? &op.in[1] : nullptr,
                               op.has[2] ? &op.in[2] : nullptr, &op.out};
        for (const Tensor *t : ts) {
            if (!t)
                continue;
            auto it = g->tensors.find(t->uid);
            if (it == g->tensors.end())
                g->tensors[t->uid] = *t;
            else if (!it->second.same(*t))
                return err(CUDNN_STATUS_BAD_PARAM,
                           "%s: unique id %lld names two different tensors: %s and %s", fn,
                           (long long)t->uid, it->second.text().c_str(), t->text().c_str());
        }
        if (op.out.by_value)
            return err(CUDNN_STATUS_BAD_PARAM,
                       "%s: operation %zu (%s) writes the by-value tensor %s", fn, i, op.text,
                       op.out.text().c_str());
        if (!op.out.one_to_one())
            return err(CUDNN_STATUS_BAD_PARAM,
                       "%s: operation %zu (%s): its output %s has strides that map two elements "
                       "to one offset",
                       fn, i, op.text, op.out.text().c_str());
        if (producer.count(op.out.uid))
            return err(CUDNN_STATUS_BAD_PARAM,
                       "%s: tensor %s is the output of operations %d and %zu", fn,
                       op.out.text().c_str(), producer[op.out.uid], i);
        producer[op.out.uid] = (int)i;
    }
    /* every virtual tensor read is produced; order by the data (Kahn, the caller's order among
     * the ready operations) */
    std::vector<std::vector<int>> readers(n);
    std::vector<int> waiting(n, 0);
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 3; k++) {
            if (!given[i].has[k])
                continue;
            const Tensor &t = given[i].in[k];
            auto p = producer.find(t.uid);
            if (p == producer.end()) {
                if (t.is_virtual)
                    return err(CUDNN_STATUS_BAD_PARAM,
                               "%s: operation %zu (%s) reads the virtual tensor %s, which no "
                               "operation of the graph produces",
                               fn, i, given[i].text, t.text().c_str());
                continue;
            }
            readers[p->second].push_back((int)i);
            waiting[i]++;
        }
    std::vector<bool> done(n, false);
    for (size_t step = 0; step < n; step++) {
        size_t next = n;
        for (size_t i = 0; i < n && next == n; i++)
            if (!done[i] && waiting[i] == 0)
                next = i;
        if (next == n)
            return err(CUDNN_STATUS_BAD_PARAM,
                       "%s: the operations form a cycle (an operation reads, through others, "
                       "its own output)",
                       fn);
        done[next] = true;
        for (int r : readers[next])
            waiting[r]--;
        g->ops.push_back(given[next]);
    }
    /* what the emulated engines assume of the layouts */
    for (const auto &kv : g->tensors) {
        const Tensor &t = kv.second;
        if (!t.is_virtual && !t.by_value && t.align < kMinAlign)
            return err(CUDNN_STATUS_NOT_SUPPORTED,
                       "%s: tensor %s claims a %lld-byte alignment; the emulated engines need "
                       "%lld",
                       fn, t.text().c_str(), (long long)t.align, (long long)kMinAlign);
    }
    for (const Op &op : g->ops) {
        if (op.kind != Kind::Matmul)
            continue;
        const Tensor *operands[3] = {&op.in[0], &op.in[1], &op.out};
        for (const Tensor *t : operands) {
            const int nd = t->nd;
            const bool row = t->stride[nd - 1] == 1 || t->dim[nd - 1] == 1;
            const bool col = t->stride[nd - 2] == 1 || t->dim[nd - 2] == 1;
            if (!row && !col)
                return err(CUDNN_STATUS_NOT_SUPPORTED,
                           "%s: matmul operand %s has neither of its last two dimensions of "
                           "stride 1 (neither row- nor column-major)",
                           fn, t->text().c_str());
        }
    }
    g->unsupported = engines_refuse(*g);
    s.graph = g;
    return CUDNN_STATUS_SUCCESS;
}

/* Why the engines do not take graph g (NULL: they do); `why` holds the text. */
const char *engine_refuses(const Graph &g, std::string &why) {
    if (env_on("MGT_EMU_CUDNN_NO_ENGINE")) {
        why = "no engine: MGT_EMU_CUDNN_NO_ENGINE is set";
        return why.c_str();
    }
    if (!g.unsupported.empty()) {
        why = g.unsupported;
        return why.c_str();
    }
    return nullptr;
}

cudnnStatus_t finalize_heuristics(const char *fn, State &s) {
    const Attr *ga = find(s, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH);
    if (!ga || ga->refs.empty())
        return missing(fn, s, "CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH");
    if (!find(s, CUDNN_ATTR_ENGINEHEUR_MODE))
        return missing(fn, s, "CUDNN_ATTR_ENGINEHEUR_MODE");
    s.graph_state = ga->refs[0];
    s.graph = s.graph_state->graph;
    std::string why;
    s.engines.clear();
    if (engine_refuses(*s.graph, why))
        emu::cudnn_error(CUDNN_STATUS_SUCCESS,
                         "%s: the heuristics found no engine for the graph: %s", fn, why.c_str());
    else
        for (int64_t e = 0; e < kEngines; e++)
            s.engines.push_back(e);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_engine(const char *fn, State &s) {
    const State *g = ref(s, CUDNN_ATTR_ENGINE_OPERATION_GRAPH);
    const Attr *ix = find(s, CUDNN_ATTR_ENGINE_GLOBAL_INDEX);
    if (!g)
        return missing(fn, s, "CUDNN_ATTR_ENGINE_OPERATION_GRAPH");
    if (!ix)
        return missing(fn, s, "CUDNN_ATTR_ENGINE_GLOBAL_INDEX");
    const int64_t e = value<int64_t>(*ix);
    if (e < 0 || e >= kEngines)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: engine global index %lld is not below %lld", fn,
                   (long long)e, (long long)kEngines);
    std::string why;
    if (engine_refuses(*g->graph, why))
        return err(CUDNN_STATUS_NOT_SUPPORTED, "%s: engine %lld does not take the graph: %s", fn,
                   (long long)e, why.c_str());
    s.graph = g->graph;
    s.engine = e;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_config(const char *fn, State &s) {
    const State *e = ref(s, CUDNN_ATTR_ENGINECFG_ENGINE);
    if (!e)
        return missing(fn, s, "CUDNN_ATTR_ENGINECFG_ENGINE");
    s.graph = e->graph;
    s.engine = e->engine;
    s.workspace = s.graph->workspace(s.engine);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_plan(const char *fn, State &s) {
    const State *c = ref(s, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG);
    if (!find(s, CUDNN_ATTR_EXECUTION_PLAN_HANDLE))
        return missing(fn, s, "CUDNN_ATTR_EXECUTION_PLAN_HANDLE");
    if (!c)
        return missing(fn, s, "CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG");
    if (c->engine == 0 && stale_all())
        return err(CUDNN_STATUS_NOT_SUPPORTED,
                   "%s: engine 0 does not build a plan for the graph (the heuristics ranked it "
                   "first: a stale entry, see MGT_EMU_CUDNN_STALE)",
                   fn);
    s.graph = c->graph;
    s.engine = c->engine;
    s.workspace = c->workspace;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_pack(const char *fn, State &s) {
    const Attr *u = find(s, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
    const Attr *p = find(s, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
    const int64_t nu = u ? u->count : 0, np = p ? p->count : 0;
    if (nu != np)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: %lld unique ids but %lld data pointers", fn,
                   (long long)nu, (long long)np);
    s.uids.clear();
    s.ptrs.clear();
    for (int64_t i = 0; i < nu; i++) {
        const int64_t id = value<int64_t>(*u, i);
        if (std::find(s.uids.begin(), s.uids.end(), id) != s.uids.end())
            return err(CUDNN_STATUS_BAD_PARAM, "%s: unique id %lld appears twice", fn,
                       (long long)id);
        s.uids.push_back(id);
        s.ptrs.push_back(value<void *>(*p, i));
    }
    const Attr *w = find(s, CUDNN_ATTR_VARIANT_PACK_WORKSPACE);
    s.ws = w ? value<void *>(*w) : nullptr;
    return CUDNN_STATUS_SUCCESS;
}

/* ---- execution: the interpreter ---- */

/* Where a tensor's elements are: device memory, a by-value scalar's copy, or a virtual
 * tensor's buffer; offsets in elements. */
struct Store {
    unsigned char *p = nullptr;
    cudnnDataType_t type = CUDNN_DATA_FLOAT;

    double load(int64_t off) const {
        switch (type) {
        case CUDNN_DATA_FLOAT: {
            float f;
            std::memcpy(&f, p + off * 4, 4);
            return f;
        }
        case CUDNN_DATA_BFLOAT16: {
            uint16_t b;
            std::memcpy(&b, p + off * 2, 2);
            return emu::bf16_to_float(b);
        }
        case CUDNN_DATA_INT32: {
            int32_t i;
            std::memcpy(&i, p + off * 4, 4);
            return i;
        }
        default:
            return p[off] ? 1.0 : 0.0;
        }
    }
    /* v rounded once to the type */
    void store(int64_t off, double v) const {
        switch (type) {
        case CUDNN_DATA_FLOAT: {
            const float f = (float)v;
            std::memcpy(p + off * 4, &f, 4);
            break;
        }
        case CUDNN_DATA_BFLOAT16: {
            const uint16_t b = emu::bf16_from_double(v);
            std::memcpy(p + off * 2, &b, 2);
            break;
        }
        case CUDNN_DATA_INT32: {
            const double c =
                std::isnan(v) ? 0.0 : std::max(-2147483648.0, std::min(2147483647.0, v));
            const int32_t i = (int32_t)c;
            std::memcpy(p + off * 4, &i, 4);
            break;
        }
        default:
            p[off] = v != 0.0;
        }
    }
};

/* f(idx, off) for every index of dims (row-major), off[k] advancing by st[k] per dimension. */
template <int K, typename F>
void walk(int nd, const int64_t *dim, int64_t (&st)[K][kMaxDims], F f) {
    int64_t idx[kMaxDims] = {}, off[K] = {};
    int64_t total = 1;
    for (int d = 0; d < nd; d++)
        total *= dim[d];
    for (int64_t e = 0; e < total; e++) {
        f((const int64_t *)idx, (const int64_t *)off);
        for (int d = nd - 1; d >= 0; d--) {
            idx[d]++;
            for (int k = 0; k < K; k++)
                off[k] += st[k][d];
            if (idx[d] < dim[d])
                break;
            for (int k = 0; k < K; k++)
                off[k] -= st[k][d] * dim[d];
            idx[d] = 0;
        }
    }
}

/* in's strides as seen from out's dimensions: 0 where in is broadcast. */
void bstrides(const Tensor &in, const Tensor &out, int64_t *st) {
    for (int d = 0; d < out.nd; d++)
        st[d] = in.dim[d] == 1 && out.dim[d] != 1 ? 0 : in.stride[d];
}

/* A comparison mode's result (1 or 0) in the values' own type. */
template <class T> double compare(cudnnPointwiseMode_t m, T a, T b) {
    switch (m) {
    case CUDNN_POINTWISE_CMP_EQ:
        return a == b;
    case CUDNN_POINTWISE_CMP_NEQ:
        return a != b;
    case CUDNN_POINTWISE_CMP_GT:
        return a > b;
    case CUDNN_POINTWISE_CMP_GE:
        return a >= b;
    case CUDNN_POINTWISE_CMP_LT:
        return a < b;
    default: /* CMP_LE */
        return a <= b;
    }
}

double pointwise(cudnnPointwiseMode_t m, cudnnDataType_t prec, double x, double b, double t,
                 double index) {
    if (prec == CUDNN_DATA_FLOAT) {
        const float fx = (float)x, fb = (float)b;
        switch (m) {
        case CUDNN_POINTWISE_ADD:
            return fx + fb;
        case CUDNN_POINTWISE_SUB:
            return fx - fb;
        case CUDNN_POINTWISE_MUL:
            return fx * fb;
        case CUDNN_POINTWISE_DIV:
            return fx / fb;
        case CUDNN_POINTWISE_EXP:
            return std::exp(fx);
        case CUDNN_POINTWISE_LOG:
            return std::log(fx);
        case CUDNN_POINTWISE_IDENTITY:
            return fx;
        case CUDNN_POINTWISE_CMP_EQ:
        case CUDNN_POINTWISE_CMP_NEQ:
        case CUDNN_POINTWISE_CMP_GT:
        case CUDNN_POINTWISE_CMP_GE:
        case CUDNN_POINTWISE_CMP_LT:
        case CUDNN_POINTWISE_CMP_LE:
            return compare(m, fx, fb);
        case CUDNN_POINTWISE_GEN_INDEX:
            return (float)index;
        case CUDNN_POINTWISE_BINARY_SELECT:
            return t != 0.0 ? fx : fb;
        default:
            return NAN;
        }
    }
    if (prec == CUDNN_DATA_INT32) {
        auto to_int = [](double v) { /* as a saturating conversion does; NaN to 0 */
                                     return std::isnan(v)
                                                ? 0
                                                : (int64_t)std::max(-9.0e18, std::min(9.0e18, v));
        };
        const int64_t ix = to_int(x), ib = to_int(b);
        auto wrap = [](int64_t v) { return (double)(int32_t)(uint32_t)(uint64_t)v; };
        switch (m) {
        case CUDNN_POINTWISE_ADD:
            return wrap(ix + ib);
        case CUDNN_POINTWISE_SUB:
            return wrap(ix - ib);
        case CUDNN_POINTWISE_MUL:
            return wrap(ix * ib);
        case CUDNN_POINTWISE_IDENTITY:
            return wrap(ix);
        case CUDNN_POINTWISE_CMP_EQ:
        case CUDNN_POINTWISE_CMP_NEQ:
        case CUDNN_POINTWISE_CMP_GT:
        case CUDNN_POINTWISE_CMP_GE:
        case CUDNN_POINTWISE_CMP_LT:
        case CUDNN_POINTWISE_CMP_LE:
            return compare(m, ix, ib);
        case CUDNN_POINTWISE_GEN_INDEX:
            return index;
        case CUDNN_POINTWISE_BINARY_SELECT:
            return t != 0.0 ? wrap(ix) : wrap(ib);
        default:
            return NAN;
        }
    }
    /* BOOLEAN: the values as they are */
    switch (m) {
    case CUDNN_POINTWISE_IDENTITY:
        return x != 0.0;
    case CUDNN_POINTWISE_CMP_EQ:
    case CUDNN_POINTWISE_CMP_NEQ:
    case CUDNN_POINTWISE_CMP_GT:
    case CUDNN_POINTWISE_CMP_GE:
    case CUDNN_POINTWISE_CMP_LT:
    case CUDNN_POINTWISE_CMP_LE:
        return compare(m, x, b);
    case CUDNN_POINTWISE_GEN_INDEX:
        return index;
    case CUDNN_POINTWISE_BINARY_SELECT:
        return t != 0.0 ? x : b;
    default:
        return NAN;
    }
}

struct Run {
    std::map<int64_t, Store> st;
    std::vector<std::unique_ptr<unsigned char[]>> bufs;

    /* The storage of an operation's output: its memory, or a fresh buffer (NaN bytes). */
    Store out(const Tensor &t) {
        auto it = st.find(t.uid);
        if (it != st.end())
            return it->second;
        const size_t bytes = (size_t)t.extent() * elem_size(t.type);
        bufs.emplace_back(new unsigned char[bytes]);
        std::memset(bufs.back().get(), 0xff, bytes);
        Store s{bufs.back().get(), t.type};
        st[t.uid] = s;
        return s;
    }

    void run_pointwise(const Op &op) {
        const Tensor &Y = op.out;
        const Store y = out(Y);
        int64_t sts[4][kMaxDims] = {};
        std::copy(Y.stride, Y.stride + Y.nd, sts[0]);
        Store in[3];
        const bool gen = op.mode == CUDNN_POINTWISE_GEN_INDEX;
        for (int k = 0; k < 3; k++)
            if (op.has[k] && !gen) {
                in[k] = st.at(op.in[k].uid);
                bstrides(op.in[k], Y, sts[k + 1]);
            }
        const int axis = (int)op.axis;
        const bool hb = op.has[1], ht = op.has[2];
        walk<4>(Y.nd, Y.dim, sts, [&](const int64_t *idx, const int64_t *off) {
            const double x = gen ? 0.0 : in[0].load(off[1]);
            const double b = hb ? in[1].load(off[2]) : 0.0, t = ht ? in[2].load(off[3]) : 0.0;
            y.store(off[0], pointwise(op.mode, op.prec, x, b, t, gen ? (double)idx[axis] : 0.0));
        });
    }

    void run_matmul(const Op &op) {
        const Tensor &A = op.in[0], &B = op.in[1], &C = op.out;
        const Store a = st.at(A.uid), b = st.at(B.uid), c = out(C);
        const int nd = C.nd;
        const int64_t M = C.dim[nd - 2], N = C.dim[nd - 1], K = A.dim[nd - 1];
        /* a float virtual input beside a 16-bit one reaches the tensor cores as bfloat16 */
        const bool ra = A.type == CUDNN_DATA_FLOAT && sixteen_bit(B.type);
        const bool rb = B.type == CUDNN_DATA_FLOAT && sixteen_bit(A.type);
        auto rd = [](double v, bool r) {
            return r ? (double)emu::bf16_to_float(emu::bf16_from_double(v)) : v;
        };
        int64_t sts[3][kMaxDims] = {};
        bstrides(A, C, sts[0]);
        bstrides(B, C, sts[1]);
        std::copy(C.stride, C.stride + nd, sts[2]);
        std::vector<double> am((size_t)(M * K)), bm((size_t)(K * N)), acc((size_t)N);
        walk<3>(nd - 2, C.dim, sts, [&](const int64_t *, const int64_t *off) {
            for (int64_t i = 0; i < M; i++)
                for (int64_t p = 0; p < K; p++)
                    am[(size_t)(i * K + p)] =
                        rd(a.load(off[0] + i * A.stride[nd - 2] + p * A.stride[nd - 1]), ra);
            for (int64_t p = 0; p < K; p++)
                for (int64_t j = 0; j < N; j++)
                    bm[(size_t)(p * N + j)] =
                        rd(b.load(off[1] + p * B.stride[nd - 2] + j * B.stride[nd - 1]), rb);
            for (int64_t i = 0; i < M; i++) {
                std::fill(acc.begin(), acc.end(), 0.0);
                for (int64_t p = 0; p < K; p++) {
                    const double av = am[(size_t)(i * K + p)];
                    const double *bp = &bm[(size_t)(p * N)];
                    for (int64_t j = 0; j < N; j++)
                        acc[(size_t)j] += av * bp[j];
                }
                for (int64_t j = 0; j < N; j++)
                    c.store(off[2] + i * C.stride[nd - 2] + j * C.stride[nd - 1], acc[(size_t)j]);
            }
        });
    }

    void run_reduction(const Op &op) {
        const Tensor &X = op.in[0], &Y = op.out;
        const Store x = st.at(X.uid), y = out(Y);
        const bool max = op.red == CUDNN_REDUCE_TENSOR_MAX;
        std::vector<double> acc((size_t)Y.elems(), max ? -INFINITY : 0.0);
        /* Y's row-major index of each element of X */
        int64_t lin[kMaxDims] = {}, m = 1;
        for (int d = Y.nd - 1; d >= 0; d--) {
            lin[d] = Y.dim[d] == 1 ? 0 : m;
            m *= Y.dim[d];
        }
        int64_t sx[2][kMaxDims] = {};
        std::copy(X.stride, X.stride + X.nd, sx[0]);
        std::copy(lin, lin + X.nd, sx[1]);
        walk<2>(X.nd, X.dim, sx, [&](const int64_t *, const int64_t *off) {
            const double v = x.load(off[0]);
            double &r = acc[(size_t)off[1]];
            if (!max)
                r += v;
            else if (std::isnan(v) || v > r)
                r = std::isnan(r) ? r : v;
        });
        int64_t sy[2][kMaxDims] = {};
        std::copy(Y.stride, Y.stride + Y.nd, sy[0]);
        m = 1;
        for (int d = Y.nd - 1; d >= 0; d--) {
            sy[1][d] = m;
            m *= Y.dim[d];
        }
        walk<2>(Y.nd, Y.dim, sy,
                [&](const int64_t *, const int64_t *off) { y.store(off[0], acc[(size_t)off[1]]); });
    }

    void run_reshape(const Op &op) {
        const Tensor &Y = op.out;
        const Store x = st.at(op.in[0].uid), y = out(Y);
        int64_t sy[1][kMaxDims] = {};
        std::copy(Y.stride, Y.stride + Y.nd, sy[0]);
        walk<1>(Y.nd, Y.dim, sy,
                [&](const int64_t *, const int64_t *off) { y.store(off[0], x.load(off[0])); });
    }

    void run(const Graph &g) {
        for (const Op &op : g.ops) {
            switch (op.kind) {
            case Kind::Pointwise:
                run_pointwise(op);
                break;
            case Kind::Matmul:
                run_matmul(op);
                break;
            case Kind::Reduction:
                run_reduction(op);
                break;
            case Kind::Reshape:
                run_reshape(op);
                break;
            }
        }
    }
};

bool overlap(const void *a, size_t na, const void *b, size_t nb) {
    const uintptr_t pa = (uintptr_t)a, pb = (uintptr_t)b;
    return na && nb && pa < pb + nb && pb < pa + na;
}

/* ---- the calls' common checks ---- */

/* A live descriptor of a type; `what` names it in messages. NULL or another type is BAD_PARAM. */
cudnnStatus_t typed(const char *fn, cudnnBackendDescriptor_t d, cudnnBackendDescriptorType_t t,
                    const char *what, Desc **out) {
    if (!d)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: NULL %s", fn, what);
    Desc *x = desc_of(d, fn, what);
    if (x->st->type != t)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: %s is a %s, not a %s", fn, what,
                   type_name(x->st->type), type_name(t));
    *out = x;
    return CUDNN_STATUS_SUCCESS;
}

/* The states an array of descriptor handles names, checked for a set attribute of spec sp. */
cudnnStatus_t refs_of(const char *fn, const Spec &sp, int64_t n, const void *arr,
                      std::vector<Ref> &out) {
    const cudnnBackendDescriptor_t *d = (const cudnnBackendDescriptor_t *)arr;
    for (int64_t i = 0; i < n; i++) {
        if (!d[i])
            return err(CUDNN_STATUS_BAD_PARAM, "%s: %s: element %lld is NULL", fn, sp.text,
                       (long long)i);
        Desc *x = desc_of(d[i], fn, sp.text);
        const State &s = *x->st;
        const bool ok = sp.ref == kAnyOp ? is_operation(s.type) : (int)s.type == sp.ref;
        if (!ok)
            return err(CUDNN_STATUS_BAD_PARAM, "%s: %s: element %lld is a %s, not a%s %s", fn,
                       sp.text, (long long)i, type_name(s.type), sp.ref == kAnyOp ? "n" : "",
                       sp.ref == kAnyOp ? "operation descriptor"
                                        : type_name((cudnnBackendDescriptorType_t)sp.ref));
        if (!s.finalized)
            return err(CUDNN_STATUS_BAD_PARAM, "%s: %s: element %lld (a %s) is not finalized", fn,
                       sp.text, (long long)i, type_name(s.type));
        out.push_back(x->st);
    }
    return CUDNN_STATUS_SUCCESS;
}

/* Cheap checks of enumerated values at set time. */
cudnnStatus_t check_values(const char *fn, const Spec &sp, int64_t n, const void *arr) {
    for (int64_t i = 0; i < n; i++) {
        int v = 0;
        switch (sp.type) {
        case CUDNN_TYPE_DATA_TYPE:
            std::memcpy(&v, (const char *)arr + i * sizeof(cudnnDataType_t), sizeof v);
            if (v < (int)CUDNN_DATA_FLOAT || v > (int)CUDNN_DATA_COMPLEX_FP64)
                return err(CUDNN_STATUS_BAD_PARAM, "%s: %s: data type %d is not an enumerant", fn,
                           sp.text, v);
            break;
        case CUDNN_TYPE_HEUR_MODE:
            std::memcpy(&v, (const char *)arr + i * sizeof(cudnnBackendHeurMode_t), sizeof v);
            if (v < 0 || v >= (int)CUDNN_HEUR_MODES_COUNT)
                return err(CUDNN_STATUS_BAD_PARAM,
                           "%s: %s: heuristics mode %d is not an "
                           "enumerant",
                           fn, sp.text, v);
            break;
        case CUDNN_TYPE_REDUCTION_OPERATOR_TYPE:
            std::memcpy(&v, (const char *)arr + i * sizeof(cudnnReduceTensorOp_t), sizeof v);
            if (v < (int)CUDNN_REDUCE_TENSOR_ADD || v > (int)CUDNN_REDUCE_TENSOR_MUL_NO_ZEROS)
                return err(CUDNN_STATUS_BAD_PARAM,
                           "%s: %s: reduction operator %d is not an "
                           "enumerant",
                           fn, sp.text, v);
            break;
        case CUDNN_TYPE_HANDLE: {
            cudnnHandle_t h;
            std::memcpy(&h, (const char *)arr + i * sizeof h, sizeof h);
            if (!h)
                return err(CUDNN_STATUS_BAD_PARAM, "%s: %s: NULL handle", fn, sp.text);
            (void)emu::cudnn_stream(h, fn); /* a handle that is not live ends the process */
            break;
        }
        default:
            break;
        }
    }
    return CUDNN_STATUS_SUCCESS;
}

/* A finalized ENGINE state for engine e of the graph whose descriptor state is g, and a
 * finalized ENGINECFG naming it: what the heuristics' results hold. */
std::shared_ptr<State> make_config(const Ref &g, int64_t e) {
    auto eng = std::make_shared<State>(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    Attr ga;
    ga.type = CUDNN_TYPE_BACKEND_DESCRIPTOR;
    ga.count = 1;
    ga.refs.push_back(g);
    eng->attrs[(int)CUDNN_ATTR_ENGINE_OPERATION_GRAPH] = ga;
    Attr ix;
    ix.type = CUDNN_TYPE_INT64;
    ix.count = 1;
    ix.bytes.resize(sizeof e);
    std::memcpy(ix.bytes.data(), &e, sizeof e);
    eng->attrs[(int)CUDNN_ATTR_ENGINE_GLOBAL_INDEX] = ix;
    eng->graph = g->graph;
    eng->engine = e;
    eng->finalized = true;
    auto cfg = std::make_shared<State>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    Attr ea;
    ea.type = CUDNN_TYPE_BACKEND_DESCRIPTOR;
    ea.count = 1;
    ea.refs.push_back(eng);
    cfg->attrs[(int)CUDNN_ATTR_ENGINECFG_ENGINE] = ea;
    cfg->graph = g->graph;
    cfg->engine = e;
    cfg->workspace = g->graph->workspace(e);
    cfg->finalized = true;
    return cfg;
}

/* *count = 1 and the one INT64 value v (an attribute the descriptor computes). */
cudnnStatus_t put_int64(const char *fn, const char *what, cudnnBackendAttributeType_t type,
                        int64_t req, int64_t *count, void *arr, int64_t v) {
    if (type != CUDNN_TYPE_INT64)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: %s is of type CUDNN_TYPE_INT64, not %d", fn, what,
                   (int)type);
    *count = 1;
    if (req >= 1)
        std::memcpy(arr, &v, sizeof v);
    return CUDNN_STATUS_SUCCESS;
}

} // namespace

extern "C" {

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t descriptorType,
                                           cudnnBackendDescriptor_t *descriptor) {
    const char *fn = "cudnnBackendCreateDescriptor";
    if (!descriptor)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: NULL descriptor pointer", fn);
    if (!emulated_type(descriptorType))
        return err(CUDNN_STATUS_NOT_SUPPORTED, "%s: descriptor type %d is not emulated", fn,
                   (int)descriptorType);
    Desc *d = new Desc{std::make_shared<State>(descriptorType)};
    live.add(d);
    *descriptor = d;
    return CUDNN_STATUS_SUCCESS;
}

/* NULL is allowed (nothing to do), as the classic API's destroy calls allow it. */
cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor) {
    if (!descriptor)
        return CUDNN_STATUS_SUCCESS;
    if (!live.remove(descriptor))
        emu::fail("cudnnBackendDestroyDescriptor: %p is not a live backend descriptor (destroyed "
                  "twice?)",
                  descriptor);
    delete (Desc *)descriptor;
    return CUDNN_STATUS_SUCCESS;
}

/* Deprecated: makes the descriptor new again (no attributes, not finalized), its type kept. */
cudnnStatus_t cudnnBackendInitialize(cudnnBackendDescriptor_t descriptor) {
    const char *fn = "cudnnBackendInitialize";
    if (!descriptor)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: NULL descriptor", fn);
    Desc *d = desc_of(descriptor, fn, "the descriptor");
    d->st = std::make_shared<State>(d->st->type);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor,
                                       cudnnBackendAttributeName_t attributeName,
                                       cudnnBackendAttributeType_t attributeType,
                                       int64_t elementCount, const void *arrayOfElements) {
    const char *fn = "cudnnBackendSetAttribute";
    if (!descriptor)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: NULL descriptor", fn);
    Desc *d = desc_of(descriptor, fn, "the descriptor");
    State &s = *d->st;
    if (s.finalized)
        return err(CUDNN_STATUS_NOT_INITIALIZED,
                   "%s: the %s is finalized: its attributes can no longer be set", fn,
                   type_name(s.type));
    if (computed(s.type, attributeName))
        return err(CUDNN_STATUS_BAD_PARAM,
                   "%s: attribute %d of a %s is computed: it can only be read", fn,
                   (int)attributeName, type_name(s.type));
    const Spec *sp = spec_of(s.type, attributeName);
    if (!sp)
        return unknown_attr(fn, s.type, (int)attributeName);
    if (attributeType != sp->type && attributeType != sp->alt)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: %s of a %s takes attribute type %d, not %d", fn,
                   sp->text, type_name(s.type), (int)sp->type, (int)attributeType);
    if (elementCount < sp->min || elementCount > sp->max)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: %s of a %s takes %lld to %lld elements, not %lld",
                   fn, sp->text, type_name(s.type), (long long)sp->min, (long long)sp->max,
                   (long long)elementCount);
    if (elementCount > 0 && !arrayOfElements)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: %s: NULL arrayOfElements", fn, sp->text);
    Attr a;
    a.type = attributeType;
    a.count = elementCount;
    if (sp->ref != kNotRef) {
        const cudnnStatus_t st = refs_of(fn, *sp, elementCount, arrayOfElements, a.refs);
        if (st != CUDNN_STATUS_SUCCESS)
            return st;
    } else {
        const cudnnStatus_t st = check_values(fn, *sp, elementCount, arrayOfElements);
        if (st != CUDNN_STATUS_SUCCESS)
            return st;
        const size_t bytes = (size_t)elementCount * attr_size(attributeType);
        a.bytes.resize(bytes);
        if (bytes)
            std::memcpy(a.bytes.data(), arrayOfElements, bytes);
    }
    s.attrs[(int)attributeName] = std::move(a);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor) {
    const char *fn = "cudnnBackendFinalize";
    if (!descriptor)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: NULL descriptor", fn);
    Desc *d = desc_of(descriptor, fn, "the descriptor");
    State &s = *d->st;
    if (s.finalized)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: the %s is already finalized", fn,
                   type_name(s.type));
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    switch (s.type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR:
        st = finalize_tensor(fn, s);
        break;
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR:
        st = finalize_pointwise(fn, s);
        break;
    case CUDNN_BACKEND_MATMUL_DESCRIPTOR:
        if (const Attr *c = find(s, CUDNN_ATTR_MATMUL_COMP_TYPE))
            s.prec = value<cudnnDataType_t>(*c);
        else
            st = missing(fn, s, "CUDNN_ATTR_MATMUL_COMP_TYPE");
        break;
    case CUDNN_BACKEND_REDUCTION_DESCRIPTOR: {
        const Attr *o = find(s, CUDNN_ATTR_REDUCTION_OPERATOR),
                   *c = find(s, CUDNN_ATTR_REDUCTION_COMP_TYPE);
        if (!o || !c) {
            st = missing(fn, s, "CUDNN_ATTR_REDUCTION_OPERATOR and _COMP_TYPE");
            break;
        }
        s.red = value<cudnnReduceTensorOp_t>(*o);
        s.prec = value<cudnnDataType_t>(*c);
        break;
    }
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR:
        st = finalize_op_pointwise(fn, s);
        break;
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR:
        st = finalize_op_matmul(fn, s);
        break;
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR:
        st = finalize_op_reduction(fn, s);
        break;
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR:
        st = finalize_op_reshape(fn, s);
        break;
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
        st = finalize_graph(fn, s);
        break;
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
        st = finalize_heuristics(fn, s);
        break;
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR:
        st = finalize_engine(fn, s);
        break;
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR:
        st = finalize_config(fn, s);
        break;
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR:
        st = finalize_plan(fn, s);
        break;
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR:
        st = finalize_pack(fn, s);
        break;
    default:
        st = err(CUDNN_STATUS_NOT_SUPPORTED, "%s: not emulated", fn);
        break;
    }
    if (st == CUDNN_STATUS_SUCCESS)
        s.finalized = true;
    return st;
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const descriptor,
                                       cudnnBackendAttributeName_t attributeName,
                                       cudnnBackendAttributeType_t attributeType,
                                       int64_t requestedElementCount, int64_t *elementCount,
                                       void *arrayOfElements) {
    const char *fn = "cudnnBackendGetAttribute";
    if (!descriptor)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: NULL descriptor", fn);
    Desc *d = desc_of(descriptor, fn, "the descriptor");
    const std::shared_ptr<State> keep = d->st; /* the results below may replace d's own state */
    const State &s = *keep;
    if (!elementCount)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: NULL elementCount", fn);
    if (requestedElementCount < 0 || (requestedElementCount > 0 && !arrayOfElements))
        return err(CUDNN_STATUS_BAD_PARAM, "%s: requestedElementCount %lld with arrayOfElements %p",
                   fn, (long long)requestedElementCount, arrayOfElements);
    if (!s.finalized)
        return err(CUDNN_STATUS_NOT_INITIALIZED, "%s: the %s is not finalized", fn,
                   type_name(s.type));
    const int64_t req = requestedElementCount;
    /* what the descriptor computes */
    if (s.type == CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR &&
        attributeName == CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT)
        return put_int64(fn, "CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT", attributeType, req,
                         elementCount, arrayOfElements, kEngines);
    if ((s.type == CUDNN_BACKEND_ENGINECFG_DESCRIPTOR &&
         attributeName == CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE) ||
        (s.type == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR &&
         attributeName == CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE))
        return put_int64(fn, "the workspace size", attributeType, req, elementCount,
                         arrayOfElements, (int64_t)s.workspace);
    if (s.type == CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR &&
        attributeName == CUDNN_ATTR_ENGINEHEUR_RESULTS) {
        if (attributeType != CUDNN_TYPE_BACKEND_DESCRIPTOR)
            return err(CUDNN_STATUS_BAD_PARAM,
                       "%s: CUDNN_ATTR_ENGINEHEUR_RESULTS is of type "
                       "CUDNN_TYPE_BACKEND_DESCRIPTOR, not %d",
                       fn, (int)attributeType);
        const int64_t n = (int64_t)s.engines.size(), k = std::min(req, n);
        cudnnBackendDescriptor_t *out = (cudnnBackendDescriptor_t *)arrayOfElements;
        std::vector<Desc *> cfg;
        for (int64_t i = 0; i < k; i++) {
            Desc *c = nullptr;
            const cudnnStatus_t st = typed(fn, out[i], CUDNN_BACKEND_ENGINECFG_DESCRIPTOR,
                                           "an element of CUDNN_ATTR_ENGINEHEUR_RESULTS", &c);
            if (st != CUDNN_STATUS_SUCCESS)
                return st;
            cfg.push_back(c);
        }
        for (int64_t i = 0; i < k; i++)
            cfg[(size_t)i]->st = make_config(s.graph_state, s.engines[(size_t)i]);
        *elementCount = n;
        return CUDNN_STATUS_SUCCESS;
    }
    /* what was set */
    const Spec *sp = spec_of(s.type, attributeName);
    if (!sp)
        return unknown_attr(fn, s.type, (int)attributeName);
    const Attr *a = find(s, attributeName);
    if (!a)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: %s of this %s was never set", fn, sp->text,
                   type_name(s.type));
    if (attributeType != a->type)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: %s holds attribute type %d, not %d", fn, sp->text,
                   (int)a->type, (int)attributeType);
    const int64_t k = std::min(req, a->count);
    if (!a->refs.empty()) {
        cudnnBackendDescriptor_t *out = (cudnnBackendDescriptor_t *)arrayOfElements;
        std::vector<Desc *> dst;
        for (int64_t i = 0; i < k; i++) {
            Desc *c = nullptr;
            const cudnnStatus_t st =
                typed(fn, out[i], a->refs[(size_t)i]->type, "an element of the array", &c);
            if (st != CUDNN_STATUS_SUCCESS)
                return st;
            dst.push_back(c);
        }
        for (int64_t i = 0; i < k; i++)
            dst[(size_t)i]->st = std::const_pointer_cast<State>(a->refs[(size_t)i]);
    } else if (k > 0) {
        std::memcpy(arrayOfElements, a->bytes.data(), (size_t)k * attr_size(a->type));
    }
    *elementCount = a->count;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t executionPlan,
                                  cudnnBackendDescriptor_t variantPack) {
    const char *fn = "cudnnBackendExecute";
    if (!handle)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: NULL handle", fn);
    const cudaStream_t stream = emu::cudnn_stream(handle, fn);
    Desc *pd = nullptr, *vd = nullptr;
    cudnnStatus_t st =
        typed(fn, executionPlan, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "executionPlan", &pd);
    if (st == CUDNN_STATUS_SUCCESS)
        st = typed(fn, variantPack, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "variantPack", &vd);
    if (st != CUDNN_STATUS_SUCCESS)
        return st;
    const std::shared_ptr<const State> plan = pd->st, pack = vd->st;
    if (!plan->finalized || !pack->finalized)
        return err(CUDNN_STATUS_BAD_PARAM, "%s: the %s is not finalized", fn,
                   plan->finalized ? "variant pack" : "execution plan");
    const std::shared_ptr<const Graph> g = plan->graph;
    /* every non-virtual tensor's pointer: the statuses first, then what a GPU would fault on */
    struct Bound {
        const Tensor *t;
        void *p;
    };
    std::vector<Bound> bound;
    for (const auto &kv : g->tensors) {
        const Tensor &t = kv.second;
        if (t.is_virtual)
            continue;
        auto it = std::find(pack->uids.begin(), pack->uids.end(), t.uid);
        if (it == pack->uids.end())
            return err(CUDNN_STATUS_BAD_PARAM, "%s: the variant pack has no pointer for tensor %s",
                       fn, t.text().c_str());
        void *p = pack->ptrs[(size_t)(it - pack->uids.begin())];
        if (!p)
            return err(CUDNN_STATUS_BAD_PARAM,
                       "%s: the variant pack's pointer for tensor %s is NULL", fn,
                       t.text().c_str());
        if (!t.by_value && (uintptr_t)p % (uintptr_t)t.align)
            return err(CUDNN_STATUS_BAD_PARAM,
                       "%s: the pointer %p for tensor %s is not aligned to the %lld bytes its "
                       "descriptor claims",
                       fn, p, t.text().c_str(), (long long)t.align);
        bound.push_back({&t, p});
    }
    const size_t need = plan->workspace;
    void *ws = pack->ws;
    if (need && !ws)
        return err(CUDNN_STATUS_BAD_PARAM,
                   "%s: the plan needs a workspace of %zu bytes; the variant pack has none", fn,
                   need);
    for (const Bound &b : bound) {
        const size_t bytes = (size_t)b.t->extent() * elem_size(b.t->type);
        if (b.t->by_value) {
            if (emu::is_device(b.p, 1))
                emu::fail("%s: the by-value tensor %s is given device memory (%p); cuDNN reads "
                          "its value on the host",
                          fn, b.t->text().c_str(), b.p);
            continue;
        }
        if (!emu::is_device(b.p, bytes))
            emu::fail("%s: tensor %s = %p (%zu bytes by its descriptor) is not all inside one "
                      "device allocation",
                      fn, b.t->text().c_str(), b.p, bytes);
        if (overlap(b.p, bytes, ws, need))
            emu::fail("%s: the workspace [%p, +%zu bytes) overlaps tensor %s", fn, ws, need,
                      b.t->text().c_str());
    }
    if (need && !emu::is_device(ws, need))
        emu::fail("%s: the workspace [%p, +%zu bytes) is not all inside one device allocation", fn,
                  ws, need);
    /* what the queued work holds: the pointers, and the by-value scalars read now */
    std::map<int64_t, void *> ptrs;
    std::map<int64_t, std::array<unsigned char, 8>> values;
    for (const Bound &b : bound) {
        if (b.t->by_value) {
            std::array<unsigned char, 8> v{};
            std::memcpy(v.data(), b.p, elem_size(b.t->type));
            values[b.t->uid] = v;
        } else {
            ptrs[b.t->uid] = b.p;
        }
    }
    emu::library_call_in_capture("cudnn", stream);
    const cudaError_t queued = emu::enqueue(
        stream,
        [g, ptrs, values, ws, need]() mutable {
            if (ws && need)
                std::memset(ws, 0xff, need);
            Run r;
            for (auto &kv : ptrs)
                r.st[kv.first] = Store{(unsigned char *)kv.second, g->tensors.at(kv.first).type};
            for (auto &kv : values)
                r.st[kv.first] = Store{kv.second.data(), g->tensors.at(kv.first).type};
            r.run(*g);
        },
        fn);
    if (queued != cudaSuccess) /* a stream capture CUDA invalidated refused its kernels */
        return err(CUDNN_STATUS_EXECUTION_FAILED_CUDART,
                   "%s: a CUDA runtime call failed (error %d)", fn, (int)queued);
    return CUDNN_STATUS_SUCCESS;
}

} // extern "C"
