/* emu_runtime.cpp: the CUDA runtime API functions the GPU backend calls, on the host (see emu.h
 * for the model: streams are FIFOs that run when the host waits; device memory is a range the
 * host cannot touch).
 *
 * Environment (the test's stand-in for a machine):
 *   MGT_EMU_GPUS     GPUs in the machine (default 1; 0 = none, as on a machine without a GPU)
 *   MGT_EMU_MEM_MB   memory of each GPU in MiB (default 4096)
 *   CUDA_VISIBLE_DEVICES  honoured as the driver does: a list of machine indices; an entry that
 *                    is not a valid index ends the list.
 *   MGT_EMU_STATS    a file to which the process appends, at exit, how many device and pinned
 *                    allocations it made ("cudaMalloc N cudaFree N cudaHostAlloc N"), so a
 *                    test can check that a longer run makes no more of them.
 *   MGT_EMU_READS    a file to which the process appends, at exit, how many copies from the
 *                    device to the host it made ("D2H N"): the host's reads, each a wait for
 *                    the device, so a test can count them; and how many graphs it launched
 *                    ("graphs N"), and how many ops those launches queued ("graph ops N").
 *   MGT_EMU_KERNELS  a file to which the process appends, at exit, how many times each kernel
 *                    ran ("NAME COUNT" a line, by the name it was launched with: eager launches
 *                    and graph replays alike), so that a test can count a kernel per step.
 *   MGT_EMU_CAPTURE  "invalidate": every stream capture ends invalidated, as when something
 *                    in it could not be captured (a test of the fallback); "LIB-CALL" (LIB
 *                    cudnn or cublas, CALL query, sync or alloc): that library's first call
 *                    inside each capture makes that call the capture cannot hold, as a library's
 *                    internal query, synchronisation or allocation would, which invalidates the
 *                    capture (emu::library_call_in_capture).
 *
 * Stream capture (cudaStreamBeginCapture .. cudaStreamEndCapture) records what is queued on the
 * capturing stream instead of queueing it; cudaGraphInstantiate keeps the recording and
 * cudaGraphLaunch queues it again, op by op, each with the arguments it had when captured, as a
 * graph replays its nodes. What a real capture refuses, this one refuses and invalidates the
 * capture for, from the capturing thread (cudaStreamCaptureModeThreadLocal and Global): a host
 * wait for the capturing stream or the device, a query of an event recorded in the capture,
 * cudaMalloc / cudaFree / cudaHostAlloc / cudaFreeHost, a synchronous copy, a copy from or to
 * pageable host memory, and a wait on an event recorded outside the capture. The refused call
 * fails with cudaErrorStreamCaptureUnsupported (or ...Isolation), and from then on, as in CUDA,
 * every call that queues work on the capturing stream (a launch, a copy, a memset, an event
 * record or wait, a library call) fails with cudaErrorStreamCaptureInvalidated until
 * cudaStreamEndCapture, which fails with it too and returns no graph.
 *
 * All state is behind one mutex: the API is callable from any thread, as CUDA's is. */
#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "emu.h"

struct EmuOp {
    std::function<void()> run;
    std::function<bool()> gate; /* set: the stream waits here until it returns true */
    const char *what;
};

struct CUgraph_st {
    std::vector<EmuOp> ops;
    bool invalid = false;
    const char *why = NULL; /* what invalidated it */
};

struct CUgraphExec_st {
    std::vector<EmuOp> ops;
};

struct CUstream_st {
    std::deque<EmuOp> q;
    unsigned flags = 0;
    CUgraph_st *cap = NULL; /* the capture under way on this stream */
};

struct CUevent_st {
    unsigned flags = 0;
    uint64_t recorded = 0;       /* generation of the last record */
    uint64_t completed = 0;      /* generation that has run */
    double when = 0;             /* host time at which it ran */
    CUgraph_st *captured = NULL; /* last recorded into this capture (not a real record) */
};

namespace {

std::recursive_mutex mu;
cudaError_t last_error = cudaSuccess;

struct Stats {
    long malloc_calls = 0, free_calls = 0, host_allocs = 0, d2h_copies = 0;
    long graph_launches = 0, graph_ops = 0;
    std::map<std::string, long> ran; /* ops run, by name */
    ~Stats() {
        const char *kpath = getenv("MGT_EMU_KERNELS");
        FILE *kf = kpath && *kpath ? fopen(kpath, "a") : NULL;
        if (kf) {
            for (const auto &k : ran)
                fprintf(kf, "%s %ld\n", k.first.c_str(), k.second);
            fclose(kf);
        }
        const char *path = getenv("MGT_EMU_STATS");
        FILE *f = path && *path ? fopen(path, "a") : NULL;
        if (f) {
            fprintf(f, "cudaMalloc %ld cudaFree %ld cudaHostAlloc %ld\n", malloc_calls, free_calls,
                    host_allocs);
            fclose(f);
        }
        path = getenv("MGT_EMU_READS");
        f = path && *path ? fopen(path, "a") : NULL;
        if (f) {
            fprintf(f, "D2H %ld\ngraphs %ld\ngraph ops %ld\n", d2h_copies, graph_launches,
                    graph_ops);
            fclose(f);
        }
    }
} stats;
thread_local int cur_device = 0;

CUstream_st legacy_stream;
std::vector<CUstream_st *> streams = {&legacy_stream};

/* ---- devices ---- */

int machine_gpus() {
    const char *s = getenv("MGT_EMU_GPUS");
    return s && *s ? atoi(s) : 1;
}

size_t gpu_mem_bytes() {
    const char *s = getenv("MGT_EMU_MEM_MB");
    size_t mb = s && *s ? (size_t)strtoull(s, NULL, 10) : 4096;
    return mb << 20;
}

/* Visible device i -> machine index, as the driver reads CUDA_VISIBLE_DEVICES. */
std::vector<int> visible() {
    std::vector<int> v;
    int n = machine_gpus();
    const char *s = getenv("CUDA_VISIBLE_DEVICES");
    if (!s) {
        for (int i = 0; i < n; i++)
            v.push_back(i);
        return v;
    }
    std::string str(s);
    size_t at = 0;
    while (at <= str.size()) {
        size_t comma = str.find(',', at);
        std::string item =
            str.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
        char *end = NULL;
        long id = strtol(item.c_str(), &end, 10);
        if (item.empty() || *end || id < 0 || id >= n ||
            std::find(v.begin(), v.end(), (int)id) != v.end())
            break;
        v.push_back((int)id);
        if (comma == std::string::npos)
            break;
        at = comma + 1;
    }
    return v;
}

cudaError_t err(cudaError_t e) {
    if (e != cudaSuccess)
        last_error = e;
    return e;
}

/* ---- device memory: one reserved range, opened only while queued work runs ---- */

const size_t kReserve = (size_t)1 << 37, kAlign = 256;
char *base = NULL;
size_t high = 0; /* bytes of the range ever handed out (page-rounded when opened) */
size_t in_use = 0;
std::map<size_t, size_t> live;  /* offset -> size */
std::map<size_t, size_t> holes; /* offset -> size, free space below `high` */
int open_depth = 0;
std::map<void *, size_t> pinned;

/* The range is opened and closed as a whole, many times a step, and mprotect's cost grows with
 * the page-table entries it rewrites: the range asks for transparent huge pages (2 MiB each, 512
 * times fewer entries than 4 KiB pages), and is opened in whole huge pages so that none is split.
 * Measured on a 2-rank step of smallconv: mprotect took a third of each rank's time with 4 KiB
 * pages. */
const size_t kHuge = (size_t)2 << 20;

size_t huge_round(size_t n) {
    return (n + kHuge - 1) / kHuge * kHuge;
}

void open_mem() {
    if (open_depth++ == 0 && high && mprotect(base, huge_round(high), PROT_READ | PROT_WRITE))
        emu::fail("mprotect: %s", strerror(errno));
}

void close_mem() {
    if (--open_depth == 0 && high && mprotect(base, huge_round(high), PROT_NONE))
        emu::fail("mprotect: %s", strerror(errno));
}

struct MemOpen {
    MemOpen() { open_mem(); }
    ~MemOpen() { close_mem(); }
};

void *dev_alloc(size_t bytes) {
    if (!base) {
        void *p =
            mmap(NULL, kReserve + kHuge, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
        if (p == MAP_FAILED)
            emu::fail("cannot reserve the device range: %s", strerror(errno));
        base = (char *)(((uintptr_t)p + kHuge - 1) & ~(uintptr_t)(kHuge - 1));
        madvise(base, kReserve, MADV_HUGEPAGE); /* a hint: without it, only slower */
    }
    size_t n = (bytes + kAlign - 1) / kAlign * kAlign;
    if (in_use + n > gpu_mem_bytes())
        return NULL;
    size_t off = SIZE_MAX;
    for (auto it = holes.begin(); it != holes.end(); ++it)
        if (it->second >= n) {
            off = it->first;
            size_t rest = it->second - n;
            holes.erase(it);
            if (rest)
                holes[off + n] = rest;
            break;
        }
    if (off == SIZE_MAX) {
        if (high + n > kReserve)
            return NULL;
        off = high;
        high += n;
    }
    live[off] = n;
    in_use += n;
    MemOpen open;
    memset(base + off, 0xff, n); /* NaN floats: unwritten outputs show */
    return base + off;
}

const std::pair<const size_t, size_t> *find_live(const void *p) {
    if (!base || (const char *)p < base || (const char *)p >= base + high)
        return NULL;
    size_t off = (size_t)((const char *)p - base);
    auto it = live.upper_bound(off);
    if (it == live.begin())
        return NULL;
    --it;
    return off < it->first + it->second ? &*it : NULL;
}

bool is_pinned(const void *p, size_t bytes) {
    auto it = pinned.upper_bound((void *)p);
    if (it == pinned.begin())
        return false;
    --it;
    const char *b = (const char *)it->first;
    return (const char *)p >= b && (const char *)p + bytes <= b + it->second;
}

/* ---- execution ---- */

double now() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void pause_briefly() {
    struct timespec ts = {0, 20 * 1000};
    nanosleep(&ts, NULL);
}

CUstream_st *stream_of(cudaStream_t s) {
    return s ? s : &legacy_stream;
}

bool known_stream(cudaStream_t s) {
    return !s || std::find(streams.begin(), streams.end(), s) != streams.end();
}

bool drained(CUstream_st *s) {
    return s->q.empty();
}

bool all_drained() {
    for (CUstream_st *s : streams)
        if (!s->q.empty())
            return false;
    return true;
}

/* ---- stream capture ---- */

std::thread::id capture_thread;
int captures = 0; /* streams capturing now */

/* Whether the calling thread is capturing (the modes this emulation has are thread-local in
 * effect: only the capturing thread's calls are checked). */
bool capturing_here() {
    return captures > 0 && std::this_thread::get_id() == capture_thread;
}

/* A call the capture cannot hold: every capture of this thread is invalidated, and the call
 * fails with `e` (as CUDA's do). */
cudaError_t refuse_in_capture(const char *what, cudaError_t e) {
    for (CUstream_st *s : streams)
        if (s->cap && !s->cap->invalid) {
            s->cap->invalid = true;
            s->cap->why = what;
        }
    return err(e);
}

/* Waits (running work) until done() holds. */
template <class F> void wait_until(F done) {
    while (!done())
        if (!emu::progress())
            pause_briefly();
}

} // namespace

/* ---- the emulation's internal interface ---- */

namespace emu {

cudaError_t enqueue(cudaStream_t s, std::function<void()> op, const char *what) {
    std::lock_guard<std::recursive_mutex> lk(mu);
    if (!known_stream(s))
        fail("work (%s) queued on a stream that does not exist (destroyed?)", what);
    CUstream_st *st = stream_of(s);
    if (st->cap && st->cap->invalid) /* nothing more is recorded, nothing runs */
        return err(cudaErrorStreamCaptureInvalidated);
    if (st->cap) /* recorded, not run */
        st->cap->ops.push_back(EmuOp{std::move(op), nullptr, what});
    else
        st->q.push_back(EmuOp{std::move(op), nullptr, what});
    return cudaSuccess;
}

cudaError_t enqueue_gate(cudaStream_t s, std::function<bool()> ready, const char *what) {
    std::lock_guard<std::recursive_mutex> lk(mu);
    if (!known_stream(s))
        fail("work (%s) queued on a stream that does not exist (destroyed?)", what);
    CUstream_st *st = stream_of(s);
    if (st->cap && st->cap->invalid)
        return err(cudaErrorStreamCaptureInvalidated);
    if (st->cap) /* a gate cannot be recorded (the runtime's own waits are checked before) */
        return refuse_in_capture(what, cudaErrorStreamCaptureUnsupported);
    st->q.push_back(EmuOp{nullptr, std::move(ready), what});
    return cudaSuccess;
}

void library_call_in_capture(const char *lib, cudaStream_t s) {
    const char *want = getenv("MGT_EMU_CAPTURE");
    const size_t n = strlen(lib);
    if (!want || strncmp(want, lib, n) || want[n] != '-')
        return;
    const char *call = want + n + 1;
    std::lock_guard<std::recursive_mutex> lk(mu);
    if (!known_stream(s) || !stream_of(s)->cap || stream_of(s)->cap->invalid)
        return;
    if (!strcmp(call, "query")) {
        (void)cudaStreamQuery(s);
    } else if (!strcmp(call, "sync")) {
        (void)cudaStreamSynchronize(s);
    } else if (!strcmp(call, "alloc")) {
        void *p = NULL;
        if (cudaMalloc(&p, 256) == cudaSuccess)
            (void)cudaFree(p);
    } else {
        fail("MGT_EMU_CAPTURE=%s: the call is query, sync or alloc", want);
    }
}

void set_last_error(cudaError_t e) {
    std::lock_guard<std::recursive_mutex> lk(mu);
    err(e);
}

bool is_device(const void *p, size_t bytes) {
    std::lock_guard<std::recursive_mutex> lk(mu);
    const auto *a = find_live(p);
    if (!a)
        return false;
    size_t off = (size_t)((const char *)p - base);
    return bytes <= a->first + a->second - off;
}

int physical_device(void) {
    std::vector<int> v = visible();
    return cur_device >= 0 && cur_device < (int)v.size() ? v[(size_t)cur_device] : -1;
}

bool progress(void) {
    static const bool count_ops = getenv("MGT_EMU_KERNELS") && *getenv("MGT_EMU_KERNELS");
    std::lock_guard<std::recursive_mutex> lk(mu);
    MemOpen open;
    bool any = false;
    for (bool ran = true; ran;) {
        ran = false;
        for (size_t i = 0; i < streams.size(); i++) {
            CUstream_st *s = streams[i];
            while (!s->q.empty()) {
                EmuOp op = std::move(s->q.front());
                if (op.gate) {
                    if (!op.gate()) {
                        s->q.front() = std::move(op);
                        break;
                    }
                } else {
                    op.run();
                    if (count_ops)
                        stats.ran[op.what ? op.what : "?"]++;
                }
                s->q.pop_front();
                ran = any = true;
            }
        }
    }
    return any;
}

void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "emulated GPU: %s\n", msg);
    fflush(stderr);
    abort();
}

} // namespace emu

/* ---- the runtime API ---- */

#define LOCK std::lock_guard<std::recursive_mutex> lk_(mu)

extern "C" {

cudaError_t cudaGetLastError(void) {
    LOCK;
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) {
    LOCK;
    return last_error;
}

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess:
        return "cudaSuccess";
    case cudaErrorInvalidValue:
        return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
        return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
        return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice:
        return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice:
        return "cudaErrorNoDevice";
    case cudaErrorNotReady:
        return "cudaErrorNotReady";
    case cudaErrorInvalidResourceHandle:
        return "cudaErrorInvalidResourceHandle";
    case cudaErrorIllegalAddress:
        return "cudaErrorIllegalAddress";
    case cudaErrorIllegalState:
        return "cudaErrorIllegalState";
    case cudaErrorStreamCaptureUnsupported:
        return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated:
        return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureIsolation:
        return "cudaErrorStreamCaptureIsolation";
    default:
        return "cudaErrorUnknown";
    }
}

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess:
        return "no error";
    case cudaErrorInvalidValue:
        return "invalid argument";
    case cudaErrorMemoryAllocation:
        return "out of memory";
    case cudaErrorInvalidConfiguration:
        return "invalid configuration argument";
    case cudaErrorInvalidDevice:
        return "invalid device ordinal";
    case cudaErrorNoDevice:
        return "no CUDA-capable device is detected";
    case cudaErrorNotReady:
        return "device not ready";
    case cudaErrorInvalidResourceHandle:
        return "invalid resource handle";
    case cudaErrorIllegalAddress:
        return "an illegal memory access was encountered";
    case cudaErrorIllegalState:
        return "the resource is not in a valid state to perform the requested operation";
    case cudaErrorStreamCaptureUnsupported:
        return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
        return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureIsolation:
        return "dependency created on uncaptured work in another stream";
    default:
        return "unknown error";
    }
}

cudaError_t cudaGetDeviceCount(int *count) {
    LOCK;
    *count = (int)visible().size();
    return *count ? cudaSuccess : err(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device) {
    LOCK;
    if (device < 0 || device >= (int)visible().size())
        return err(cudaErrorInvalidDevice);
    cur_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
    *device = cur_device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device) {
    LOCK;
    std::vector<int> v = visible();
    if (device < 0 || device >= (int)v.size())
        return err(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "Emulated GPU %d", v[(size_t)device]);
    p->totalGlobalMem = gpu_mem_bytes();
    p->sharedMemPerBlock = 48 << 10;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 0x7fffffff;
    p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 132;
    p->pciBusID = 0x18 + v[(size_t)device];
    return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char *buf, int len, int device) {
    LOCK;
    std::vector<int> v = visible();
    if (device < 0 || device >= (int)v.size())
        return err(cudaErrorInvalidDevice);
    snprintf(buf, (size_t)len, "00000000:%02X:00.0", 0x18 + v[(size_t)device]);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total) {
    LOCK;
    *total = gpu_mem_bytes();
    *free_b = *total - in_use;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t bytes) {
    LOCK;
    if (!p)
        return err(cudaErrorInvalidValue);
    if (capturing_here()) {
        *p = NULL;
        return refuse_in_capture("cudaMalloc", cudaErrorStreamCaptureUnsupported);
    }
    *p = NULL;
    stats.malloc_calls++;
    if (bytes == 0)
        return cudaSuccess;
    *p = dev_alloc(bytes);
    return *p ? cudaSuccess : err(cudaErrorMemoryAllocation);
}

cudaError_t cudaFree(void *p) {
    LOCK;
    if (!p)
        return cudaSuccess;
    if (capturing_here())
        return refuse_in_capture("cudaFree", cudaErrorStreamCaptureUnsupported);
    stats.free_calls++;
    const auto *a = find_live(p);
    if (!a || base + a->first != (char *)p)
        return err(cudaErrorInvalidValue);
    wait_until(all_drained); /* cudaFree synchronizes with the device */
    size_t off = a->first, n = a->second;
    {
        MemOpen open;
        memset(base + off, 0xff, n); /* a later use of freed memory reads NaN */
    }
    live.erase(off);
    in_use -= n;
    holes[off] = n;
    /* merge with the neighbours */
    auto it = holes.find(off);
    if (it != holes.begin()) {
        auto prev = std::prev(it);
        if (prev->first + prev->second == off) {
            prev->second += n;
            holes.erase(it);
            it = prev;
        }
    }
    auto next = std::next(it);
    if (next != holes.end() && it->first + it->second == next->first) {
        it->second += next->second;
        holes.erase(next);
    }
    return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned int flags) {
    (void)flags;
    LOCK;
    if (capturing_here())
        return refuse_in_capture("cudaHostAlloc", cudaErrorStreamCaptureUnsupported);
    stats.host_allocs++;
    *p = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (!*p)
        return err(cudaErrorMemoryAllocation);
    pinned[*p] = bytes;
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t bytes) {
    return cudaHostAlloc(p, bytes, 0);
}

cudaError_t cudaFreeHost(void *p) {
    LOCK;
    if (!p)
        return cudaSuccess;
    if (capturing_here())
        return refuse_in_capture("cudaFreeHost", cudaErrorStreamCaptureUnsupported);
    auto it = pinned.find(p);
    if (it == pinned.end())
        return err(cudaErrorInvalidValue);
    wait_until(all_drained);
    pinned.erase(it);
    free(p);
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
    LOCK;
    *s = new CUstream_st;
    (*s)->flags = flags;
    streams.push_back(*s);
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s) {
    return cudaStreamCreateWithFlags(s, 0);
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    LOCK;
    if (!s || !known_stream(s))
        return err(cudaErrorInvalidResourceHandle);
    wait_until([s] { return drained(s); }); /* its queued work still completes */
    streams.erase(std::find(streams.begin(), streams.end(), s));
    delete s;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    LOCK;
    if (!known_stream(s))
        return err(cudaErrorInvalidResourceHandle);
    if (stream_of(s)->cap || capturing_here())
        return refuse_in_capture("cudaStreamSynchronize", cudaErrorStreamCaptureUnsupported);
    CUstream_st *st = stream_of(s);
    wait_until([st] { return drained(st); });
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
    LOCK;
    if (!known_stream(s))
        return err(cudaErrorInvalidResourceHandle);
    if (stream_of(s)->cap)
        return refuse_in_capture("cudaStreamQuery", cudaErrorStreamCaptureUnsupported);
    emu::progress();
    return drained(stream_of(s)) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaDeviceSynchronize(void) {
    LOCK;
    if (capturing_here())
        return refuse_in_capture("cudaDeviceSynchronize", cudaErrorStreamCaptureUnsupported);
    wait_until(all_drained);
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
    LOCK;
    *e = new CUevent_st;
    (*e)->flags = flags;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e) {
    return cudaEventCreateWithFlags(e, 0);
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
    LOCK;
    if (!e)
        return err(cudaErrorInvalidResourceHandle);
    /* CUDA defers the release until the event's pending record has run. */
    if (e->completed < e->recorded)
        emu::enqueue_gate(
            NULL,
            [e] {
                if (e->completed < e->recorded)
                    return false;
                delete e;
                return true;
            },
            "event release");
    else
        delete e;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    LOCK;
    if (!e || !known_stream(s))
        return err(cudaErrorInvalidResourceHandle);
    if (stream_of(s)->cap && stream_of(s)->cap->invalid)
        return err(cudaErrorStreamCaptureInvalidated);
    if (stream_of(s)->cap) { /* a point of the capture's order, not a record that runs */
        e->captured = stream_of(s)->cap;
        return cudaSuccess;
    }
    e->captured = NULL;
    uint64_t gen = ++e->recorded;
    return emu::enqueue(
        s,
        [e, gen] {
            e->completed = gen;
            e->when = now();
        },
        "event record");
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
    LOCK;
    if (!e)
        return err(cudaErrorInvalidResourceHandle);
    if (e->captured)
        return refuse_in_capture("cudaEventQuery", cudaErrorStreamCaptureUnsupported);
    emu::progress();
    return e->completed >= e->recorded ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    LOCK;
    if (!e)
        return err(cudaErrorInvalidResourceHandle);
    if (e->captured)
        return refuse_in_capture("cudaEventSynchronize", cudaErrorStreamCaptureUnsupported);
    wait_until([e] { return e->completed >= e->recorded; });
    return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    LOCK;
    if (!a || !b || (a->flags & cudaEventDisableTiming) || (b->flags & cudaEventDisableTiming) ||
        !a->recorded || !b->recorded || a->captured || b->captured)
        return err(cudaErrorInvalidResourceHandle);
    emu::progress();
    if (a->completed < a->recorded || b->completed < b->recorded)
        return err(cudaErrorNotReady);
    *ms = (float)((b->when - a->when) * 1e3);
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
    (void)flags;
    LOCK;
    if (!e || !known_stream(s))
        return err(cudaErrorInvalidResourceHandle);
    CUstream_st *st = stream_of(s);
    if (st->cap && st->cap->invalid)
        return err(cudaErrorStreamCaptureInvalidated);
    if (st->cap && e->captured == st->cap)
        return cudaSuccess; /* the capture's own order: already implied on one stream */
    if (st->cap) /* an outside event: the capture would depend on work it does not hold */
        return refuse_in_capture("cudaStreamWaitEvent on an event recorded outside the capture",
                                 cudaErrorStreamCaptureIsolation);
    if (e->captured) /* another stream joining the capture: not emulated */
        return refuse_in_capture("cudaStreamWaitEvent on a captured event from another stream",
                                 cudaErrorStreamCaptureUnsupported);
    uint64_t gen = e->recorded; /* the record most recent at this call */
    return emu::enqueue_gate(
        s, [e, gen] { return e->completed >= gen; }, "stream wait event");
}

/* Copies: the kind must match where the pointers live, as without unified addressing. */
static cudaError_t copy_async(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                              cudaStream_t s, bool sync) {
    if (!known_stream(s))
        return err(cudaErrorInvalidResourceHandle);
    if (n == 0)
        return cudaSuccess;
    bool dd = emu::is_device(dst, n), sd = emu::is_device(src, n);
    if (kind == cudaMemcpyDefault)
        kind = sd ? (dd ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost)
                  : (dd ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost);
    bool want_dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool want_sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (dd != want_dd || sd != want_sd) {
        /* Name what is wrong: a device pointer that is not (wholly) device memory is a bug. */
        if ((want_dd && !dd) || (want_sd && !sd))
            emu::fail("cudaMemcpy%s of %zu bytes: the %s pointer %p is not %zu bytes of device "
                      "memory",
                      sync ? "" : "Async", n, want_dd && !dd ? "destination" : "source",
                      want_dd && !dd ? dst : src, n);
        return err(cudaErrorInvalidValue);
    }
    if (stream_of(s)->cap && stream_of(s)->cap->invalid)
        return err(cudaErrorStreamCaptureInvalidated);
    if (stream_of(s)->cap && (sync || (kind == cudaMemcpyHostToDevice && !is_pinned(src, n)) ||
                              (kind == cudaMemcpyDeviceToHost && !is_pinned(dst, n))))
        return refuse_in_capture("a copy the capture cannot hold (pageable host memory, or "
                                 "synchronous)",
                                 cudaErrorStreamCaptureUnsupported);
    if (kind == cudaMemcpyDeviceToHost)
        stats.d2h_copies++;
    if (kind == cudaMemcpyHostToDevice && !is_pinned(src, n)) {
        /* Pageable source: the driver stages it before returning. */
        auto snap = std::make_shared<std::vector<char>>((const char *)src, (const char *)src + n);
        emu::enqueue(
            s, [dst, snap] { memcpy(dst, snap->data(), snap->size()); }, "memcpy H2D");
    } else {
        emu::enqueue(
            s, [dst, src, n] { memcpy(dst, src, n); }, "memcpy");
    }
    /* (an invalidated capture was refused above: both queue) */
    /* A copy to pageable host memory returns when it is done. */
    if (sync || (kind == cudaMemcpyDeviceToHost && !is_pinned(dst, n))) {
        CUstream_st *st = stream_of(s);
        wait_until([st] { return drained(st); });
    }
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                            cudaStream_t s) {
    LOCK;
    return copy_async(dst, src, n, kind, s, false);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind) {
    LOCK;
    if (capturing_here())
        return refuse_in_capture("cudaMemcpy", cudaErrorStreamCaptureUnsupported);
    wait_until(all_drained); /* the legacy stream waits for all blocking work */
    return copy_async(dst, src, n, kind, NULL, true);
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t s) {
    LOCK;
    if (!known_stream(s))
        return err(cudaErrorInvalidResourceHandle);
    if (n == 0)
        return cudaSuccess;
    if (!emu::is_device(p, n))
        emu::fail("cudaMemsetAsync of %zu bytes at %p: not device memory", n, p);
    return emu::enqueue(
        s, [p, value, n] { memset(p, value, n); }, "memset");
}

cudaError_t cudaMemset(void *p, int value, size_t n) {
    LOCK;
    if (capturing_here())
        return refuse_in_capture("cudaMemset", cudaErrorStreamCaptureUnsupported);
    cudaError_t e = cudaMemsetAsync(p, value, n, NULL);
    wait_until(all_drained);
    return e;
}

/* ---- stream capture and graphs ---- */

cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode) {
    (void)mode;
    LOCK;
    if (!s || !known_stream(s))
        return err(s ? cudaErrorInvalidResourceHandle : cudaErrorStreamCaptureUnsupported);
    if (s->cap || (captures > 0 && std::this_thread::get_id() != capture_thread))
        return err(cudaErrorIllegalState);
    s->cap = new CUgraph_st;
    capture_thread = std::this_thread::get_id();
    captures++;
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *status) {
    LOCK;
    if (!known_stream(s))
        return err(cudaErrorInvalidResourceHandle);
    CUstream_st *st = stream_of(s);
    *status = !st->cap           ? cudaStreamCaptureStatusNone
              : st->cap->invalid ? cudaStreamCaptureStatusInvalidated
                                 : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph) {
    LOCK;
    if (!s || !known_stream(s) || !s->cap)
        return err(cudaErrorIllegalState);
    CUgraph_st *g = s->cap;
    s->cap = NULL;
    captures--;
    const char *force = getenv("MGT_EMU_CAPTURE");
    if (force && !strcmp(force, "invalidate"))
        g->invalid = true;
    if (g->invalid) {
        delete g;
        *graph = NULL;
        return err(cudaErrorStreamCaptureInvalidated);
    }
    *graph = g;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                 unsigned long long flags) {
    (void)flags;
    LOCK;
    if (!exec || !graph)
        return err(cudaErrorInvalidValue);
    *exec = new CUgraphExec_st;
    (*exec)->ops = graph->ops;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    LOCK;
    if (!graph)
        return err(cudaErrorInvalidValue);
    delete graph;
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
    LOCK;
    if (!exec || !known_stream(s))
        return err(cudaErrorInvalidResourceHandle);
    if (stream_of(s)->cap)
        return stream_of(s)->cap->invalid
                   ? err(cudaErrorStreamCaptureInvalidated)
                   : refuse_in_capture("cudaGraphLaunch", cudaErrorStreamCaptureUnsupported);
    stats.graph_launches++;
    for (const EmuOp &op : exec->ops) {
        stream_of(s)->q.push_back(op);
        stats.graph_ops++;
    }
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    LOCK;
    if (!exec)
        return err(cudaErrorInvalidValue);
    delete exec;
    return cudaSuccess;
}

} // extern "C"
