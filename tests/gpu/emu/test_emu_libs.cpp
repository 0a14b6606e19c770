/* test_emu_libs.cpp: checks emu_cublas.cpp, emu_cudnn.cpp and emu_cudnn_graph.cpp on their own,
 * against naive reference loops written independently of them (gathers where the emulation
 * scatters, logical NCHW indexing where it packs NHWC, an attention written out row by row where
 * the emulation interprets a graph), with a minimal stand-in for the emu:: runtime:
 *   - "device memory" is host memory registered by dev_alloc, so is_device is a range lookup;
 *   - enqueue queues the closure and flush() (or emu::progress) runs the queue, so that the tests
 *     can change alpha, beta and the descriptors between a call and its execution;
 *   - fail is emu_test.h's: it prints and exits (death tests run in a forked child).
 *
 *   g++ -std=c++17 -O2 -Wall -Wextra -Werror -I/usr/local/cuda/include -Itests/gpu/emu \
 *       tests/gpu/emu/test_emu_libs.cpp tests/gpu/emu/emu_cublas.cpp \
 *       tests/gpu/emu/emu_cudnn.cpp tests/gpu/emu/emu_cudnn_graph.cpp -lopenblas \
 *       -o test_emu_libs */
#if defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif

#include <cublas_v2.h>
#include <cudnn.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <vector>

#include "emu.h"
#include "emu_test.h"
#include "emu_util.h"

/* ---- the stand-in runtime ---- */

namespace {

std::map<uintptr_t, size_t> allocations; /* start -> bytes */
std::deque<std::function<void()>> queue;

void *dev_alloc(size_t bytes) {
    void *p = std::aligned_alloc(256, (bytes + 255) & ~(size_t)255);
    if (!p)
        std::abort();
    std::memset(p, 0xff, bytes); /* NaN, as fresh device memory in the emulation */
    allocations[(uintptr_t)p] = bytes;
    return p;
}

void dev_free(void *p) {
    allocations.erase((uintptr_t)p);
    std::free(p);
}

void flush() {
    while (!queue.empty()) {
        auto op = std::move(queue.front());
        queue.pop_front();
        op();
    }
}

} // namespace

namespace emu {

cudaError_t enqueue(cudaStream_t, std::function<void()> op, const char *) {
    queue.push_back(std::move(op));
    return cudaSuccess;
}

cudaError_t enqueue_gate(cudaStream_t, std::function<bool()> ready, const char *) {
    queue.push_back([ready]() {
        while (!ready()) {
        }
    });
    return cudaSuccess;
}

void library_call_in_capture(const char *, cudaStream_t) {}

void set_last_error(cudaError_t) {}

bool is_device(const void *p, size_t bytes) {
    const uintptr_t a = (uintptr_t)p;
    auto it = allocations.upper_bound(a);
    if (it == allocations.begin())
        return false;
    --it;
    return a >= it->first && a + bytes <= it->first + it->second;
}

bool progress(void) {
    const bool any = !queue.empty();
    flush();
    return any;
}

} // namespace emu

/* ---- test helpers ---- */

namespace {

uint64_t rng_state = 0x9e3779b97f4a7c15ull;

float frand() { /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

const float NaN = std::numeric_limits<float>::quiet_NaN();

/* A device buffer with a host mirror. */
struct Buf {
    std::vector<float> h;
    float *d = nullptr;
    explicit Buf(size_t n) : h(n), d((float *)dev_alloc(n * sizeof(float))) {}
    ~Buf() { dev_free(d); }
    Buf(const Buf &) = delete;
    Buf &operator=(const Buf &) = delete;
    void up() { std::memcpy(d, h.data(), h.size() * sizeof(float)); }
    void down() { std::memcpy(h.data(), d, h.size() * sizeof(float)); }
    void random() {
        for (float &v : h)
            v = frand();
        up();
    }
    void fill(float v) {
        for (float &x : h)
            x = v;
        up();
    }
};

bool close(double got, double want, double scale, double rel = 1e-5) {
    return std::fabs(got - want) <= rel * (scale + std::fabs(want)) + 1e-30;
}

/* Whether f, and the work it queues, ends the process through emu::fail. */
bool dies(const std::function<void()> &f) {
    return emu_test::run_child([&] {
               f();
               flush();
           })
        .failed;
}

/* Elements of got that are not close to want. */
int count_wrong(const std::vector<float> &got, const std::vector<float> &want) {
    int bad = 0;
    for (size_t i = 0; i < got.size(); i++)
        if (!close(got[i], want[i], 1.0))
            bad++;
    return bad;
}

/* ==== cuBLAS ==== */

/* Column-major reference: C = alpha op(A) op(B) + beta C. */
void ref_gemm(bool ta, bool tb, int m, int n, int k, float alpha, const std::vector<float> &A,
              int lda, const std::vector<float> &B, int ldb, float beta, std::vector<float> &C,
              int ldc, bool beta_reads) {
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int p = 0; p < k; p++) {
                const double a = ta ? A[(size_t)i * lda + p] : A[(size_t)p * lda + i];
                const double b = tb ? B[(size_t)p * ldb + j] : B[(size_t)j * ldb + p];
                s += a * b;
            }
            double c = alpha * s;
            if (beta_reads)
                c += (double)beta * C[(size_t)j * ldc + i];
            C[(size_t)j * ldc + i] = (float)c;
        }
}

void test_sgemm() {
    cublasHandle_t h;
    CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS, "create");
    void *ws = dev_alloc(1 << 20);
    CHECK(cublasSetStream(h, (cudaStream_t)0) == CUBLAS_STATUS_SUCCESS, "stream");
    CHECK(cublasSetWorkspace(h, ws, 1 << 20) == CUBLAS_STATUS_SUCCESS, "workspace");
    CHECK(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH) == CUBLAS_STATUS_SUCCESS, "math");

    const int m = 7, n = 5, k = 6;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            const int rows_a = ta ? k : m, cols_a = ta ? m : k;
            const int rows_b = tb ? n : k, cols_b = tb ? k : n;
            const int lda = rows_a + 3, ldb = rows_b + 2, ldc = m + 4;
            Buf A((size_t)lda * cols_a), B((size_t)ldb * cols_b), C((size_t)ldc * n);
            A.random();
            B.random();
            C.random();
            /* entries beyond the rows, between leading dimensions, must be neither read nor
             * written: NaN in A and B, a sentinel in C */
            for (int j = 0; j < cols_a; j++)
                for (int i = rows_a; i < lda; i++)
                    A.h[(size_t)j * lda + i] = NaN;
            for (int j = 0; j < cols_b; j++)
                for (int i = rows_b; i < ldb; i++)
                    B.h[(size_t)j * ldb + i] = NaN;
            for (int j = 0; j < n; j++)
                for (int i = m; i < ldc; i++)
                    C.h[(size_t)j * ldc + i] = 12345.0f;
            A.up();
            B.up();
            C.up();
            std::vector<float> want = C.h;
            float alpha = 0.75f, beta = -0.5f;
            ref_gemm(ta, tb, m, n, k, alpha, A.h, lda, B.h, ldb, beta, want, ldc, true);
            CHECK(cublasSgemm(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m,
                              n, k, &alpha, A.d, lda, B.d, ldb, &beta, C.d,
                              ldc) == CUBLAS_STATUS_SUCCESS,
                  "sgemm %d%d", ta, tb);
            alpha = 100.0f; /* read at the call: changing it now must not matter */
            beta = 100.0f;
            flush();
            C.down();
            const int bad = count_wrong(C.h, want);
            CHECK(bad == 0, "transa=%d transb=%d: %d of %zu elements differ", ta, tb, bad,
                  C.h.size());
        }

    /* beta == 0: C is not read, NaN there must not propagate */
    {
        Buf A((size_t)m * k), B((size_t)k * n), C((size_t)m * n);
        A.random();
        B.random();
        C.fill(NaN);
        std::vector<float> want(C.h.size(), 0.0f);
        const float alpha = 1.25f, beta = 0.0f;
        ref_gemm(false, false, m, n, k, alpha, A.h, m, B.h, k, beta, want, m, false);
        CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, A.d, m, B.d, k, &beta, C.d,
                          m) == CUBLAS_STATUS_SUCCESS,
              "sgemm beta 0");
        flush();
        C.down();
        const int bad = count_wrong(C.h, want);
        CHECK(bad == 0, "beta == 0 with NaN in C: %d elements differ", bad);

        /* k == 0: C = beta C, A and B not read */
        C.fill(NaN);
        CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, 0, &alpha, nullptr, m, nullptr, 1,
                          &beta, C.d, m) == CUBLAS_STATUS_SUCCESS,
              "sgemm k 0");
        flush();
        C.down();
        bool zeros = true;
        for (float v : C.h)
            zeros = zeros && v == 0.0f;
        CHECK(zeros, "k == 0, beta == 0 must write zeros");
    }

    /* TF32 math rounds the inputs: (1 + 2^-12) * 1 is 1 in TF32, exact in float32 */
    {
        Buf A(1), B(1), C(1);
        A.h[0] = 1.0f + std::ldexp(1.0f, -12);
        A.up();
        B.fill(1.0f);
        const float one = 1.0f, zero = 0.0f;
        cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, A.d, 1, B.d, 1, &zero, C.d, 1);
        flush();
        C.down();
        CHECK(C.h[0] == A.h[0], "default math is float32: %.9g", C.h[0]);
        CHECK(cublasSetMathMode(h, CUBLAS_TF32_TENSOR_OP_MATH) == CUBLAS_STATUS_SUCCESS, "tf32");
        cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, A.d, 1, B.d, 1, &zero, C.d, 1);
        flush();
        C.down();
        CHECK(C.h[0] == 1.0f, "TF32 math rounds the inputs: %.9g", C.h[0]);
        cublasSetMathMode(h, CUBLAS_DEFAULT_MATH);
    }

    /* documented INVALID_VALUE cases */
    {
        Buf A(64), B(64), C(64);
        const float one = 1.0f;
        auto st = [&](cublasOperation_t ta, cublasOperation_t tb, int mm, int nn, int kk, int lda,
                      int ldb, int ldc, const float *al) {
            return cublasSgemm(h, ta, tb, mm, nn, kk, al, A.d, lda, B.d, ldb, &one, C.d, ldc);
        };
        const auto N = CUBLAS_OP_N, T = CUBLAS_OP_T;
        CHECK(st(N, N, -1, 2, 2, 2, 2, 2, &one) == CUBLAS_STATUS_INVALID_VALUE, "m < 0");
        CHECK(st(N, N, 2, -1, 2, 2, 2, 2, &one) == CUBLAS_STATUS_INVALID_VALUE, "n < 0");
        CHECK(st(N, N, 2, 2, -1, 2, 2, 2, &one) == CUBLAS_STATUS_INVALID_VALUE, "k < 0");
        CHECK(st(N, N, 4, 2, 3, 3, 3, 4, &one) == CUBLAS_STATUS_INVALID_VALUE, "lda < m (N)");
        CHECK(st(T, N, 4, 2, 3, 2, 3, 4, &one) == CUBLAS_STATUS_INVALID_VALUE, "lda < k (T)");
        CHECK(st(T, N, 4, 2, 3, 3, 3, 4, &one) == CUBLAS_STATUS_SUCCESS, "lda == k (T)");
        CHECK(st(N, N, 4, 2, 3, 4, 2, 4, &one) == CUBLAS_STATUS_INVALID_VALUE, "ldb < k (N)");
        CHECK(st(N, T, 4, 2, 3, 4, 1, 4, &one) == CUBLAS_STATUS_INVALID_VALUE, "ldb < n (T)");
        CHECK(st(N, N, 4, 2, 3, 4, 3, 3, &one) == CUBLAS_STATUS_INVALID_VALUE, "ldc < m");
        CHECK(st(N, N, 0, 2, 0, 0, 1, 1, &one) == CUBLAS_STATUS_INVALID_VALUE, "lda < 1");
        CHECK(st(N, N, 4, 2, 3, 4, 3, 4, nullptr) == CUBLAS_STATUS_INVALID_VALUE, "alpha NULL");
        CHECK(st((cublasOperation_t)7, N, 4, 2, 3, 4, 3, 4, &one) == CUBLAS_STATUS_INVALID_VALUE,
              "bad op");
        flush();
        CHECK(cublasSetMathMode(h, (cublasMath_t)77) == CUBLAS_STATUS_INVALID_VALUE, "bad math");
        CHECK(cublasSetWorkspace(h, (char *)ws + 16, 1024) == CUBLAS_STATUS_INVALID_VALUE,
              "misaligned workspace");
        CHECK(cublasSgemm(nullptr, N, N, 1, 1, 1, &one, A.d, 1, B.d, 1, &one, C.d, 1) ==
                  CUBLAS_STATUS_NOT_INITIALIZED,
              "NULL handle");
    }

    /* misuse a GPU would punish */
    {
        std::vector<float> host(64);
        Buf A(64), B(64), C(64), S(1);
        const float one = 1.0f;
        CHECK(dies([&] {
                  cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, A.d, 4, B.d, 4, &one,
                              host.data(), 4);
              }),
              "host C must fail");
        CHECK(dies([&] {
                  cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, A.d, 9, B.d, 8, &one, C.d,
                              8);
              }),
              "A past its allocation must fail");
        CHECK(dies([&] {
                  cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, S.d, A.d, 4, B.d, 4, &one, C.d,
                              4);
              }),
              "device alpha in host pointer mode must fail");
    }

    CHECK(std::strcmp(cublasGetStatusName(CUBLAS_STATUS_INVALID_VALUE),
                      "CUBLAS_STATUS_INVALID_VALUE") == 0,
          "status name");
    CHECK(cublasGetStatusString(CUBLAS_STATUS_NOT_SUPPORTED)[0] != '\0', "status string");
    CHECK(cublasDestroy(h) == CUBLAS_STATUS_SUCCESS, "destroy");
    dev_free(ws);
}

/* ==== cuDNN ==== */

#define DNN(call)                                                                                  \
    do {                                                                                           \
        cudnnStatus_t st_ = (call);                                                                \
        if (st_ != CUDNN_STATUS_SUCCESS) {                                                         \
            char msg_[512];                                                                        \
            cudnnGetLastErrorString(msg_, sizeof msg_);                                            \
            std::fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #call,                \
                         cudnnGetErrorString(st_), msg_);                                          \
            std::exit(1);                                                                          \
        }                                                                                          \
    } while (0)

struct Shape {
    int n, c, h, w, k, r, s, ph, pw, u, v, dh, dw;
    int oh() const { return 1 + (h + 2 * ph - ((r - 1) * dh + 1)) / u; }
    int ow() const { return 1 + (w + 2 * pw - ((s - 1) * dw + 1)) / v; }
};

/* Logical arrays in NCHW / KCRS order (double), independent of the device layout. */
struct Logical {
    int d0, d1, d2, d3;
    std::vector<double> a;
    Logical(int a0, int a1, int a2, int a3)
        : d0(a0), d1(a1), d2(a2), d3(a3), a((size_t)a0 * a1 * a2 * a3, 0.0) {}
    double &at(int i, int j, int k, int l) { return a[(((size_t)i * d1 + j) * d2 + k) * d3 + l]; }
};

/* f(i, j, k, l) for every index of L, in its (logical) order. */
template <typename F> void each(const Logical &L, F f) {
    for (int i = 0; i < L.d0; i++)
        for (int j = 0; j < L.d1; j++)
            for (int k = 0; k < L.d2; k++)
                for (int l = 0; l < L.d3; l++)
                    f(i, j, k, l);
}

/* Device offset of logical (i, j, k, l) = (n, c, h, w) or (k, c, r, s) for a format. */
size_t offset(cudnnTensorFormat_t f, const Logical &L, int i, int j, int k, int l) {
    if (f == CUDNN_TENSOR_NCHW)
        return (((size_t)i * L.d1 + j) * L.d2 + k) * L.d3 + l;
    return (((size_t)i * L.d2 + k) * L.d3 + l) * L.d1 + j;
}

void to_device(cudnnTensorFormat_t f, Logical &L, Buf &b) {
    each(L, [&](int i, int j, int k, int l) {
        b.h[offset(f, L, i, j, k, l)] = (float)L.at(i, j, k, l);
    });
    b.up();
}

void from_device(cudnnTensorFormat_t f, Logical &L, Buf &b) {
    b.down();
    each(L, [&](int i, int j, int k, int l) { L.at(i, j, k, l) = b.h[offset(f, L, i, j, k, l)]; });
}

void randomize(Logical &L) {
    for (double &v : L.a)
        v = frand();
}

/* The filter tap used at window position (r, s). */
double tap(Logical &W, bool flip, int k, int c, int r, int s) {
    return flip ? W.at(k, c, W.d2 - 1 - r, W.d3 - 1 - s) : W.at(k, c, r, s);
}

/* The input position (ih, iw) under window position (r, s) of output (oh, ow); false in the
 * padding. */
bool input_at(const Shape &S, int oh, int ow, int r, int s, int *ih, int *iw) {
    *ih = oh * S.u - S.ph + r * S.dh;
    *iw = ow * S.v - S.pw + s * S.dw;
    return *ih >= 0 && *ih < S.h && *iw >= 0 && *iw < S.w;
}

void ref_forward(const Shape &S, bool flip, Logical &X, Logical &W, Logical &Y) {
    each(Y, [&](int n, int k, int oh, int ow) {
        double sum = 0;
        int ih, iw;
        for (int c = 0; c < S.c; c++)
            for (int r = 0; r < S.r; r++)
                for (int s = 0; s < S.s; s++)
                    if (input_at(S, oh, ow, r, s, &ih, &iw))
                        sum += X.at(n, c, ih, iw) * tap(W, flip, k, c, r, s);
        Y.at(n, k, oh, ow) = sum;
    });
}

/* Gather form: each input position collects the outputs whose windows cover it. */
void ref_backward_data(const Shape &S, bool flip, Logical &W, Logical &DY, Logical &DX) {
    each(DX, [&](int n, int c, int ih, int iw) {
        double sum = 0;
        for (int r = 0; r < S.r; r++) {
            const int th = ih + S.ph - r * S.dh;
            if (th < 0 || th % S.u)
                continue;
            const int oh = th / S.u;
            if (oh >= S.oh())
                continue;
            for (int s = 0; s < S.s; s++) {
                const int tw = iw + S.pw - s * S.dw;
                if (tw < 0 || tw % S.v)
                    continue;
                const int ow = tw / S.v;
                if (ow >= S.ow())
                    continue;
                for (int k = 0; k < S.k; k++)
                    sum += DY.at(n, k, oh, ow) * tap(W, flip, k, c, r, s);
            }
        }
        DX.at(n, c, ih, iw) = sum;
    });
}

void ref_backward_filter(const Shape &S, bool flip, Logical &X, Logical &DY, Logical &DW) {
    /* the gradient of stored tap (r, s), which sits at window position (wr, ws) */
    each(DW, [&](int k, int c, int r, int s) {
        const int wr = flip ? S.r - 1 - r : r, ws = flip ? S.s - 1 - s : s;
        double sum = 0;
        int ih, iw;
        for (int n = 0; n < S.n; n++)
            for (int oh = 0; oh < S.oh(); oh++)
                for (int ow = 0; ow < S.ow(); ow++)
                    if (input_at(S, oh, ow, wr, ws, &ih, &iw))
                        sum += X.at(n, c, ih, iw) * DY.at(n, k, oh, ow);
        DW.at(k, c, r, s) = sum;
    });
}

/* The sum of the elementwise products, or (absolute) of their magnitudes. */
double dot(const Logical &a, const Logical &b, bool absolute = false) {
    double s = 0;
    for (size_t i = 0; i < a.a.size(); i++)
        s += absolute ? std::fabs(a.a[i] * b.a[i]) : a.a[i] * b.a[i];
    return s;
}

/* Counts elements of got that differ from alpha * ref + beta * prior. */
int compare(Logical &got, Logical &ref, const Logical *prior, double alpha, double beta) {
    int bad = 0;
    for (size_t i = 0; i < got.a.size(); i++) {
        const double want = alpha * ref.a[i] + (prior ? beta * prior->a[i] : 0.0);
        if (!std::isfinite(got.a[i]) || !close(got.a[i], want, 1.0))
            bad++;
    }
    return bad;
}

struct Descs {
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
    Descs(const Shape &S, cudnnTensorFormat_t tf, cudnnTensorFormat_t ff, bool flip) {
        DNN(cudnnCreateTensorDescriptor(&x));
        DNN(cudnnCreateTensorDescriptor(&y));
        DNN(cudnnCreateFilterDescriptor(&w));
        DNN(cudnnCreateConvolutionDescriptor(&conv));
        DNN(cudnnSetTensor4dDescriptor(x, tf, CUDNN_DATA_FLOAT, S.n, S.c, S.h, S.w));
        DNN(cudnnSetFilter4dDescriptor(w, CUDNN_DATA_FLOAT, ff, S.k, S.c, S.r, S.s));
        DNN(cudnnSetConvolution2dDescriptor(conv, S.ph, S.pw, S.u, S.v, S.dh, S.dw,
                                            flip ? CUDNN_CONVOLUTION : CUDNN_CROSS_CORRELATION,
                                            CUDNN_DATA_FLOAT));
        DNN(cudnnSetConvolutionMathType(conv, CUDNN_FMA_MATH));
        int on, oc, oh, ow;
        DNN(cudnnGetConvolution2dForwardOutputDim(conv, x, w, &on, &oc, &oh, &ow));
        CHECK(on == S.n && oc == S.k && oh == S.oh() && ow == S.ow(),
              "output dim %d %d %d %d, want %d %d %d %d", on, oc, oh, ow, S.n, S.k, S.oh(), S.ow());
        DNN(cudnnSetTensor4dDescriptor(y, tf, CUDNN_DATA_FLOAT, S.n, S.k, S.oh(), S.ow()));
    }
    void destroy() {
        DNN(cudnnDestroyTensorDescriptor(x));
        DNN(cudnnDestroyTensorDescriptor(y));
        DNN(cudnnDestroyFilterDescriptor(w));
        DNN(cudnnDestroyConvolutionDescriptor(conv));
    }
};

/* Every algorithm the heuristics call usable, with the workspace the size query gives. */
template <typename Perf, typename Algo, typename Get, typename Size>
std::vector<std::pair<Algo, size_t>> usable(int count, Get get, Size size, int *n_det,
                                            int *n_nondet, int *n_unsup) {
    std::vector<Perf> perf(count);
    int got = 0;
    DNN(get(count, &got, perf.data()));
    CHECK(got == count, "heuristics returned %d of %d", got, count);
    std::vector<std::pair<Algo, size_t>> out;
    for (int i = 0; i < got; i++) {
        if (perf[i].status != CUDNN_STATUS_SUCCESS) {
            (*n_unsup)++;
            continue;
        }
        (perf[i].determinism == CUDNN_DETERMINISTIC ? *n_det : *n_nondet)++;
        /* the descriptor's math type is FMA, and every entry must keep to it */
        CHECK(perf[i].mathType == CUDNN_FMA_MATH, "algo %d: math type %d under FMA",
              (int)perf[i].algo, (int)perf[i].mathType);
        size_t ws = 0;
        DNN(size(perf[i].algo, &ws));
        CHECK(ws > 0 && ws == perf[i].memory, "algo %d: workspace %zu, perf says %zu",
              (int)perf[i].algo, ws, perf[i].memory);
        out.push_back({perf[i].algo, ws});
    }
    return out;
}

/* One direction with every usable algorithm: alpha and beta (read at the call) blend onto a
 * random prior output; then beta 0 onto NaN, which must not be read. call(algo, workspace, bytes,
 * alpha, beta) runs the direction into `out`, whose layout is `f`; `ref` is the exact result. */
template <typename Algo, typename Call>
void check_direction(const char *what, const char *name, bool flip,
                     const std::vector<std::pair<Algo, size_t>> &algos, Call call,
                     cudnnTensorFormat_t f, Logical &ref, Buf &out, float alpha, float beta) {
    Logical prior(ref.d0, ref.d1, ref.d2, ref.d3), got(ref.d0, ref.d1, ref.d2, ref.d3);
    for (auto &a : algos) {
        void *ws = dev_alloc(a.second);
        randomize(prior);
        to_device(f, prior, out);
        float al = alpha, be = beta;
        DNN(call(a.first, ws, a.second, &al, &be));
        al = be = 9.0f; /* read at the call */
        flush();
        from_device(f, got, out);
        CHECK(compare(got, ref, &prior, alpha, beta) == 0, "%s flip=%d %s algo %d: wrong", name,
              flip, what, (int)a.first);
        dev_free(ws);
    }
    void *ws = dev_alloc(algos[0].second);
    out.fill(NaN);
    const float one = 1.0f, zero = 0.0f;
    DNN(call(algos[0].first, ws, algos[0].second, &one, &zero));
    flush();
    from_device(f, got, out);
    CHECK(compare(got, ref, nullptr, 1.0, 0.0) == 0, "%s flip=%d %s beta 0 with NaN in the output",
          name, flip, what);
    dev_free(ws);
}

/* The directions a layout has algorithms for (bits), cuDNN's tables: all three for one layout
 * throughout; with NHWC tensors and an NCHW filter forward only (the backward algorithms read
 * dy as NCHW); none for NCHW tensors with an NHWC filter. */
enum { D_FWD = 1, D_BWD_DATA = 2, D_BWD_FILTER = 4, D_ALL = 7 };

void test_conv_case(cudnnHandle_t h, const Shape &S, cudnnTensorFormat_t tf, cudnnTensorFormat_t ff,
                    bool flip, int dirs = D_ALL) {
    const char *name = tf == CUDNN_TENSOR_NHWC ? "NHWC" : "NCHW";
    Descs D(S, tf, ff, flip);
    Logical X(S.n, S.c, S.h, S.w), W(S.k, S.c, S.r, S.s), DY(S.n, S.k, S.oh(), S.ow());
    randomize(X);
    randomize(W);
    randomize(DY);
    Logical Yr(S.n, S.k, S.oh(), S.ow()), DXr(S.n, S.c, S.h, S.w), DWr(S.k, S.c, S.r, S.s);
    ref_forward(S, flip, X, W, Yr);
    ref_backward_data(S, flip, W, DY, DXr);
    ref_backward_filter(S, flip, X, DY, DWr);
    Buf x(X.a.size()), w(W.a.size()), y(Yr.a.size()), dy(DY.a.size()), dx(X.a.size()),
        dw(W.a.size());
    to_device(tf, X, x);
    to_device(ff, W, w);
    to_device(tf, DY, dy);

    int det = 0, nondet = 0, unsup = 0;
    auto fwd = usable<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t>(
        CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
        [&](int c, int *g, cudnnConvolutionFwdAlgoPerf_t *p) {
            return cudnnGetConvolutionForwardAlgorithm_v7(h, D.x, D.w, D.conv, D.y, c, g, p);
        },
        [&](cudnnConvolutionFwdAlgo_t a, size_t *b) {
            return cudnnGetConvolutionForwardWorkspaceSize(h, D.x, D.w, D.conv, D.y, a, b);
        },
        &det, &nondet, &unsup);
    auto bwd_data = usable<cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t>(
        CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
        [&](int c, int *g, cudnnConvolutionBwdDataAlgoPerf_t *p) {
            return cudnnGetConvolutionBackwardDataAlgorithm_v7(h, D.w, D.y, D.conv, D.x, c, g, p);
        },
        [&](cudnnConvolutionBwdDataAlgo_t a, size_t *b) {
            return cudnnGetConvolutionBackwardDataWorkspaceSize(h, D.w, D.y, D.conv, D.x, a, b);
        },
        &det, &nondet, &unsup);
    auto bwd_filter = usable<cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t>(
        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
        [&](int c, int *g, cudnnConvolutionBwdFilterAlgoPerf_t *p) {
            return cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, D.x, D.y, D.conv, D.w, c, g, p);
        },
        [&](cudnnConvolutionBwdFilterAlgo_t a, size_t *b) {
            return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, D.x, D.y, D.conv, D.w, a, b);
        },
        &det, &nondet, &unsup);
    CHECK(fwd.empty() == !(dirs & D_FWD) && bwd_data.empty() == !(dirs & D_BWD_DATA) &&
              bwd_filter.empty() == !(dirs & D_BWD_FILTER),
          "%s filter %s: usable algorithms forward %zu, backward-data %zu, backward-filter %zu; "
          "want directions %d",
          name, ff == CUDNN_TENSOR_NHWC ? "NHWC" : "NCHW", fwd.size(), bwd_data.size(),
          bwd_filter.size(), dirs);
    if (dirs == D_ALL)
        CHECK(det > 0 && nondet > 0, "%s: want deterministic and non-deterministic algorithms",
              name);
    if (tf == CUDNN_TENSOR_NHWC)
        CHECK(unsup > 0, "NHWC: FFT and Winograd must be reported unsupported");
    if (tf == CUDNN_TENSOR_NHWC && ff == CUDNN_TENSOR_NHWC) { /* cuDNN's NHWC-filter table */
        bool only = fwd.size() <= 2 && bwd_data.size() == 1 && bwd_filter.size() <= 2;
        for (auto &a : fwd)
            only &= a.first == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM ||
                    a.first == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
        for (auto &a : bwd_data)
            only &= a.first == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
        for (auto &a : bwd_filter)
            only &= a.first == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 ||
                    a.first == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
        CHECK(only, "NHWC filter: only IMPLICIT_GEMM/IMPLICIT_PRECOMP_GEMM, ALGO_1 and "
                    "ALGO_0/ALGO_1 may be usable");
    }

    auto run_fwd = [&](cudnnConvolutionFwdAlgo_t a, void *ws, size_t b, const float *al,
                       const float *be) {
        return cudnnConvolutionForward(h, al, D.x, x.d, D.w, w.d, D.conv, a, ws, b, be, D.y, y.d);
    };
    auto run_bwd_data = [&](cudnnConvolutionBwdDataAlgo_t a, void *ws, size_t b, const float *al,
                            const float *be) {
        return cudnnConvolutionBackwardData(h, al, D.w, w.d, D.y, dy.d, D.conv, a, ws, b, be, D.x,
                                            dx.d);
    };
    auto run_bwd_filter = [&](cudnnConvolutionBwdFilterAlgo_t a, void *ws, size_t b,
                              const float *al, const float *be) {
        return cudnnConvolutionBackwardFilter(h, al, D.x, x.d, D.y, dy.d, D.conv, a, ws, b, be, D.w,
                                              dw.d);
    };
    if (!fwd.empty())
        check_direction("forward", name, flip, fwd, run_fwd, tf, Yr, y, 1.5f, 0.25f);
    if (!bwd_data.empty())
        check_direction("backward-data", name, flip, bwd_data, run_bwd_data, tf, DXr, dx, -0.5f,
                        2.0f);
    if (!bwd_filter.empty())
        check_direction("backward-filter", name, flip, bwd_filter, run_bwd_filter, ff, DWr, dw,
                        0.75f, -1.0f);
    if (dirs != D_ALL) {
        D.destroy();
        return;
    }

    /* adjointness, from the emulation's own outputs (alpha 1, beta 0):
     * <dy, conv(x, w)> == <bwd_data(dy, w), x> == <bwd_filter(x, dy), w> */
    {
        Logical Xf(S.n, S.c, S.h, S.w), Wf(S.k, S.c, S.r, S.s), DYf(S.n, S.k, S.oh(), S.ow());
        from_device(tf, Xf, x); /* the float values the device holds */
        from_device(ff, Wf, w);
        from_device(tf, DYf, dy);
        const float one = 1.0f, zero = 0.0f;
        void *ws = dev_alloc(std::max({fwd[0].second, bwd_data[0].second, bwd_filter[0].second}));
        DNN(run_fwd(fwd[0].first, ws, fwd[0].second, &one, &zero));
        DNN(run_bwd_data(bwd_data[0].first, ws, bwd_data[0].second, &one, &zero));
        DNN(run_bwd_filter(bwd_filter[0].first, ws, bwd_filter[0].second, &one, &zero));
        /* descriptors are read at the call: destroying them before the work runs is fine */
        D.destroy();
        flush();
        Logical Yg(S.n, S.k, S.oh(), S.ow()), DXg(S.n, S.c, S.h, S.w), DWg(S.k, S.c, S.r, S.s);
        from_device(tf, Yg, y);
        from_device(tf, DXg, dx);
        from_device(ff, DWg, dw);
        const double a = dot(DYf, Yg), b = dot(DXg, Xf), c = dot(DWg, Wf);
        const double scale = dot(DYf, Yg, true) + dot(DXg, Xf, true) + dot(DWg, Wf, true);
        CHECK(std::fabs(a - b) <= 1e-5 * scale && std::fabs(a - c) <= 1e-5 * scale,
              "%s flip=%d adjoint: <dy,fwd>=%.9g <bwd_data,x>=%.9g <bwd_filter,w>=%.9g", name, flip,
              a, b, c);
        dev_free(ws);
    }
}

void test_conv(cudnnHandle_t h) {
    const Shape shapes[] = {
        /* n  c  h  w  k  r  s ph pw  u  v dh dw */
        {2, 3, 7, 6, 4, 3, 3, 1, 1, 2, 2, 1, 1}, /* padding, stride 2, odd sizes */
        {3, 5, 8, 9, 2, 3, 2, 2, 0, 1, 2, 1, 1}, /* asymmetric window and strides */
        {2, 4, 9, 9, 3, 3, 3, 1, 2, 1, 1, 2, 2}, /* dilation */
        {1, 6, 5, 5, 7, 1, 1, 0, 0, 1, 1, 1, 1}, /* 1x1, stride 1 (FFT/Winograd rules) */
        {2, 2, 6, 6, 3, 3, 3, 1, 1, 1, 1, 1, 1}, /* 3x3 stride 1: Winograd eligible in NCHW */
    };
    for (const Shape &S : shapes)
        for (int flip = 0; flip < 2; flip++) {
            test_conv_case(h, S, CUDNN_TENSOR_NHWC, CUDNN_TENSOR_NHWC, flip);
            test_conv_case(h, S, CUDNN_TENSOR_NCHW, CUDNN_TENSOR_NCHW, flip);
        }
    /* mixed layouts: strides come from each descriptor, and cuDNN's tables leave forward only
     * (NHWC tensors, NCHW filter) or nothing (NCHW tensors, NHWC filter) */
    test_conv_case(h, shapes[0], CUDNN_TENSOR_NHWC, CUDNN_TENSOR_NCHW, false, D_FWD);
    test_conv_case(h, shapes[1], CUDNN_TENSOR_NCHW, CUDNN_TENSOR_NHWC, true, 0);
}

/* A non-FMA math type rounds the inputs to TF32, as tensor cores do. */
void test_conv_tf32(cudnnHandle_t h) {
    const Shape S = {1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1};
    Descs D(S, CUDNN_TENSOR_NHWC, CUDNN_TENSOR_NHWC, false);
    Buf x(1), w(1), y(1);
    x.h[0] = 1.0f + std::ldexp(1.0f, -12);
    x.up();
    w.fill(1.0f);
    const float one = 1.0f, zero = 0.0f;
    const cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
    for (int tf32 = 0; tf32 < 2; tf32++) {
        DNN(cudnnSetConvolutionMathType(D.conv, tf32 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH));
        size_t bytes = 0;
        DNN(cudnnGetConvolutionForwardWorkspaceSize(h, D.x, D.w, D.conv, D.y, algo, &bytes));
        void *ws = dev_alloc(bytes);
        DNN(cudnnConvolutionForward(h, &one, D.x, x.d, D.w, w.d, D.conv, algo, ws, bytes, &zero,
                                    D.y, y.d));
        flush();
        y.down();
        CHECK(y.h[0] == (tf32 ? 1.0f : x.h[0]), "math %s: %.9g", tf32 ? "TF32" : "FMA", y.h[0]);
        dev_free(ws);
    }
    D.destroy();
}

/* What the backend's choice relies on: under FMA every entry is FMA, under tensor-op math the
 * first forward entry is a tensor-op one, the backward-filter list ranks a non-deterministic
 * algorithm first, and workspace sizes differ by algorithm and math type. */
void test_heuristics(cudnnHandle_t h) {
    const Shape S = {8, 16, 12, 12, 32, 3, 3, 1, 1, 1, 1, 1, 1};
    Descs D(S, CUDNN_TENSOR_NHWC, CUDNN_TENSOR_NHWC, false);
    cudnnConvolutionFwdAlgoPerf_t f[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int got = 0;
    DNN(cudnnSetConvolutionMathType(D.conv, CUDNN_TENSOR_OP_MATH));
    DNN(cudnnGetConvolutionForwardAlgorithm_v7(h, D.x, D.w, D.conv, D.y,
                                               CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, f));
    CHECK(f[0].status == CUDNN_STATUS_SUCCESS && f[0].mathType == CUDNN_TENSOR_OP_MATH,
          "forward first entry under tensor-op math: status %d math %d", (int)f[0].status,
          (int)f[0].mathType);
    DNN(cudnnSetConvolutionMathType(D.conv, CUDNN_FMA_MATH));
    DNN(cudnnGetConvolutionForwardAlgorithm_v7(h, D.x, D.w, D.conv, D.y,
                                               CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, f));
    CHECK(got == CUDNN_CONVOLUTION_FWD_ALGO_COUNT, "forward count %d", got);
    CHECK(f[0].status == CUDNN_STATUS_SUCCESS && f[0].mathType == CUDNN_FMA_MATH,
          "forward first entry under FMA: status %d math %d", (int)f[0].status, (int)f[0].mathType);
    bool differ = false;
    for (int i = 1; i < got; i++)
        if (f[i].status == CUDNN_STATUS_SUCCESS && f[i].memory != f[0].memory)
            differ = true;
    CHECK(differ, "workspace sizes must depend on the algorithm");
    /* the size depends on the math type too */
    size_t fma = 0, top = 0;
    DNN(cudnnGetConvolutionForwardWorkspaceSize(
        h, D.x, D.w, D.conv, D.y, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, &fma));
    DNN(cudnnSetConvolutionMathType(D.conv, CUDNN_TENSOR_OP_MATH));
    DNN(cudnnGetConvolutionForwardWorkspaceSize(
        h, D.x, D.w, D.conv, D.y, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, &top));
    CHECK(top > fma && fma > 0, "tensor-op workspace %zu vs FMA %zu", top, fma);
    DNN(cudnnSetConvolutionMathType(D.conv, CUDNN_FMA_MATH));
    cudnnConvolutionBwdFilterAlgoPerf_t bf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    DNN(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        h, D.x, D.y, D.conv, D.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &got, bf));
    CHECK(bf[0].determinism == CUDNN_NON_DETERMINISTIC && bf[0].status == CUDNN_STATUS_SUCCESS,
          "backward-filter first entry: the non-deterministic ALGO_0");
    cudnnConvolutionBwdDataAlgoPerf_t b[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    /* a smaller request is honoured */
    DNN(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, D.w, D.y, D.conv, D.x, 2, &got, b));
    CHECK(got == 2, "requested 2, got %d", got);
    D.destroy();
}

void test_conv_errors(cudnnHandle_t h) {
    const Shape S = {2, 3, 8, 8, 4, 3, 3, 1, 1, 1, 1, 1, 1};
    Descs D(S, CUDNN_TENSOR_NHWC, CUDNN_TENSOR_NHWC, false);
    cudnnTensorDescriptor_t t;
    cudnnFilterDescriptor_t f;
    cudnnConvolutionDescriptor_t c;
    DNN(cudnnCreateTensorDescriptor(&t));
    DNN(cudnnCreateFilterDescriptor(&f));
    DNN(cudnnCreateConvolutionDescriptor(&c));
    const auto BAD = CUDNN_STATUS_BAD_PARAM, NS = CUDNN_STATUS_NOT_SUPPORTED;
    char msg[512];

    /* descriptor setters */
    CHECK(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, 2, -3, 4, 4) == BAD,
          "negative dimension");
    CHECK(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW_VECT_C, CUDNN_DATA_FLOAT, 1, 4, 4, 4) ==
              BAD,
          "NCHW_VECT_C float");
    CHECK(cudnnSetTensor4dDescriptor(t, (cudnnTensorFormat_t)9, CUDNN_DATA_FLOAT, 1, 4, 4, 4) ==
              BAD,
          "bad format");
    CHECK(cudnnSetFilter4dDescriptor(f, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC, 0, 3, 3, 3) == BAD,
          "zero filter dimension");
    CHECK(cudnnSetConvolution2dDescriptor(c, 1, 1, 0, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                          CUDNN_DATA_FLOAT) == BAD,
          "stride 0");
    CHECK(cudnnSetConvolution2dDescriptor(c, -1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                          CUDNN_DATA_FLOAT) == BAD,
          "negative padding");
    CHECK(cudnnSetConvolution2dDescriptor(c, 1, 1, 1, 1, 0, 1, CUDNN_CROSS_CORRELATION,
                                          CUDNN_DATA_FLOAT) == BAD,
          "dilation 0");
    CHECK(cudnnSetConvolution2dDescriptor(c, 1, 1, 1, 1, 1, 1, (cudnnConvolutionMode_t)5,
                                          CUDNN_DATA_FLOAT) == BAD,
          "bad mode");
    CHECK(cudnnSetConvolutionMathType(c, (cudnnMathType_t)42) == BAD, "bad math type");

    int on, oc, oh, ow;
    /* a never-set descriptor */
    CHECK(cudnnGetConvolution2dForwardOutputDim(c, D.x, D.w, &on, &oc, &oh, &ow) == BAD,
          "unset convolution descriptor");

    /* channel mismatch: x has 3 channels, this filter 5 */
    DNN(cudnnSetFilter4dDescriptor(f, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC, 4, 5, 3, 3));
    CHECK(cudnnGetConvolution2dForwardOutputDim(D.conv, D.x, f, &on, &oc, &oh, &ow) == BAD,
          "input channels vs filter");
    size_t bytes = 0;
    CHECK(cudnnGetConvolutionForwardWorkspaceSize(
              h, D.x, f, D.conv, D.y, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, &bytes) == BAD,
          "input channels vs filter (workspace)");
    cudnnGetLastErrorString(msg, sizeof msg);
    CHECK(std::strstr(msg, "channels") != nullptr, "last error names the check: '%s'", msg);

    /* a filter larger than the padded input */
    DNN(cudnnSetFilter4dDescriptor(f, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC, 4, 3, 11, 3));
    CHECK(cudnnGetConvolution2dForwardOutputDim(D.conv, D.x, f, &on, &oc, &oh, &ow) == BAD,
          "filter larger than input");

    Buf x(2 * 3 * 8 * 8), w(4 * 3 * 3 * 3), y(2 * 4 * 8 * 8 * 2);
    x.random();
    w.random();
    const float one = 1.0f, zero = 0.0f;
    const auto ALG = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
    DNN(cudnnGetConvolutionForwardWorkspaceSize(h, D.x, D.w, D.conv, D.y, ALG, &bytes));
    void *ws = dev_alloc(bytes);
    auto fwd = [&](cudnnTensorDescriptor_t yd, cudnnConvolutionFwdAlgo_t a, void *wsp, size_t wsb) {
        return cudnnConvolutionForward(h, &one, D.x, x.d, D.w, w.d, D.conv, a, wsp, wsb, &zero, yd,
                                       y.d);
    };

    /* output descriptors that disagree with the convolution */
    DNN(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, 2, 5, 8, 8));
    CHECK(fwd(t, ALG, ws, bytes) == BAD, "y channels vs filter count");
    DNN(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, 1, 4, 8, 8));
    CHECK(fwd(t, ALG, ws, bytes) == BAD, "batch mismatch");
    DNN(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, 2, 4, 7, 8));
    CHECK(fwd(t, ALG, ws, bytes) == NS, "y spatial size (forward: documented NOT_SUPPORTED)");
    CHECK(cudnnConvolutionBackwardData(h, &one, D.w, w.d, t, y.d, D.conv,
                                       CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, ws, bytes, &zero, D.x,
                                       x.d) == BAD,
          "dy spatial size (backward data: BAD_PARAM)");
    CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, D.x, D.w, D.conv, t, ALG, &bytes) == BAD,
          "y spatial size (workspace query)");
    DNN(cudnnGetConvolutionForwardWorkspaceSize(h, D.x, D.w, D.conv, D.y, ALG, &bytes));
    DNN(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NHWC, CUDNN_DATA_DOUBLE, 2, 4, 8, 8));
    CHECK(fwd(t, ALG, ws, bytes) == BAD, "data type mismatch");
    int got = 0;
    cudnnConvolutionFwdAlgoPerf_t perf[8];
    CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, D.x, D.w, D.conv, t, 8, &got, perf) == BAD,
          "data type mismatch (heuristics)");
    CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, D.x, D.w, D.conv, D.y, 0, &got, perf) == BAD,
          "requestedAlgoCount 0");

    /* algorithms and workspaces */
    CHECK(fwd(D.y, CUDNN_CONVOLUTION_FWD_ALGO_FFT, ws, bytes) == NS, "FFT on NHWC");
    CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, D.x, D.w, D.conv, D.y,
                                                  CUDNN_CONVOLUTION_FWD_ALGO_DIRECT, &bytes) == NS,
          "DIRECT is not implemented");
    DNN(cudnnGetConvolutionForwardWorkspaceSize(h, D.x, D.w, D.conv, D.y, ALG, &bytes));
    CHECK(fwd(D.y, (cudnnConvolutionFwdAlgo_t)99, ws, bytes) == BAD, "algorithm out of range");
    CHECK(fwd(D.y, ALG, ws, bytes - 1) == BAD, "workspace one byte short");
    CHECK(fwd(D.y, ALG, nullptr, 0) == BAD, "no workspace");
    cudnnGetLastErrorString(msg, sizeof msg);
    CHECK(std::strstr(msg, "workspace") != nullptr, "last error names the workspace: '%s'", msg);
    CHECK(cudnnConvolutionForward(h, nullptr, D.x, x.d, D.w, w.d, D.conv, ALG, ws, bytes, &zero,
                                  D.y, y.d) == BAD,
          "NULL alpha");
    CHECK(fwd(D.y, ALG, ws, bytes) == CUDNN_STATUS_SUCCESS, "the valid call");
    flush();

    /* unsupported configurations */
    cudnnTensorDescriptor_t xd, yd;
    cudnnFilterDescriptor_t wd;
    DNN(cudnnCreateTensorDescriptor(&xd));
    DNN(cudnnCreateTensorDescriptor(&yd));
    DNN(cudnnCreateFilterDescriptor(&wd));
    DNN(cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NHWC, CUDNN_DATA_DOUBLE, 2, 3, 8, 8));
    DNN(cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NHWC, CUDNN_DATA_DOUBLE, 2, 4, 8, 8));
    DNN(cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_DOUBLE, CUDNN_TENSOR_NHWC, 4, 3, 3, 3));
    CHECK(cudnnConvolutionForward(h, &one, xd, x.d, wd, w.d, D.conv, ALG, ws, bytes, &zero, yd,
                                  y.d) == NS,
          "double data is not emulated");
    DNN(cudnnDestroyTensorDescriptor(xd));
    DNN(cudnnDestroyTensorDescriptor(yd));
    DNN(cudnnDestroyFilterDescriptor(wd));

    /* misuse a GPU would punish */
    std::vector<float> host(2 * 4 * 8 * 8);
    CHECK(dies([&] {
              cudnnConvolutionForward(h, &one, D.x, x.d, D.w, w.d, D.conv, ALG, ws, bytes, &zero,
                                      D.y, host.data());
          }),
          "host y must fail");
    CHECK(dies([&] {
              std::vector<char> hw(bytes);
              cudnnConvolutionForward(h, &one, D.x, x.d, D.w, w.d, D.conv, ALG, hw.data(), bytes,
                                      &zero, D.y, y.d);
          }),
          "host workspace must fail");
    CHECK(dies([&] {
              cudnnConvolutionForward(h, &one, D.x, x.d, D.w, w.d, D.conv, ALG, y.d, bytes, &zero,
                                      D.y, y.d);
          }),
          "workspace overlapping y must fail");
    CHECK(dies([&] {
              cudnnConvolutionForward(h, &one, D.x, x.d, D.w, w.d, D.conv, ALG, ws, bytes, &zero,
                                      D.y, x.d);
          }),
          "in-place (y over x) must fail");
    CHECK(dies([&] {
              cudnnTensorDescriptor_t gone;
              cudnnCreateTensorDescriptor(&gone);
              cudnnSetTensor4dDescriptor(gone, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, 2, 4, 8, 8);
              cudnnDestroyTensorDescriptor(gone);
              cudnnConvolutionForward(h, &one, D.x, x.d, D.w, w.d, D.conv, ALG, ws, bytes, &zero,
                                      gone, y.d);
          }),
          "a destroyed descriptor must fail");

    CHECK(std::strcmp(cudnnGetErrorString(CUDNN_STATUS_BAD_PARAM), "CUDNN_STATUS_BAD_PARAM") == 0,
          "error string");
    dev_free(ws);
    DNN(cudnnDestroyTensorDescriptor(t));
    DNN(cudnnDestroyFilterDescriptor(f));
    DNN(cudnnDestroyConvolutionDescriptor(c));
    D.destroy();
}

/* ==== bfloat16 ==== */

/* bfloat16 bits <-> float, written here independently of the emulation: a bfloat16 is the top
 * half of a float. */
float from_bf16(uint16_t b) {
    const uint32_t u = (uint32_t)b << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t bits_of(float f) { /* f must be a bfloat16 value */
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return (uint16_t)(u >> 16);
}

/* Unit roundoff of bfloat16 (8 significant bits) and float. */
const double U_BF16 = std::ldexp(1.0, -8), U_F32 = std::ldexp(1.0, -24);

/* The emulation's roundings: ties to even, and from double in one rounding (a double just off a
 * bfloat16 midpoint that rounds onto it as a float must still go to its own side). */
void test_bf16_rounding() {
    CHECK(emu::bf16_from_float(1.0f) == 0x3f80, "1.0");
    CHECK(emu::bf16_from_float(1.0f + std::ldexp(1.0f, -8)) == 0x3f80,
          "1 + 2^-8 is a tie: to even (1.0)");
    CHECK(emu::bf16_from_float(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3f82,
          "1 + 3 2^-8 is a tie: to even (1 + 2^-6)");
    CHECK(emu::bf16_from_float(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)) == 0x3f81,
          "just above a tie rounds up");
    CHECK(emu::bf16_from_float(-2.5f) == 0xc020, "-2.5 is exact");
    CHECK(std::isnan(from_bf16(emu::bf16_from_float(NaN))), "NaN stays NaN");
    CHECK(emu::bf16_from_float(INFINITY) == 0x7f80, "infinity stays");
    const double above = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40);
    const double below = 1.0 + std::ldexp(1.0, -8) - std::ldexp(1.0, -40);
    CHECK((float)above == 1.0f + std::ldexp(1.0f, -8), "test premise: the float is the tie");
    CHECK(emu::bf16_from_double(above) == 0x3f81 && emu::bf16_from_double(below) == 0x3f80,
          "double just above / below a tie: %04x %04x, want 3f81 3f80",
          emu::bf16_from_double(above), emu::bf16_from_double(below));
    CHECK(emu::bf16_from_double(-above) == 0xbf81, "negative side");
    CHECK(emu::bf16_from_double(1.0 + std::ldexp(1.0, -8)) == 0x3f80, "an exact tie: to even");
}

/* A device buffer of bfloat16 with a host mirror of its values (as floats). */
struct Buf16 {
    std::vector<float> h; /* bfloat16 values */
    uint16_t *d = nullptr;
    explicit Buf16(size_t n) : h(n), d((uint16_t *)dev_alloc(n * 2)) {}
    ~Buf16() { dev_free(d); }
    Buf16(const Buf16 &) = delete;
    Buf16 &operator=(const Buf16 &) = delete;
    void random() { /* values that are bfloat16 already */
        for (float &v : h)
            v = from_bf16(bits_of(frand()) & 0xffffu);
        up();
    }
    void up() {
        for (size_t i = 0; i < h.size(); i++)
            d[i] = bits_of(h[i]);
    }
    void down() {
        for (size_t i = 0; i < h.size(); i++)
            h[i] = from_bf16(d[i]);
    }
};

/* cublasGemmEx with bfloat16 A and B, float accumulation, float or bfloat16 C: within float's
 * rounding of a k-term sum (gamma(k) sum |a||b|) of the exact product, and for a bfloat16 C one
 * rounding more (u_bf16 of the result). Unsupported combinations are refused. */
void test_gemm_ex() {
    cublasHandle_t h;
    CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS, "create");
    const int m = 9, n = 7, k = 300;
    Buf16 A((size_t)m * k), B((size_t)k * n), C16((size_t)m * n);
    Buf C((size_t)m * n);
    A.random();
    B.random();
    C.fill(NaN); /* beta 0: not read */
    const float one = 1.0f, zero = 0.0f;
    /* C = A B with bfloat16 A, the given lda, B's type, C, C's type, compute type and algorithm */
    auto ex = [&](int lda, cudaDataType bt, void *c, cudaDataType ct, cublasComputeType_t comp,
                  cublasGemmAlgo_t algo) {
        return cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, A.d, CUDA_R_16BF, lda, B.d,
                            bt, k, &zero, c, ct, m, comp, algo);
    };
    CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, A.d, CUDA_R_16BF, m, B.d,
                       CUDA_R_16BF, k, &zero, C.d, CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS,
          "bf16 x bf16 -> float");
    CHECK(ex(m, CUDA_R_16BF, C16.d, CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) ==
              CUBLAS_STATUS_SUCCESS,
          "bf16 x bf16 -> bf16");
    flush();
    C.down();
    C16.down();
    const double g = k * U_F32 / (1 - k * U_F32);
    int bad32 = 0, bad16 = 0;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0, sa = 0;
            for (int p = 0; p < k; p++) {
                s += (double)A.h[(size_t)p * m + i] * B.h[(size_t)j * k + p];
                sa += std::fabs((double)A.h[(size_t)p * m + i] * B.h[(size_t)j * k + p]);
            }
            const double c = C.h[(size_t)j * m + i], c16 = C16.h[(size_t)j * m + i];
            bad32 += !(std::fabs(c - s) <= g * sa);
            bad16 += !(std::fabs(c16 - s) <= g * sa + U_BF16 * (std::fabs(s) + g * sa));
        }
    CHECK(bad32 == 0, "bf16 GEMM, float C: %d elements beyond gamma(k) sum|a||b|", bad32);
    CHECK(bad16 == 0, "bf16 GEMM, bf16 C: %d elements beyond that plus one bf16 rounding", bad16);
    CHECK(ex(m, CUDA_R_16F, C.d, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) ==
              CUBLAS_STATUS_NOT_SUPPORTED,
          "mixed bf16 and half inputs");
    CHECK(ex(m, CUDA_R_16BF, C.d, CUDA_R_32F, CUBLAS_COMPUTE_16F, CUBLAS_GEMM_DEFAULT) ==
              CUBLAS_STATUS_NOT_SUPPORTED,
          "bf16 inputs with half compute");
    CHECK(ex(m, CUDA_R_16BF, C.d, CUDA_R_32F, CUBLAS_COMPUTE_32F, (cublasGemmAlgo_t)12345) ==
              CUBLAS_STATUS_INVALID_VALUE,
          "an algorithm that is not an enumerant");
    CHECK(ex(m - 1, CUDA_R_16BF, C.d, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) ==
              CUBLAS_STATUS_INVALID_VALUE,
          "lda below m");
    CHECK(dies([&] {
              std::vector<uint16_t> host((size_t)m * k);
              cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, host.data(), CUDA_R_16BF, m,
                           B.d, CUDA_R_16BF, k, &zero, C.d, CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT);
          }),
          "host A must fail");
    CHECK(dies([&] { /* a bf16 matrix read as if it were float runs past its allocation */
                     cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, A.d, CUDA_R_32F, m,
                                  B.d, CUDA_R_32F, k, &zero, C.d, CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT);
          }),
          "element size follows the data type");
    CHECK(cublasDestroy(h) == CUBLAS_STATUS_SUCCESS, "destroy");
}

/* Convolutions on bfloat16 data with float compute (PSEUDO_BFLOAT16_CONFIG), NHWC: each result
 * is the exact sum of the bfloat16 products rounded once to bfloat16, so within u_bf16 of the
 * exact value; and only the tensor-core algorithms take it. */
void test_conv_bf16(cudnnHandle_t h) {
    const Shape S = {2, 6, 7, 6, 4, 3, 3, 1, 1, 2, 2, 1, 1};
    const cudnnTensorFormat_t F = CUDNN_TENSOR_NHWC;
    cudnnTensorDescriptor_t xd, yd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    DNN(cudnnCreateTensorDescriptor(&xd));
    DNN(cudnnCreateTensorDescriptor(&yd));
    DNN(cudnnCreateFilterDescriptor(&wd));
    DNN(cudnnCreateConvolutionDescriptor(&cd));
    DNN(cudnnSetTensor4dDescriptor(xd, F, CUDNN_DATA_BFLOAT16, S.n, S.c, S.h, S.w));
    DNN(cudnnSetTensor4dDescriptor(yd, F, CUDNN_DATA_BFLOAT16, S.n, S.k, S.oh(), S.ow()));
    DNN(cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_BFLOAT16, F, S.k, S.c, S.r, S.s));
    DNN(cudnnSetConvolution2dDescriptor(cd, S.ph, S.pw, S.u, S.v, S.dh, S.dw,
                                        CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    DNN(cudnnSetConvolutionMathType(cd, CUDNN_TENSOR_OP_MATH));
    Logical X(S.n, S.c, S.h, S.w), W(S.k, S.c, S.r, S.s), DY(S.n, S.k, S.oh(), S.ow());
    Buf16 x(X.a.size()), w(W.a.size()), dy(DY.a.size()), y(DY.a.size()), dx(X.a.size()),
        dw(W.a.size());
    x.random();
    w.random();
    dy.random();
    /* the logical arrays from the device layout (NHWC, KRSC) */
    each(X, [&](int i, int j, int k, int l) { X.at(i, j, k, l) = x.h[offset(F, X, i, j, k, l)]; });
    each(W, [&](int i, int j, int k, int l) { W.at(i, j, k, l) = w.h[offset(F, W, i, j, k, l)]; });
    each(DY,
         [&](int i, int j, int k, int l) { DY.at(i, j, k, l) = dy.h[offset(F, DY, i, j, k, l)]; });
    Logical Yr(S.n, S.k, S.oh(), S.ow()), DXr(S.n, S.c, S.h, S.w), DWr(S.k, S.c, S.r, S.s);
    ref_forward(S, false, X, W, Yr);
    ref_backward_data(S, false, W, DY, DXr);
    ref_backward_filter(S, false, X, DY, DWr);

    int got = 0;
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    DNN(cudnnGetConvolutionForwardAlgorithm_v7(h, xd, wd, cd, yd, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                               &got, perf));
    int ok = 0;
    for (int i = 0; i < got; i++)
        ok += perf[i].status == CUDNN_STATUS_SUCCESS;
    CHECK(ok == 1 && perf[0].algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
          "bf16 NHWC forward: IMPLICIT_PRECOMP_GEMM alone (%d usable, first %d)", ok,
          (int)perf[0].algo);
    /* The math type: cuDNN documents tensor-op math for half-width data only with C and K
     * multiples of 8; for 6 -> 4 channels it chooses, and the emulation answers as cuDNN 9.19
     * did on an H100: default math forward and backward-filter (C = 6), tensor-op math
     * backward-data. */
    CHECK(perf[0].mathType == CUDNN_DEFAULT_MATH, "bf16 6 -> 4 channels forward: math %d",
          (int)perf[0].mathType);
    {
        cudnnConvolutionBwdDataAlgoPerf_t pd[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        cudnnConvolutionBwdFilterAlgoPerf_t pf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        int nd = 0, nf = 0;
        DNN(cudnnGetConvolutionBackwardDataAlgorithm_v7(
            h, wd, yd, cd, xd, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &nd, pd));
        DNN(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
            h, xd, yd, cd, wd, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &nf, pf));
        CHECK(pd[0].algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1 &&
                  pd[0].mathType == CUDNN_TENSOR_OP_MATH,
              "bf16 6 -> 4 channels backward-data: algo %d math %d", (int)pd[0].algo,
              (int)pd[0].mathType);
        CHECK(pf[0].algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 &&
                  pf[0].mathType == CUDNN_DEFAULT_MATH,
              "bf16 6 -> 4 channels backward-filter: algo %d math %d", (int)pf[0].algo,
              (int)pf[0].mathType);
        /* 8 -> 16 channels meet the documented requirements: tensor-op math in every direction */
        cudnnTensorDescriptor_t x8, y8;
        cudnnFilterDescriptor_t w8;
        DNN(cudnnCreateTensorDescriptor(&x8));
        DNN(cudnnCreateTensorDescriptor(&y8));
        DNN(cudnnCreateFilterDescriptor(&w8));
        DNN(cudnnSetTensor4dDescriptor(x8, F, CUDNN_DATA_BFLOAT16, S.n, 8, S.h, S.w));
        DNN(cudnnSetTensor4dDescriptor(y8, F, CUDNN_DATA_BFLOAT16, S.n, 16, S.oh(), S.ow()));
        DNN(cudnnSetFilter4dDescriptor(w8, CUDNN_DATA_BFLOAT16, F, 16, 8, S.r, S.s));
        DNN(cudnnGetConvolutionForwardAlgorithm_v7(h, x8, w8, cd, y8,
                                                   CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, perf));
        DNN(cudnnGetConvolutionBackwardDataAlgorithm_v7(
            h, w8, y8, cd, x8, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &nd, pd));
        DNN(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
            h, x8, y8, cd, w8, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &nf, pf));
        CHECK(perf[0].mathType == CUDNN_TENSOR_OP_MATH && pd[0].mathType == CUDNN_TENSOR_OP_MATH &&
                  pf[0].mathType == CUDNN_TENSOR_OP_MATH,
              "bf16 8 -> 16 channels: tensor-op math in every direction (%d %d %d)",
              (int)perf[0].mathType, (int)pd[0].mathType, (int)pf[0].mathType);
        DNN(cudnnDestroyTensorDescriptor(x8));
        DNN(cudnnDestroyTensorDescriptor(y8));
        DNN(cudnnDestroyFilterDescriptor(w8));
    }
    size_t b1 = 0, b2 = 0, b3 = 0;
    DNN(cudnnGetConvolutionForwardWorkspaceSize(
        h, xd, wd, cd, yd, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, &b1));
    DNN(cudnnGetConvolutionBackwardDataWorkspaceSize(h, wd, yd, cd, xd,
                                                     CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, &b2));
    DNN(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, xd, yd, cd, wd,
                                                       CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, &b3));
    void *ws = dev_alloc(std::max({b1, b2, b3}));
    const float one = 1.0f, zero = 0.0f;
    DNN(cudnnConvolutionForward(h, &one, xd, x.d, wd, w.d, cd,
                                CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, ws, b1, &zero, yd,
                                y.d));
    DNN(cudnnConvolutionBackwardData(h, &one, wd, w.d, yd, dy.d, cd,
                                     CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, ws, b2, &zero, xd, dx.d));
    DNN(cudnnConvolutionBackwardFilter(h, &one, xd, x.d, yd, dy.d, cd,
                                       CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, ws, b3, &zero, wd,
                                       dw.d));
    flush();
    y.down();
    dx.down();
    dw.down();
    /* one rounding to bfloat16 of the exact sum (the double reference's own error is ~2^-50) */
    auto within = [&](Buf16 &got_b, Logical &ref) {
        int bad = 0;
        each(ref, [&](int i, int j, int k, int l) {
            const double r = ref.at(i, j, k, l), g = got_b.h[offset(F, ref, i, j, k, l)];
            bad += !(std::fabs(g - r) <= U_BF16 * std::fabs(r) * (1 + 1e-12) + 1e-300);
        });
        return bad;
    };
    CHECK(within(y, Yr) == 0, "bf16 forward: beyond one bfloat16 rounding");
    CHECK(within(dx, DXr) == 0, "bf16 backward data: beyond one bfloat16 rounding");
    CHECK(within(dw, DWr) == 0, "bf16 backward filter: beyond one bfloat16 rounding");
    const auto NS = CUDNN_STATUS_NOT_SUPPORTED;
    size_t b = 0;
    CHECK(cudnnGetConvolutionForwardWorkspaceSize(
              h, xd, wd, cd, yd, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, &b) == NS,
          "bf16 with IMPLICIT_GEMM");
    CHECK(cudnnConvolutionBackwardFilter(h, &one, xd, x.d, yd, dy.d, cd,
                                         CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, ws, b3, &zero, wd,
                                         dw.d) == NS,
          "bf16 backward filter with ALGO_0");
    DNN(cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_BFLOAT16, S.n, S.c, S.h, S.w));
    DNN(cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_BFLOAT16, S.n, S.k, S.oh(),
                                   S.ow()));
    DNN(cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_BFLOAT16, CUDNN_TENSOR_NCHW, S.k, S.c, S.r, S.s));
    CHECK(cudnnGetConvolutionForwardWorkspaceSize(
              h, xd, wd, cd, yd, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, &b) == NS,
          "bf16 NCHW is not emulated");
    DNN(cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, S.k, S.c, S.r, S.s));
    CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, xd, wd, cd, yd,
                                                  CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
                                                  &b) == CUDNN_STATUS_BAD_PARAM,
          "bf16 tensors with a float filter");
    dev_free(ws);
    DNN(cudnnDestroyTensorDescriptor(xd));
    DNN(cudnnDestroyTensorDescriptor(yd));
    DNN(cudnnDestroyFilterDescriptor(wd));
    DNN(cudnnDestroyConvolutionDescriptor(cd));
}

/* cudnnGet*AlgorithmMaxCount: every algorithm of the direction. */
void test_max_count(cudnnHandle_t h) {
    int f = 0, d = 0, w = 0;
    DNN(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &f));
    DNN(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &d));
    DNN(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &w));
    CHECK(f == CUDNN_CONVOLUTION_FWD_ALGO_COUNT && d == CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT &&
              w == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
          "max counts %d %d %d", f, d, w);
    CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, nullptr) == CUDNN_STATUS_BAD_PARAM,
          "NULL count");
}

/* The stale heuristics entry (MGT_EMU_CUDNN_STALE): ranked first with SUCCESS, its workspace
 * query answers, its compute call alone says NOT_SUPPORTED, and the next entry runs. By default
 * it appears for NHWC float inputs with an odd channel count above one only. */
void test_stale(cudnnHandle_t h) {
    auto first = [&](const Shape &S, cudnnConvolutionFwdAlgoPerf_t *perf, int *got) {
        Descs D(S, CUDNN_TENSOR_NHWC, CUDNN_TENSOR_NHWC, false);
        DNN(cudnnGetConvolutionForwardAlgorithm_v7(h, D.x, D.w, D.conv, D.y,
                                                   CUDNN_CONVOLUTION_FWD_ALGO_COUNT, got, perf));
        D.destroy();
    };
    const Shape odd = {2, 3, 6, 6, 4, 3, 3, 1, 1, 1, 1, 1, 1},
                even = {2, 4, 6, 6, 4, 3, 3, 1, 1, 1, 1, 1, 1};
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int got = 0;
    unsetenv("MGT_EMU_CUDNN_STALE");
    first(odd, perf, &got);
    CHECK(perf[0].algo == CUDNN_CONVOLUTION_FWD_ALGO_GEMM && perf[0].status == 0,
          "odd channels: GEMM (not an NHWC-filter algorithm) offered first, got %d",
          (int)perf[0].algo);
    first(even, perf, &got);
    CHECK(perf[0].algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
          "even channels: no stale entry, got %d first", (int)perf[0].algo);
    setenv("MGT_EMU_CUDNN_STALE", "all", 1);
    Descs D(even, CUDNN_TENSOR_NHWC, CUDNN_TENSOR_NHWC, false);
    DNN(cudnnGetConvolutionForwardAlgorithm_v7(h, D.x, D.w, D.conv, D.y,
                                               CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, perf));
    CHECK(perf[0].status == CUDNN_STATUS_SUCCESS && perf[0].memory > 0 &&
              perf[0].algo == CUDNN_CONVOLUTION_FWD_ALGO_GEMM,
          "MGT_EMU_CUDNN_STALE=all: the stale GEMM first, got %d", (int)perf[0].algo);
    size_t bytes = 0, next = 0;
    DNN(cudnnGetConvolutionForwardWorkspaceSize(h, D.x, D.w, D.conv, D.y, perf[0].algo, &bytes));
    DNN(cudnnGetConvolutionForwardWorkspaceSize(h, D.x, D.w, D.conv, D.y, perf[1].algo, &next));
    CHECK(bytes == perf[0].memory, "its workspace query answers");
    Buf x(2 * 4 * 36), w(4 * 4 * 9), y(2 * 4 * 36);
    x.random();
    w.random();
    void *ws = dev_alloc(std::max(bytes, next));
    const float one = 1.0f, zero = 0.0f;
    CHECK(cudnnConvolutionForward(h, &one, D.x, x.d, D.w, w.d, D.conv, perf[0].algo, ws, bytes,
                                  &zero, D.y, y.d) == CUDNN_STATUS_NOT_SUPPORTED,
          "the stale entry fails to run");
    char msg[512];
    cudnnGetLastErrorString(msg, sizeof msg);
    CHECK(std::strstr(msg, "stale") != nullptr, "the last error says why: '%s'", msg);
    CHECK(cudnnConvolutionForward(h, &one, D.x, x.d, D.w, w.d, D.conv, perf[1].algo, ws, next,
                                  &zero, D.y, y.d) == CUDNN_STATUS_SUCCESS,
          "the next entry (%d) runs", (int)perf[1].algo);
    flush();
    cudnnConvolutionBwdDataAlgoPerf_t bd[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    DNN(cudnnGetConvolutionBackwardDataAlgorithm_v7(
        h, D.w, D.y, D.conv, D.x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got, bd));
    CHECK(bd[0].status == 0 && bd[0].determinism == CUDNN_DETERMINISTIC &&
              bd[0].algo != CUDNN_CONVOLUTION_BWD_DATA_ALGO_1,
          "backward data: a stale deterministic entry first (%d)", (int)bd[0].algo);
    setenv("MGT_EMU_CUDNN_STALE", "none", 1);
    Descs D2(odd, CUDNN_TENSOR_NHWC, CUDNN_TENSOR_NHWC, false);
    DNN(cudnnGetConvolutionForwardAlgorithm_v7(h, D2.x, D2.w, D2.conv, D2.y,
                                               CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, perf));
    CHECK(perf[0].algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
          "MGT_EMU_CUDNN_STALE=none: no stale entry even for odd channels");
    dev_free(ws);
    D.destroy();
    D2.destroy();
}

/* ==== cuDNN's backend (graph) API ==== */

using Dims = std::array<int64_t, 4>;

Dims packed(const Dims &d) {
    return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1};
}

/* Builds graphs through the backend API as a caller does (every call checked with DNN unless
 * its status is the point), and destroys what it made. */
struct Backend {
    std::vector<cudnnBackendDescriptor_t> made;
    int64_t next_virtual = 1000;

    ~Backend() {
        for (auto it = made.rbegin(); it != made.rend(); ++it)
            DNN(cudnnBackendDestroyDescriptor(*it));
    }
    cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t t) {
        cudnnBackendDescriptor_t d = nullptr;
        DNN(cudnnBackendCreateDescriptor(t, &d));
        made.push_back(d);
        return d;
    }
    /* Destroys every descriptor made so far but those in keep. */
    void destroy_except(std::initializer_list<cudnnBackendDescriptor_t> keep) {
        std::vector<cudnnBackendDescriptor_t> kept;
        for (cudnnBackendDescriptor_t d : made)
            if (std::find(keep.begin(), keep.end(), d) != keep.end())
                kept.push_back(d);
            else
                DNN(cudnnBackendDestroyDescriptor(d));
        made = kept;
    }
    void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a,
             cudnnBackendAttributeType_t t, int64_t n, const void *v) {
        DNN(cudnnBackendSetAttribute(d, a, t, n, v));
    }
    void set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a,
                  cudnnBackendDescriptor_t v) {
        set(d, a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
    }
    /* A tensor, not finalized: uid 0 takes the next virtual id. */
    cudnnBackendDescriptor_t tensor_unfinalized(int64_t uid, cudnnDataType_t type, const Dims &dim,
                                                const Dims &str, bool virt, bool by_value,
                                                int64_t align) {
        cudnnBackendDescriptor_t d = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
        if (!uid)
            uid = next_virtual++;
        const bool v = virt, bv = by_value;
        set(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
        set(d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim.data());
        set(d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, str.data());
        set(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
        set(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
        set(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v);
        if (by_value)
            set(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &bv);
        return d;
    }
    cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t type, const Dims &dim,
                                    const Dims &str, bool virt, bool by_value = false,
                                    int64_t align = 16) {
        cudnnBackendDescriptor_t d = tensor_unfinalized(uid, type, dim, str, virt, by_value, align);
        DNN(cudnnBackendFinalize(d));
        return d;
    }
    cudnnBackendDescriptor_t scalar(int64_t uid) {
        return tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
    }
    cudnnBackendDescriptor_t virt(cudnnDataType_t type, const Dims &dim) {
        return tensor(0, type, dim, packed(dim), true);
    }
    /* y = mode(x[, b[, t]]) in prec, not finalized. */
    cudnnBackendDescriptor_t pointwise_op(cudnnPointwiseMode_t mode, cudnnDataType_t prec,
                                          cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                                          cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                                          int64_t axis = -1) {
        cudnnBackendDescriptor_t pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
        set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
        set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
        if (axis >= 0)
            set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
        DNN(cudnnBackendFinalize(pw));
        cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
        set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
        set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
        if (b)
            set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
        if (t)
            set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
        set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
        const float one = 1.0f;
        set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one);
        return op;
    }
    cudnnBackendDescriptor_t pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t prec,
                                       cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                                       cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                                       int64_t axis = -1) {
        cudnnBackendDescriptor_t op = pointwise_op(mode, prec, x, b, t, y, axis);
        DNN(cudnnBackendFinalize(op));
        return op;
    }
    /* c = a b, not finalized. */
    cudnnBackendDescriptor_t matmul_op(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                                       cudnnBackendDescriptor_t c) {
        const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
        cudnnBackendDescriptor_t mm = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
        set(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
        DNN(cudnnBackendFinalize(mm));
        cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
        set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
        set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
        set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
        set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
        return op;
    }
    cudnnBackendDescriptor_t matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                                    cudnnBackendDescriptor_t c) {
        cudnnBackendDescriptor_t op = matmul_op(a, b, c);
        DNN(cudnnBackendFinalize(op));
        return op;
    }
    cudnnBackendDescriptor_t reduce(cudnnReduceTensorOp_t how, cudnnBackendDescriptor_t x,
                                    cudnnBackendDescriptor_t y) {
        const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
        cudnnBackendDescriptor_t r = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
        set(r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &how);
        set(r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
        DNN(cudnnBackendFinalize(r));
        cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
        set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
        set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
        set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, r);
        DNN(cudnnBackendFinalize(op));
        return op;
    }
    cudnnBackendDescriptor_t reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
        cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
        set_desc(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
        set_desc(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
        DNN(cudnnBackendFinalize(op));
        return op;
    }
    /* The operation graph of ops; its finalize status in *st (or checked). */
    cudnnBackendDescriptor_t graph(cudnnHandle_t h,
                                   const std::vector<cudnnBackendDescriptor_t> &ops,
                                   cudnnStatus_t *st = nullptr) {
        cudnnBackendDescriptor_t g = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
        set(g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
        set(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, (int64_t)ops.size(),
            ops.data());
        if (st)
            *st = cudnnBackendFinalize(g);
        else
            DNN(cudnnBackendFinalize(g));
        return g;
    }
    /* The heuristics' engine configurations for g, best first. */
    std::vector<cudnnBackendDescriptor_t> configs(cudnnBackendDescriptor_t g) {
        cudnnBackendDescriptor_t heur = make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
        const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
        set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, g);
        set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
        DNN(cudnnBackendFinalize(heur));
        int64_t count = -1;
        DNN(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                     CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
        std::vector<cudnnBackendDescriptor_t> cfg;
        for (int64_t i = 0; i < count; i++)
            cfg.push_back(make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
        if (count > 0) {
            int64_t got = -1;
            DNN(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                         CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, cfg.data()));
            CHECK(got == count, "the heuristics said %lld configurations, then %lld",
                  (long long)count, (long long)got);
        }
        return cfg;
    }
    /* The execution plan of cfg; its finalize status. */
    cudnnStatus_t plan(cudnnHandle_t h, cudnnBackendDescriptor_t cfg,
                       cudnnBackendDescriptor_t *out) {
        cudnnBackendDescriptor_t p = make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        set(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
        set_desc(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg);
        *out = p;
        return cudnnBackendFinalize(p);
    }
    int64_t workspace(cudnnBackendDescriptor_t plan) {
        int64_t ws = -1, n = 0;
        DNN(cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                     CUDNN_TYPE_INT64, 1, &n, &ws));
        return ws;
    }
    /* A finalized variant pack; its finalize status in *st (or checked). */
    cudnnBackendDescriptor_t pack(const std::vector<int64_t> &uids, const std::vector<void *> &ptrs,
                                  void *ws, cudnnStatus_t *st = nullptr) {
        cudnnBackendDescriptor_t v = make(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
        set(v, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, (int64_t)uids.size(),
            uids.data());
        set(v, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, (int64_t)ptrs.size(),
            ptrs.data());
        set(v, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
        if (st)
            *st = cudnnBackendFinalize(v);
        else
            DNN(cudnnBackendFinalize(v));
        return v;
    }
};

/* The last error's message contains `what`. */
bool last_error_says(const char *what) {
    char msg[512];
    cudnnGetLastErrorString(msg, sizeof msg);
    const bool ok = std::strstr(msg, what) != nullptr;
    if (!ok)
        std::printf("  (last error: '%s', expected it to name '%s')\n", msg, what);
    return ok;
}

/* A causal attention forward through the backend API, as mgtrain's fused path builds it: Q, K
 * and V interleaved per token ([b][s][3c], K^T by strides), S = Q K^T scaled by a by-value
 * scalar, the causal mask from GEN_INDEX, CMP_GE and BINARY_SELECT with a by-value -inf, the
 * softmax's statistics (Stats = max + log sum, float, in memory), P = E / l rounded to bfloat16,
 * O = P V in bfloat16. The operations are given in reverse: the graph orders them. Against a
 * double reference: O within one bfloat16 rounding of P (in the sum) and one of O, plus a float
 * allowance for the exponentials; Stats within float roundings. */
void test_graph_attention(cudnnHandle_t h) {
    const int64_t B = 2, H = 2, S = 12, D = 16, C = H * D;
    Buf16 qkv((size_t)(B * S * 3 * C)), o((size_t)(B * S * C));
    Buf stats((size_t)(B * H * S));
    qkv.random();
    const Dims qd{B, H, S, D}, qs{S * 3 * C, D, 3 * C, 1};
    const Dims ktd{B, H, D, S}, kts{S * 3 * C, D, 1, 3 * C};
    const Dims os{S * C, D, C, 1};
    const Dims sd{B, H, S, S}, ld{B, H, S, 1}, ls{H * S, S, 1, 1};
    enum { U_Q = 1, U_K, U_V, U_O, U_STATS, U_SCALE, U_NEGINF };
    const auto BF = CUDNN_DATA_BFLOAT16, F = CUDNN_DATA_FLOAT;
    Backend be;
    auto Q = be.tensor(U_Q, BF, qd, qs, false), KT = be.tensor(U_K, BF, ktd, kts, false);
    auto V = be.tensor(U_V, BF, qd, qs, false), O = be.tensor(U_O, BF, qd, os, false);
    auto ST = be.tensor(U_STATS, F, ld, ls, false);
    auto scale = be.scalar(U_SCALE), neginf = be.scalar(U_NEGINF);
    std::vector<cudnnBackendDescriptor_t> ops;
    auto s0 = be.virt(F, sd), s1 = be.virt(F, sd), s2 = be.virt(F, sd);
    ops.push_back(be.matmul(Q, KT, s0));
    ops.push_back(be.pointwise(CUDNN_POINTWISE_MUL, F, s0, scale, nullptr, s1));
    auto row = be.virt(CUDNN_DATA_INT32, sd), col = be.virt(CUDNN_DATA_INT32, sd);
    auto keep = be.virt(CUDNN_DATA_BOOLEAN, sd);
    ops.push_back(be.pointwise(CUDNN_POINTWISE_GEN_INDEX, F, s1, nullptr, nullptr, row, 2));
    ops.push_back(be.pointwise(CUDNN_POINTWISE_GEN_INDEX, F, s1, nullptr, nullptr, col, 3));
    ops.push_back(
        be.pointwise(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, nullptr, keep));
    ops.push_back(be.pointwise(CUDNN_POINTWISE_BINARY_SELECT, F, s1, neginf, keep, s2));
    auto m = be.virt(F, ld), sm = be.virt(F, sd), e = be.virt(F, sd), l = be.virt(F, ld);
    auto logl = be.virt(F, ld), p = be.virt(BF, sd);
    ops.push_back(be.reduce(CUDNN_REDUCE_TENSOR_MAX, s2, m));
    ops.push_back(be.pointwise(CUDNN_POINTWISE_SUB, F, s2, m, nullptr, sm));
    ops.push_back(be.pointwise(CUDNN_POINTWISE_EXP, F, sm, nullptr, nullptr, e));
    ops.push_back(be.reduce(CUDNN_REDUCE_TENSOR_ADD, e, l));
    ops.push_back(be.pointwise(CUDNN_POINTWISE_LOG, F, l, nullptr, nullptr, logl));
    ops.push_back(be.pointwise(CUDNN_POINTWISE_ADD, F, m, logl, nullptr, ST));
    ops.push_back(be.pointwise(CUDNN_POINTWISE_DIV, F, e, l, nullptr, p));
    ops.push_back(be.matmul(p, V, O));
    std::reverse(ops.begin(), ops.end());
    auto g = be.graph(h, ops);
    int64_t engines = 0, n = 0;
    DNN(cudnnBackendGetAttribute(g, CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT, CUDNN_TYPE_INT64,
                                 1, &n, &engines));
    CHECK(n == 1 && engines == 2, "ENGINE_GLOBAL_COUNT: %lld (%lld elements)", (long long)engines,
          (long long)n);
    auto cfg = be.configs(g);
    CHECK(cfg.size() == 2, "a bfloat16 attention graph: %zu configurations, want 2", cfg.size());
    if (cfg.size() != 2)
        return;
    auto eng = be.make(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    DNN(cudnnBackendGetAttribute(cfg[1], CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                 1, &n, &eng));
    int64_t index = -1;
    DNN(cudnnBackendGetAttribute(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n,
                                 &index));
    CHECK(index == 1, "the second configuration's engine is %lld, want 1", (long long)index);
    cudnnBackendDescriptor_t plan = nullptr;
    DNN(be.plan(h, cfg[0], &plan));
    const int64_t wsb = be.workspace(plan);
    CHECK(wsb >= 4096 && wsb % 256 == 0, "the plan's workspace: %lld bytes", (long long)wsb);
    /* the plan holds all it needs: every other descriptor may go first */
    be.destroy_except({plan});
    void *ws = dev_alloc((size_t)wsb);
    std::memset(ws, 0, (size_t)wsb);
    float scale_v = 1.0f / std::sqrt((float)D), ninf = -INFINITY;
    const uint16_t *q = qkv.d;
    auto pk = be.pack(
        {U_Q, U_K, U_V, U_O, U_STATS, U_SCALE, U_NEGINF},
        {(void *)q, (void *)(q + C), (void *)(q + 2 * C), o.d, stats.d, &scale_v, &ninf}, ws);
    DNN(cudnnBackendExecute(h, plan, pk));
    scale_v = 9.0f; /* the scalars are read at the call */
    ninf = 0.0f;
    flush();
    o.down();
    stats.down();
    CHECK(((unsigned char *)ws)[0] == 0xff && ((unsigned char *)ws)[wsb - 1] == 0xff,
          "the workspace is overwritten, as a GPU would");
    const double sc = 1.0 / std::sqrt((double)D);
    int bad_o = 0, bad_s = 0;
    double worst = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t hh = 0; hh < H; hh++)
            for (int64_t i = 0; i < S; i++) {
                auto at = [&](int64_t tok, int part, int64_t k) {
                    return (double)qkv.h[(size_t)((b * S + tok) * 3 * C + part * C + hh * D + k)];
                };
                std::vector<double> s(i + 1);
                double mx = -INFINITY, smax = 0;
                for (int64_t j = 0; j <= i; j++) { /* causal: keys up to the query's position */
                    double acc = 0;
                    for (int64_t k = 0; k < D; k++)
                        acc += at(i, 0, k) * at(j, 1, k);
                    s[j] = acc * sc;
                    mx = std::max(mx, s[j]);
                    smax = std::max(smax, std::fabs(s[j]));
                }
                double sum = 0;
                for (int64_t j = 0; j <= i; j++)
                    sum += std::exp(s[j] - mx);
                const double lse = mx + std::log(sum);
                const double got_s = stats.h[(size_t)(b * H * S + hh * S + i)];
                const double tol_s = 64 * U_F32 * (4 + std::fabs(mx) + std::log(sum) + smax);
                bad_s += !(std::fabs(got_s - lse) <= tol_s);
                for (int64_t k = 0; k < D; k++) {
                    double ref = 0, mag = 0; /* O and sum_j P |v| */
                    for (int64_t j = 0; j <= i; j++) {
                        const double pj = std::exp(s[j] - mx) / sum;
                        ref += pj * at(j, 2, k);
                        mag += pj * std::fabs(at(j, 2, k));
                    }
                    const double got = o.h[(size_t)((b * S + i) * C + hh * D + k)];
                    const double tol =
                        U_BF16 * std::fabs(ref) + (U_BF16 * (1 + U_BF16) + 64 * U_F32) * mag;
                    bad_o += !(std::fabs(got - ref) <= tol);
                    worst = std::max(worst, std::fabs(got - ref) / tol);
                }
            }
    CHECK(bad_o == 0, "attention O: %d elements beyond the bound (worst at %.2f of it)", bad_o,
          worst);
    CHECK(bad_s == 0, "attention Stats: %d rows beyond float roundings", bad_s);
    CHECK(worst > 0.0, "the bound is not vacuous: O differs from the exact result somewhere");
    dev_free(ws);
}

/* A reshape that transposes a virtual tensor, and one that views a tensor in memory through
 * other strides: P = X (float, virtual), dV = reshape(P)^T dO with the transpose a bfloat16
 * virtual view; dQ = P K with K the [s][d] view of a K^T descriptor, P reaching the matmul
 * rounded to bfloat16 (a float virtual input beside a 16-bit one). Both products are exact sums
 * rounded once: dV within a bfloat16 rounding, dQ (float) within a float one. */
void test_graph_reshape(cudnnHandle_t h) {
    const int64_t B = 2, H = 1, SQ = 6, SKV = 10, D = 8;
    Buf x((size_t)(B * H * SQ * SKV)), dq((size_t)(B * H * SQ * D));
    Buf16 dO((size_t)(B * H * SQ * D)), k((size_t)(B * H * SKV * D)), dv((size_t)(B * H * SKV * D));
    x.random();
    dO.random();
    k.random();
    const auto BF = CUDNN_DATA_BFLOAT16, F = CUDNN_DATA_FLOAT;
    const Dims xd{B, H, SQ, SKV}, od{B, H, SQ, D}, kd{B, H, SKV, D}, ktd{B, H, D, SKV};
    const Dims kts{H * SKV * D, SKV * D, 1, D}, ptd{B, H, SKV, SQ},
        pts{H * SQ * SKV, SQ * SKV, 1, SKV};
    enum { U_X = 1, U_DO, U_K, U_DV, U_DQ };
    Backend be;
    auto X = be.tensor(U_X, F, xd, packed(xd), false),
         DO = be.tensor(U_DO, BF, od, packed(od), false);
    auto KT = be.tensor(U_K, BF, ktd, kts, false), DV = be.tensor(U_DV, BF, kd, packed(kd), false);
    auto DQ = be.tensor(U_DQ, F, od, packed(od), false);
    auto P = be.virt(F, xd), PT = be.tensor(0, BF, ptd, pts, true), K = be.virt(BF, kd);
    std::vector<cudnnBackendDescriptor_t> ops = {
        be.matmul(P, K, DQ), be.reshape(KT, K), be.matmul(PT, DO, DV), be.reshape(P, PT),
        be.pointwise(CUDNN_POINTWISE_IDENTITY, F, X, nullptr, nullptr, P)};
    auto g = be.graph(h, ops);
    auto cfg = be.configs(g);
    CHECK(cfg.size() == 2, "the reshape graph: %zu configurations, want 2", cfg.size());
    if (cfg.empty())
        return;
    cudnnBackendDescriptor_t plan = nullptr;
    DNN(be.plan(h, cfg.back(), &plan));
    void *ws = dev_alloc((size_t)be.workspace(plan));
    auto pk = be.pack({U_X, U_DO, U_K, U_DV, U_DQ}, {x.d, dO.d, k.d, dv.d, dq.d}, ws);
    DNN(cudnnBackendExecute(h, plan, pk));
    flush();
    dv.down();
    dq.down();
    /* P rounded to bfloat16 */
    auto p16 = [&](int64_t b, int64_t i, int64_t j) {
        return (double)from_bf16(emu::bf16_from_float(x.h[(size_t)((b * SQ + i) * SKV + j)]));
    };
    int bad_v = 0, bad_q = 0;
    for (int64_t b = 0; b < B; b++) {
        for (int64_t j = 0; j < SKV; j++)
            for (int64_t c = 0; c < D; c++) {
                double ref = 0;
                for (int64_t i = 0; i < SQ; i++)
                    ref += p16(b, i, j) * dO.h[(size_t)((b * SQ + i) * D + c)];
                const double got = dv.h[(size_t)((b * SKV + j) * D + c)];
                bad_v += !(std::fabs(got - ref) <= U_BF16 * std::fabs(ref) * (1 + 1e-12) + 1e-300);
            }
        for (int64_t i = 0; i < SQ; i++)
            for (int64_t c = 0; c < D; c++) {
                double ref = 0;
                for (int64_t j = 0; j < SKV; j++)
                    ref += p16(b, i, j) * k.h[(size_t)((b * SKV + j) * D + c)];
                const double got = dq.h[(size_t)((b * SQ + i) * D + c)];
                bad_q += !(std::fabs(got - ref) <= U_F32 * std::fabs(ref) * (1 + 1e-12) + 1e-300);
            }
    }
    CHECK(bad_v == 0, "dV = reshape(P)^T dO: %d elements beyond one bfloat16 rounding", bad_v);
    CHECK(bad_q == 0, "dQ = P K (P as bfloat16): %d elements beyond one float rounding", bad_q);
    dev_free(ws);
}

/* C = A B on [1, 1, 8, 8] tensors of type t (uids 1, 2, 3), or with a by-value scalar (uid 4):
 * C = A * s, a graph without a matmul. */
struct Small {
    Backend be;
    cudnnBackendDescriptor_t g = nullptr;
    explicit Small(cudnnHandle_t h, cudnnDataType_t t, bool scaled = false) {
        const Dims d{1, 1, 8, 8};
        auto a = be.tensor(1, t, d, packed(d), false), c = be.tensor(3, t, d, packed(d), false);
        if (scaled) {
            auto s = be.scalar(4);
            g = be.graph(h,
                         {be.pointwise(CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, a, s, nullptr, c)});
        } else {
            auto b = be.tensor(2, t, d, packed(d), false);
            g = be.graph(h, {be.matmul(a, b, c)});
        }
    }
};

/* What the engines take (engine counts, MGT_EMU_CUDNN_NO_ENGINE, MGT_EMU_CUDNN_STALE) and what a
 * variant pack must hold (statuses, and the misuse a GPU would fault on). */
void test_graph_engines(cudnnHandle_t h) {
    { /* float matmul inputs: no engine, and the last error says why */
        Small s(h, CUDNN_DATA_FLOAT);
        CHECK(s.be.configs(s.g).empty(), "float matmul inputs: no engine");
        CHECK(last_error_says("16-bit"), "the heuristics' last error names the rule");
        auto eng = s.be.make(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
        const int64_t zero = 0;
        s.be.set_desc(eng, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, s.g);
        s.be.set(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &zero);
        CHECK(cudnnBackendFinalize(eng) == CUDNN_STATUS_NOT_SUPPORTED,
              "an engine made by its index refuses the float graph too");
    }
    { /* a head dimension that is not a multiple of 8 */
        Backend be;
        const Dims a{1, 1, 8, 12}, b{1, 1, 12, 8}, c{1, 1, 8, 8};
        auto A = be.tensor(1, CUDNN_DATA_BFLOAT16, a, packed(a), false);
        auto Bt = be.tensor(2, CUDNN_DATA_BFLOAT16, b, packed(b), false);
        auto Ct = be.tensor(3, CUDNN_DATA_BFLOAT16, c, packed(c), false);
        CHECK(be.configs(be.graph(h, {be.matmul(A, Bt, Ct)})).empty(),
              "head dimension 12: no engine");
    }
    {
        setenv("MGT_EMU_CUDNN_NO_ENGINE", "1", 1);
        Small s(h, CUDNN_DATA_BFLOAT16);
        CHECK(s.be.configs(s.g).empty(), "MGT_EMU_CUDNN_NO_ENGINE: no engine");
        unsetenv("MGT_EMU_CUDNN_NO_ENGINE");
        CHECK(s.be.configs(s.g).size() == 2, "without it: two");
    }
    {
        setenv("MGT_EMU_CUDNN_STALE", "all", 1);
        Small s(h, CUDNN_DATA_BFLOAT16);
        auto cfg = s.be.configs(s.g);
        cudnnBackendDescriptor_t p0 = nullptr, p1 = nullptr;
        CHECK(cfg.size() == 2 && s.be.plan(h, cfg[0], &p0) == CUDNN_STATUS_NOT_SUPPORTED,
              "MGT_EMU_CUDNN_STALE=all: the first configuration's plan does not build");
        CHECK(last_error_says("stale"), "and the last error says so");
        CHECK(cfg.size() == 2 && s.be.plan(h, cfg[1], &p1) == CUDNN_STATUS_SUCCESS,
              "the second builds");
        setenv("MGT_EMU_CUDNN_STALE", "none", 1);
    }

    Small s(h, CUDNN_DATA_BFLOAT16);
    cudnnBackendDescriptor_t plan = nullptr;
    DNN(s.be.plan(h, s.be.configs(s.g)[0], &plan));
    const int64_t wsb = s.be.workspace(plan);
    Buf16 a(64), b(64), c(64);
    a.random();
    b.random();
    void *ws = dev_alloc((size_t)wsb);
    auto run = [&](const std::vector<int64_t> &u, const std::vector<void *> &p, void *w) {
        Backend pb;
        return cudnnBackendExecute(h, plan, pb.pack(u, p, w));
    };
    const auto BAD = CUDNN_STATUS_BAD_PARAM;
    CHECK(run({1, 2, 3}, {a.d, b.d, c.d}, ws) == CUDNN_STATUS_SUCCESS, "the valid call");
    flush();
    CHECK(run({1, 3}, {a.d, c.d}, ws) == BAD, "a variant pack without B's uid");
    CHECK(last_error_says("uid 2"), "the last error names the missing uid");
    CHECK(run({1, 2, 3}, {a.d, b.d, c.d}, nullptr) == BAD, "no workspace");
    CHECK(run({1, 2, 3}, {a.d + 1, b.d, c.d}, ws) == BAD, "A 2 bytes off its 16-byte claim");
    CHECK(run({1, 2, 3}, {a.d, nullptr, c.d}, ws) == BAD, "a NULL pointer");
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    {
        Backend pb;
        pb.pack({1, 2, 2}, {a.d, b.d, c.d}, ws, &st);
        CHECK(st == BAD, "a uid twice in the variant pack");
        pb.pack({1, 2, 3}, {a.d, b.d}, ws, &st);
        CHECK(st == BAD, "fewer pointers than uids");
    }
    CHECK(cudnnBackendExecute(h, s.g, plan) == BAD, "a graph where the plan belongs");
    std::vector<uint16_t> host(64);
    CHECK(dies([&] { run({1, 2, 3}, {a.d, b.d, host.data()}, ws); }), "host C must fail");
    CHECK(dies([&] {
              void *small = dev_alloc((size_t)wsb / 2);
              run({1, 2, 3}, {a.d, b.d, c.d}, small);
          }),
          "a workspace smaller than the plan's must fail");
    CHECK(dies([&] { run({1, 2, 3}, {a.d, b.d, c.d}, c.d); }), "a workspace over C must fail");
    CHECK(dies([&] {
              cudnnBackendDescriptor_t gone = nullptr;
              cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &gone);
              cudnnBackendDestroyDescriptor(gone);
              cudnnBackendExecute(h, plan, gone);
          }),
          "a destroyed variant pack must fail");
    { /* by-value scalars: read on the host */
        Small sc(h, CUDNN_DATA_BFLOAT16, true);
        cudnnBackendDescriptor_t p = nullptr;
        DNN(sc.be.plan(h, sc.be.configs(sc.g)[0], &p));
        float two = 2.0f;
        Backend pb;
        DNN(cudnnBackendExecute(h, p, pb.pack({1, 3, 4}, {a.d, c.d, &two}, ws)));
        flush();
        c.down();
        int bad = 0;
        for (int i = 0; i < 64; i++)
            bad += c.h[(size_t)i] != 2.0f * a.h[(size_t)i];
        CHECK(bad == 0, "C = A * 2 (a graph without a matmul): %d wrong", bad);
        float *dev = (float *)dev_alloc(16);
        CHECK(dies([&] {
                  Backend pb2;
                  cudnnBackendExecute(h, p, pb2.pack({1, 3, 4}, {a.d, c.d, dev}, ws));
              }),
              "a by-value scalar in device memory must fail");
        dev_free(dev);
    }
    dev_free(ws);
}

/* The descriptors' own checks: the life cycle, attribute types and counts, the operations'
 * shapes, the graph's connections and what the emulation does not compute. */
void test_graph_errors(cudnnHandle_t h) {
    const auto BAD = CUDNN_STATUS_BAD_PARAM, NS = CUDNN_STATUS_NOT_SUPPORTED;
    const auto F = CUDNN_DATA_FLOAT, BF = CUDNN_DATA_BFLOAT16;
    const Dims d{1, 1, 8, 8}, e{1, 1, 8, 4};
    Backend be;
    cudnnBackendDescriptor_t x;
    CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, &x) == NS,
          "a convolution descriptor is not emulated");
    auto t = be.tensor(1, F, d, packed(d), false);
    const int64_t uid = 9, nine[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    CHECK(cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid) ==
              CUDNN_STATUS_NOT_INITIALIZED,
          "setting a finalized descriptor: NOT_INITIALIZED");
    CHECK(cudnnBackendFinalize(t) == BAD, "finalizing twice");
    auto pl = be.make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    CHECK(cudnnBackendSetAttribute(pl, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
                                   1, &uid) == BAD,
          "setting what a plan computes");
    auto u = be.make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    int64_t n = 0, v = 0;
    CHECK(cudnnBackendGetAttribute(u, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &n, &v) ==
              CUDNN_STATUS_NOT_INITIALIZED,
          "getting from a descriptor not finalized: NOT_INITIALIZED");
    CHECK(cudnnBackendSetAttribute(u, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT32, 1, &uid) ==
              BAD,
          "the wrong attribute type");
    CHECK(cudnnBackendSetAttribute(u, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 9, nine) ==
              BAD,
          "nine dimensions");
    CHECK(cudnnBackendSetAttribute(u, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1,
                                   &uid) == BAD,
          "a pointwise attribute on a tensor");
    const cudnnDataType_t bogus = (cudnnDataType_t)99;
    CHECK(cudnnBackendSetAttribute(u, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1,
                                   &bogus) == BAD,
          "a data type that is not an enumerant");
    auto mm = be.make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const double pad = 0;
    CHECK(cudnnBackendSetAttribute(mm, CUDNN_ATTR_MATMUL_PADDING_VALUE, CUDNN_TYPE_DOUBLE, 1,
                                   &pad) == NS,
          "a matmul attribute the emulation lacks: NOT_SUPPORTED");
    DNN(cudnnBackendSetAttribute(u, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &F));
    CHECK(cudnnBackendFinalize(u) == BAD, "a tensor without dimensions, strides and id");
    CHECK(last_error_says("DIMENSIONS"), "the last error names what is missing");
    auto op = be.make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &u) == BAD,
          "a tensor that is not finalized as an operand");
    auto pw = be.make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    CHECK(cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw) == BAD,
          "a pointwise descriptor where a tensor belongs");

    /* the operations' shapes, at their finalize */
    auto a = be.tensor(2, BF, d, packed(d), false), b4 = be.tensor(3, BF, e, packed(e), false);
    auto c = be.tensor(4, BF, d, packed(d), false);
    CHECK(cudnnBackendFinalize(be.matmul_op(b4, a, c)) == BAD, "a matmul with k 4 against 8");
    CHECK(cudnnBackendFinalize(be.pointwise_op(CUDNN_POINTWISE_ADD, F, a, b4, nullptr, c)) == BAD,
          "a pointwise B [.., 8, 4] does not broadcast to [.., 8, 8]");
    CHECK(cudnnBackendFinalize(be.pointwise_op(CUDNN_POINTWISE_ADD, F, a, nullptr, nullptr, c)) ==
              BAD,
          "ADD without B");

    /* the graph */
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    be.graph(h, {be.pointwise(CUDNN_POINTWISE_TANH_FWD, F, a, nullptr, nullptr, c)}, &st);
    CHECK(st == NS && last_error_says("mode"), "TANH_FWD is not emulated: NOT_SUPPORTED");
    auto vt = be.virt(F, d), vt2 = be.virt(F, d);
    be.graph(h, {be.pointwise(CUDNN_POINTWISE_IDENTITY, F, vt, nullptr, nullptr, c)}, &st);
    CHECK(st == BAD && last_error_says("no operation"), "a virtual tensor nothing produces");
    be.graph(h,
             {be.pointwise(CUDNN_POINTWISE_IDENTITY, F, a, nullptr, nullptr, c),
              be.pointwise(CUDNN_POINTWISE_EXP, F, a, nullptr, nullptr, c)},
             &st);
    CHECK(st == BAD, "a tensor two operations produce");
    be.graph(h,
             {be.pointwise(CUDNN_POINTWISE_IDENTITY, F, vt, nullptr, nullptr, vt2),
              be.pointwise(CUDNN_POINTWISE_EXP, F, vt2, nullptr, nullptr, vt)},
             &st);
    CHECK(st == BAD && last_error_says("cycle"), "a cycle");
    auto other = be.tensor(2, F, d, packed(d), false); /* uid 2 again, another type */
    be.graph(h,
             {be.pointwise(CUDNN_POINTWISE_IDENTITY, F, a, nullptr, nullptr, c),
              be.pointwise(CUDNN_POINTWISE_EXP, F, other, nullptr, nullptr, vt)},
             &st);
    CHECK(st == BAD && last_error_says("two different tensors"), "one uid, two tensors");
    auto loose = be.tensor(5, BF, d, packed(d), false, false, 4);
    be.graph(h, {be.pointwise(CUDNN_POINTWISE_IDENTITY, F, loose, nullptr, nullptr, c)}, &st);
    CHECK(st == NS, "a 4-byte alignment claim: NOT_SUPPORTED");
    auto half = be.tensor(6, CUDNN_DATA_HALF, d, packed(d), false);
    be.graph(h, {be.pointwise(CUDNN_POINTWISE_IDENTITY, F, half, nullptr, nullptr, c)}, &st);
    CHECK(st == NS, "HALF data is not emulated");
    CHECK(dies([&] {
              cudnnBackendDescriptor_t gone = nullptr;
              cudnnBackendCreateDescriptor(CUDNN_BACKEND_TENSOR_DESCRIPTOR, &gone);
              cudnnBackendDestroyDescriptor(gone);
              cudnnBackendFinalize(gone);
          }),
          "a destroyed descriptor must fail");
}

} // namespace

int main() {
    test_sgemm();
    test_bf16_rounding();
    test_gemm_ex();
    cudnnHandle_t h;
    DNN(cudnnCreate(&h));
    DNN(cudnnSetStream(h, (cudaStream_t)0));
    test_stale(h);
    /* the tables themselves, without stale heuristics entries (test_stale has those) */
    setenv("MGT_EMU_CUDNN_STALE", "none", 1);
    test_max_count(h);
    test_conv_bf16(h);
    test_conv(h);
    test_conv_tf32(h);
    test_heuristics(h);
    test_conv_errors(h);
    test_graph_attention(h);
    test_graph_reshape(h);
    test_graph_engines(h);
    test_graph_errors(h);
    DNN(cudnnDestroy(h));
    return emu_test::finish("test_emu_libs");
}
