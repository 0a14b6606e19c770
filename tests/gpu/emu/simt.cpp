/* simt.cpp: the thread engine of simt.h. A block's threads are fibers on the host thread that
 * runs the grid; a small scheduler (on that thread's own stack) switches between them.
 *
 * Runners: a fiber is a runner that starts the block's threads one after another by a plain call,
 * in order of their flattened index. Only a thread that parks (at __syncthreads or a warp
 * operation) keeps its fiber; it switches straight to the next thing to run: a released thread,
 * else a new runner on a free stack for the threads not yet started. A runner whose thread
 * finishes goes on with the next unstarted thread, so a block without synchronisation costs two
 * switches, and one with it holds a stack per parked thread at most. Control returns to the
 * scheduler only when nothing can run: the block is done, or it is stuck (a divergence error).
 *
 * Released threads run before unstarted ones, and the lanes of a completed warp operation before
 * other released threads, so a warp tends to run to its end before the next one starts.
 *
 * Errors found inside a fiber are reported from the scheduler's stack (the fiber is abandoned).
 * Context switches are hand-written on x86-64 (ucontext's swapcontext makes a system call for the
 * signal mask at every switch); other machines, or -DMGT_SIMT_UCONTEXT, use ucontext. */
#include "simt.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#if !defined(__x86_64__) && !defined(MGT_SIMT_UCONTEXT)
#define MGT_SIMT_UCONTEXT 1
#endif
#ifdef MGT_SIMT_UCONTEXT
#include <ucontext.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define MGT_SIMT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MGT_SIMT_ASAN 1
#endif
#endif
#ifdef MGT_SIMT_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#ifndef MGT_SIMT_UCONTEXT
/* mgt_simt_switch(&save, to): saves the callee-saved registers on the current stack, stores the
 * stack pointer in save, and resumes the context whose stack pointer is `to`. A fresh context
 * "returns" into mgt_simt_start, which calls r12(r13) and must never come back. */
extern "C" void mgt_simt_switch(void **save, void *to);
extern "C" void mgt_simt_start(void);
asm(R"(
    .pushsection .text
    .p2align 4
    .globl mgt_simt_switch
    .hidden mgt_simt_switch
    .type mgt_simt_switch, @function
mgt_simt_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size mgt_simt_switch, .-mgt_simt_switch

    .p2align 4
    .globl mgt_simt_start
    .hidden mgt_simt_start
    .type mgt_simt_start, @function
mgt_simt_start:
    .cfi_startproc
    .cfi_undefined rip
    movq %r13, %rdi
    callq *%r12
    ud2
    .cfi_endproc
    .size mgt_simt_start, .-mgt_simt_start
    .popsection
)");
#endif

namespace emu {
namespace simt {
namespace {

constexpr size_t kStackBytes = 64 * 1024;
constexpr int kMaxThreads = 1024, kMaxWarps = kMaxThreads / 32;

struct fiber {
    void *sp = nullptr; /* saved stack pointer while switched away */
#ifdef MGT_SIMT_UCONTEXT
    ucontext_t uc;
#endif
    char *map = nullptr; /* the mapping: a guard page, then the stack; null for the host */
    char *stack = nullptr;
    size_t size = 0;
    void *fake = nullptr; /* ASan's fake stack while switched away */
};

enum : uint8_t { T_NEW, T_RUN, T_READY, T_BAR, T_WARP, T_DONE };

struct warp_pending {
    unsigned mask, arrived;
    int kind, size;
};

struct block_state {
    const char *name;
    dim3 grid, block;
    void (*thunk)(const void *);
    const void *args;
    int n;    /* threads per block */
    int next; /* the first thread not started */
    uint3 next_tid;
    int done;
    int self;   /* the thread running now */
    fiber *cur; /* its fiber */
    /* __syncthreads */
    int bar_arrived, bar_count, bar_result;
    /* released threads: a ring of kMaxThreads */
    int rq[kMaxThreads];
    int rq_head, rq_len;
    uint8_t state[kMaxThreads];
    fiber *fib[kMaxThreads]; /* a parked thread's fiber and threadIdx */
    uint3 tid[kMaxThreads];
    /* warp operations: the pending ones per warp, the lanes that have exited, each lane's operands
     * and result */
    int nops[kMaxWarps];
    warp_pending ops[kMaxWarps][32];
    unsigned warp_done[kMaxWarps];
    uint64_t val[kMaxThreads], res[kMaxThreads];
    int opb[kMaxThreads], opc[kMaxThreads], opkind[kMaxThreads];
    unsigned opmask[kMaxThreads];
    /* an error found on a fiber */
    bool failed;
    char msg[1024];
};

struct engine {
    block_state blk;
    fiber host;                        /* the scheduler: the stack run_grid was called on */
    const void *host_bottom = nullptr; /* its bounds, for ASan */
    size_t host_size = 0;
    fiber *from = nullptr;     /* the context that switched last */
    std::vector<fiber *> idle; /* stacks without a thread */
    std::vector<std::unique_ptr<fiber>> all;

    fiber *get_fiber() {
        if (!idle.empty()) {
            fiber *f = idle.back();
            idle.pop_back();
            return f;
        }
        const size_t page = (size_t)sysconf(_SC_PAGESIZE);
        void *m = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED)
            ::emu::fail("kernel %s: cannot map a %zu-byte thread stack", blk.name, kStackBytes);
        if (mprotect(m, page, PROT_NONE) != 0) /* an overflow faults instead of corrupting */
            ::emu::fail("kernel %s: cannot protect a thread stack's guard page", blk.name);
        auto f = std::make_unique<fiber>();
        f->map = (char *)m;
        f->stack = (char *)m + page;
        f->size = kStackBytes;
        all.push_back(std::move(f));
        return all.back().get();
    }

    ~engine() {
        const size_t page = (size_t)sysconf(_SC_PAGESIZE);
        for (auto &f : all) {
#ifdef MGT_SIMT_ASAN
            /* A stack left mid-call (a thread parked, or abandoned after an error) keeps its
             * frames' redzones poisoned in AddressSanitizer's shadow, which munmap does not
             * clear: memory mapped later at the same addresses (the runtime's own symbolizer,
             * at the exit's leak check) would read as a stack overflow. */
            ASAN_UNPOISON_MEMORY_REGION(f->stack, f->size);
#endif
            munmap(f->map, f->size + page);
        }
    }
};

thread_local std::unique_ptr<engine> t_engine;
thread_local engine *t_eng;      /* t_engine.get(), without the TLS wrapper */
thread_local block_state *t_blk; /* set while a grid runs */

/* ---- context switches ---- */

[[noreturn]] void runner_main(fiber *self);

#ifdef MGT_SIMT_UCONTEXT
void uc_entry(unsigned lo, unsigned hi) {
    runner_main((fiber *)(((uintptr_t)hi << 32) | lo));
}

void prepare(fiber *f) {
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = f->stack;
    f->uc.uc_stack.ss_size = f->size;
    f->uc.uc_link = nullptr;
    const uintptr_t p = (uintptr_t)f;
    makecontext(&f->uc, (void (*)(void))uc_entry, 2, (unsigned)p, (unsigned)(p >> 32));
}

inline void raw_switch(fiber *from, fiber *to) {
    swapcontext(&from->uc, &to->uc);
}
#else
void prepare(fiber *f) {
    /* The frame mgt_simt_switch pops: r15 r14 r13 r12 rbx rbp, return address; then two slots
     * so that mgt_simt_start calls with a 16-byte aligned stack. */
    const uintptr_t top = ((uintptr_t)(f->stack + f->size)) & ~(uintptr_t)15;
    void **sp = (void **)(top - 9 * sizeof(void *));
    sp[0] = sp[1] = nullptr;
    sp[2] = f;
    sp[3] = (void *)&runner_main;
    sp[4] = sp[5] = nullptr;
    sp[6] = (void *)&mgt_simt_start;
    sp[7] = sp[8] = nullptr;
    f->sp = sp;
}

inline void raw_switch(fiber *from, fiber *to) {
    mgt_simt_switch(&from->sp, to->sp);
}
#endif

/* Switches from one context to another. A fiber keeps its ASan fake stack when its runner ends,
 * for the next one: creating one maps megabytes. */
void jump(engine *e, fiber *from, fiber *to) {
#ifdef MGT_SIMT_ASAN
    if (to == &e->host)
        __sanitizer_start_switch_fiber(&from->fake, e->host_bottom, e->host_size);
    else
        __sanitizer_start_switch_fiber(&from->fake, to->stack, to->size);
#endif
    e->from = from;
    raw_switch(from, to);
#ifdef MGT_SIMT_ASAN
    const bool from_host = e->from == &e->host;
    __sanitizer_finish_switch_fiber(from->fake, from_host ? &e->host_bottom : nullptr,
                                    from_host ? &e->host_size : nullptr);
#endif
}

/* ---- diagnostics ---- */

struct idx_text {
    char s[48];
};

idx_text thread_text(const block_state *b, int i) {
    idx_text t;
    const unsigned bx = b->block.x, by = b->block.y;
    snprintf(t.s, sizeof t.s, "(%u,%u,%u)", (unsigned)i % bx, (unsigned)i / bx % by,
             (unsigned)i / (bx * by));
    return t;
}

const char *kind_name(int kind) {
    static const char *const names[] = {"__shfl_sync",     "__shfl_up_sync", "__shfl_down_sync",
                                        "__shfl_xor_sync", "__syncwarp",     "__ballot_sync",
                                        "__all_sync",      "__any_sync"};
    return kind >= 0 && kind < (int)(sizeof names / sizeof names[0]) ? names[kind] : "?";
}

/* "kernel K, block (x,y,z): " + the message, into b->msg. */
void format_v(block_state *b, const char *fmt, va_list ap) {
    const int at = snprintf(b->msg, sizeof b->msg, "kernel %s, block (%u,%u,%u): ", b->name,
                            regs.bid.x, regs.bid.y, regs.bid.z);
    vsnprintf(b->msg + at, sizeof b->msg - (size_t)at, fmt, ap);
}

__attribute__((format(printf, 2, 3))) void format(block_state *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    format_v(b, fmt, ap);
    va_end(ap);
}

/* An error seen by the running thread: back to the scheduler, which ends the process. */
[[noreturn]] __attribute__((format(printf, 2, 3))) void fail_here(block_state *b, const char *fmt,
                                                                  ...) {
    va_list ap;
    va_start(ap, fmt);
    format_v(b, fmt, ap);
    va_end(ap);
    b->failed = true;
    jump(t_eng, b->cur, &t_eng->host);
    abort(); /* not reached: the scheduler never resumes a failed block */
}

int first_in(const block_state *b, uint8_t st) {
    for (int i = 0; i < b->n; i++)
        if (b->state[i] == st)
            return i;
    return -1;
}

/* Nothing can run and some threads wait: say who waits for whom. */
[[noreturn]] void deadlock(block_state *b) {
    const int bar = first_in(b, T_BAR), done = first_in(b, T_DONE), warp = first_in(b, T_WARP);
    if (bar >= 0 && done >= 0) {
        format(b, "thread %s waits at __syncthreads, but thread %s has exited without reaching it",
               thread_text(b, bar).s, thread_text(b, done).s);
    } else if (warp >= 0) {
        /* The first missing lane of the first waiting thread's operation, and where it is. */
        const unsigned mask = b->opmask[warp];
        const int base = warp & ~31;
        int miss = -1;
        for (int l = 0; l < 32 && miss < 0; l++) {
            const int j = base + l;
            if ((mask >> l & 1u) && j != warp &&
                !(b->state[j] == T_WARP && b->opmask[j] == mask && b->opkind[j] == b->opkind[warp]))
                miss = j;
        }
        char where[160] = "somewhere else";
        if (miss >= 0 && b->state[miss] == T_BAR)
            snprintf(where, sizeof where, "at __syncthreads");
        else if (miss >= 0 && b->state[miss] == T_WARP)
            snprintf(where, sizeof where, "at %s with mask 0x%08x", kind_name(b->opkind[miss]),
                     b->opmask[miss]);
        else if (miss >= 0 && b->state[miss] == T_DONE)
            snprintf(where, sizeof where, "after exiting");
        if (miss >= 0)
            format(b, "thread %s waits at %s with mask 0x%08x for thread %s, which waits %s",
                   thread_text(b, warp).s, kind_name(b->opkind[warp]), mask, thread_text(b, miss).s,
                   where);
        else
            format(b, "thread %s waits at %s with mask 0x%08x forever", thread_text(b, warp).s,
                   kind_name(b->opkind[warp]), mask);
    } else {
        format(b, "threads wait forever (%d of %d have exited)", b->done, b->n);
    }
    ::emu::fail("%s", b->msg);
}

/* ---- threads ---- */

inline void rq_push_back(block_state *b, int i) {
    b->rq[(b->rq_head + b->rq_len) & (kMaxThreads - 1)] = i;
    b->rq_len++;
}

inline void rq_push_front(block_state *b, int i) {
    b->rq_head = (b->rq_head - 1) & (kMaxThreads - 1);
    b->rq[b->rq_head] = i;
    b->rq_len++;
}

/* What runs next: a released thread (made current here), a new runner, or, when nothing can
 * run, the scheduler. */
fiber *next_context(engine *e) {
    block_state *b = &e->blk;
    if (b->rq_len) {
        const int i = b->rq[b->rq_head];
        b->rq_head = (b->rq_head + 1) & (kMaxThreads - 1);
        b->rq_len--;
        regs.tid = b->tid[i];
        b->self = i;
        b->cur = b->fib[i];
        b->state[i] = T_RUN;
        return b->cur;
    }
    if (b->next < b->n) {
        fiber *f = e->get_fiber();
#ifdef MGT_SIMT_ASAN
        /* The last runner on this stack never returned: its frames' redzones, above where it
         * switched away for good, are still poisoned. */
#ifdef MGT_SIMT_UCONTEXT
        __asan_unpoison_memory_region(f->stack, f->size);
#else
        if (f->sp)
            __asan_unpoison_memory_region(f->sp, (size_t)(f->stack + f->size - (char *)f->sp));
#endif
#endif
        prepare(f);
        return f;
    }
    return &e->host;
}

/* Parks the running thread until a partner releases it and it is picked to run. */
void park(block_state *b, uint8_t st) {
    engine *e = t_eng;
    const int i = b->self;
    fiber *me = b->cur;
    b->state[i] = st;
    b->fib[i] = me;
    b->tid[i] = regs.tid;
    jump(e, me, next_context(e));
}

/* A thread has returned from the kernel: nobody may be waiting for it. */
void exited(block_state *b, int i) {
    b->state[i] = T_DONE;
    b->done++;
    const int w = i >> 5;
    b->warp_done[w] |= 1u << (i & 31);
    if (b->bar_arrived) {
        const int at = first_in(b, T_BAR);
        fail_here(b, "thread %s has exited while thread %s waits at __syncthreads",
                  thread_text(b, i).s, thread_text(b, at).s);
    }
    for (int k = 0; k < b->nops[w]; k++)
        if (b->ops[w][k].mask >> (i & 31) & 1u) {
            int at = -1;
            for (int j = w * 32; j < w * 32 + 32 && j < b->n && at < 0; j++)
                if (b->state[j] == T_WARP && b->opmask[j] == b->ops[w][k].mask)
                    at = j;
            fail_here(b, "thread %s has exited while thread %s waits for it at %s with mask 0x%08x",
                      thread_text(b, i).s, thread_text(b, at).s, kind_name(b->ops[w][k].kind),
                      b->ops[w][k].mask);
        }
}

void runner_main(fiber *self) {
    engine *e = t_eng;
#ifdef MGT_SIMT_ASAN
    const bool from_host = e->from == &e->host;
    __sanitizer_finish_switch_fiber(self->fake, from_host ? &e->host_bottom : nullptr,
                                    from_host ? &e->host_size : nullptr);
#endif
    block_state *b = &e->blk;
    while (b->next < b->n) {
        const int i = b->next++;
        regs.tid = b->next_tid;
        if (++b->next_tid.x == b->block.x) {
            b->next_tid.x = 0;
            if (++b->next_tid.y == b->block.y) {
                b->next_tid.y = 0;
                b->next_tid.z++;
            }
        }
        b->self = i;
        b->cur = self;
        b->state[i] = T_RUN;
        b->thunk(b->args);
        exited(b, i);
    }
    /* No thread left to start, so next_context cannot hand this stack to a new runner. */
    e->idle.push_back(self);
    jump(e, self, next_context(e));
    abort(); /* not reached */
}

void run_block(engine *e) {
    block_state *b = &e->blk;
    b->next = 0;
    b->next_tid = uint3{0, 0, 0};
    b->done = 0;
    b->bar_arrived = b->bar_count = b->bar_result = 0;
    b->rq_head = b->rq_len = 0;
    std::memset(b->state, T_NEW, (size_t)b->n);
    const int warps = (b->n + 31) / 32;
    std::memset(b->nops, 0, sizeof b->nops[0] * (size_t)warps);
    std::memset(b->warp_done, 0, sizeof b->warp_done[0] * (size_t)warps);
    /* The fibers come back here only when nothing can run. */
    jump(e, &e->host, next_context(e));
    if (b->failed)
        ::emu::fail("%s", b->msg);
    if (b->done != b->n)
        deadlock(b);
}

/* The running thread, for the synchronisation functions. */
block_state *current(const char *what) {
    block_state *b = t_blk;
    if (!b)
        ::emu::fail("%s called outside a kernel", what);
    return b;
}

} // namespace

void run_grid(const char *name, dim3 grid, dim3 block, void (*thunk)(const void *),
              const void *args) {
    if (!t_engine) {
        t_engine = std::make_unique<engine>();
        t_eng = t_engine.get();
    }
    engine *e = t_eng;
    if (t_blk)
        ::emu::fail("kernel %s launched from inside kernel %s", name, t_blk->name);
    if (!config_ok(grid, block, 0))
        ::emu::fail("kernel %s: invalid configuration reached the engine", name);
    block_state *b = &e->blk;
    b->name = name;
    b->grid = grid;
    b->block = block;
    b->thunk = thunk;
    b->args = args;
    b->n = (int)(block.x * block.y * block.z);
    b->failed = false;
    const regs_t saved = regs; /* a host thread that runs grids has no indices of its own */
    regs.bdim = block;
    regs.gdim = grid;
    t_blk = b;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                regs.bid = uint3{x, y, z};
                run_block(e);
            }
    t_blk = nullptr;
    regs = saved;
}

int barrier(int pred) {
    block_state *b = current("__syncthreads");
    const int i = b->self;
    if (b->done) {
        const int gone = first_in(b, T_DONE);
        fail_here(b, "thread %s reached __syncthreads after thread %s has exited",
                  thread_text(b, i).s, thread_text(b, gone).s);
    }
    b->bar_count += pred != 0;
    if (++b->bar_arrived < b->n) {
        park(b, T_BAR);
        return b->bar_result;
    }
    /* The last to arrive: release the others, in order, and go on. Their result stays valid
     * until the next barrier completes, which needs them all to have run again. */
    b->bar_result = b->bar_count;
    b->bar_count = 0;
    b->bar_arrived = 0;
    for (int j = 0; j < b->n; j++)
        if (j != i) {
            b->state[j] = T_READY;
            rq_push_back(b, j);
        }
    return b->bar_result;
}

uint64_t warp_op(int kind, unsigned mask, uint64_t bits, int bval, int cval, int size) {
    block_state *b = current(kind_name(kind));
    const int i = b->self, w = i >> 5, lane = i & 31, base = w * 32;
    const int lanes = b->n - base < 32 ? b->n - base : 32;
    const unsigned exist = lanes == 32 ? ~0u : (1u << lanes) - 1;
    if (!(mask >> lane & 1u))
        fail_here(b, "thread %s calls %s with mask 0x%08x, which does not name its own lane %d",
                  thread_text(b, i).s, kind_name(kind), mask, lane);
    if (mask & ~exist)
        fail_here(b,
                  "thread %s calls %s with mask 0x%08x, but its warp has only %d threads "
                  "(a block of %d)",
                  thread_text(b, i).s, kind_name(kind), mask, lanes, b->n);
    if (mask & b->warp_done[w]) {
        const int gone = base + __builtin_ctz(mask & b->warp_done[w]);
        fail_here(b, "thread %s calls %s with mask 0x%08x, but thread %s has exited",
                  thread_text(b, i).s, kind_name(kind), mask, thread_text(b, gone).s);
    }
    if (kind <= W_BFLY) {
        const int width = 32 - (cval >> 8);
        if (width < 1 || width > 32 || (width & (width - 1)))
            fail_here(b, "thread %s calls %s with width %d (not a power of 2 up to 32)",
                      thread_text(b, i).s, kind_name(kind), width);
    }
    b->val[i] = bits;
    b->opb[i] = bval;
    b->opc[i] = cval;
    b->opkind[i] = kind;
    b->opmask[i] = mask;
    /* Join the pending operation of the same kind and mask, or open one. */
    warp_pending *op = nullptr;
    for (int k = 0; k < b->nops[w]; k++)
        if (b->ops[w][k].mask == mask && b->ops[w][k].kind == kind) {
            op = &b->ops[w][k];
            break;
        }
    if (!op) {
        op = &b->ops[w][b->nops[w]++];
        *op = warp_pending{mask, 0, kind, size};
    } else if (op->size != size) {
        fail_here(b, "lanes of warp %d exchange values of %d and %d bytes at %s (mask 0x%08x)", w,
                  op->size, size, kind_name(kind), mask);
    }
    op->arrived |= 1u << lane;
    if (op->arrived != mask) {
        park(b, T_WARP);
        return b->res[i];
    }
    /* The last lane: every lane's result (PTX shfl.sync: c holds the segment mask in bits 8..12
     * and the clamp lane in bits 0..4), then the others resume first, lowest lane first. */
    if (kind <= W_BFLY) {
        for (int l = 0; l < 32; l++) {
            if (!(mask >> l & 1u))
                continue;
            const int t = base + l, bl = b->opb[t] & 31, c = b->opc[t];
            const int seg = (c >> 8) & 31, clamp = c & 31;
            const int max_lane = (l & seg) | (clamp & ~seg), min_lane = l & seg;
            int j;
            bool in;
            switch (kind) {
            case W_UP:
                j = l - bl;
                in = j >= max_lane;
                break;
            case W_DOWN:
                j = l + bl;
                in = j <= max_lane;
                break;
            case W_BFLY:
                j = l ^ bl;
                in = j <= max_lane;
                break;
            default:
                j = min_lane | (bl & ~seg);
                in = j <= max_lane;
                break;
            }
            if (!in)
                j = l;
            b->res[t] = mask >> j & 1u ? b->val[base + j] : ~(uint64_t)0;
        }
    } else {
        uint64_t votes = 0;
        for (int l = 0; l < 32; l++)
            if ((mask >> l & 1u) && b->val[base + l])
                votes |= 1u << l;
        for (int l = 0; l < 32; l++)
            if (mask >> l & 1u)
                b->res[base + l] = votes;
    }
    *op = b->ops[w][--b->nops[w]];
    for (int l = 31; l >= 0; l--)
        if ((mask >> l & 1u) && l != lane) {
            b->state[base + l] = T_READY;
            rq_push_front(b, base + l);
        }
    return b->res[i];
}

} // namespace simt
} // namespace emu
