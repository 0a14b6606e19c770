/* comm_shm.c: the shared-memory transport, for CPU ranks that are all on one node.
 *
 * The buffers the step's requests work on (the weight and gradient arenas) are placed in MPI-3
 * shared windows (mgt_comm_share), so every rank maps every other rank's. A request then needs
 * no message: each rank publishes, per request slot, a sequence number (and where its range
 * lies) in a control block all ranks map; once every rank has started the request, its range is
 * cut into chunks of CHUNK floats, and whichever rank gets to a chunk first (an atomic ticket)
 * makes that chunk's result straight from the ranks' buffers and writes it where the kind says:
 *   ALLREDUCE      the sum, in rank order ((x0 + x1) + x2) + ..., into every rank's buffer;
 *   REDUCE_OWNERS  the sum into the buffer of the element's owner only;
 *   GATHER_OWNERS  the owner's values into every other rank's buffer.
 * These are the MPI transport's additions in the MPI transport's order, so the two transports
 * give the same bits. Each element is read and written once per rank, at memory speed; no rank
 * copies into a message and out of one again.
 * Who makes a chunk does not change its bits, so the work goes to whoever has time for it. The
 * chunks are dealt into one group per rank (its 1/world, in rank order). A test (made between
 * layers of backward) makes the chunks of the rank's own group, but none while another rank
 * waits; a wait makes every chunk left in every group, then sleeps on a futex in the control
 * block until a start or a completion rings it. So a rank that is ahead does the sums of the
 * ranks behind it instead of leaving them to fall further behind, and it does not spin: where
 * cores share execution units or the host schedules virtual cores onto shared ones, a spinning
 * rank slows the peers it waits for (measured on a 2-core virtual machine: a process spinning
 * on one core made the MLP's backward on the other 20-30% slower).
 *
 * A request is complete when every chunk is done (a second counter). Both counters carry the
 * request's sequence number in their high bits, so they are never reset: a slot is started again
 * only after it was waited for, and it completes on every rank at once, so two uses of a slot
 * are never in flight together. Between its start and its completion nobody but the chunk makers
 * touches a rank's range, and after it nobody touches it at all (every chunk is done).
 * The control block is rank 0's part of a window of its own, allocated when the slots are
 * reserved. Memory order: a rank's data is written before it publishes its sequence number
 * (release), read after the others' are seen (acquire); a chunk's results are written before the
 * done counter moves (release), read after it is seen complete (acquire). */
#include <limits.h>
#include <linux/futex.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "runtime.h"
#include "util.h"

/* Floats per chunk: 64 KiB, so a chunk's addends and its sum stay in a core's L2, and a bucket
 * of a quarter MiB is four chunks for whichever ranks are there. */
enum { CHUNK = 16384 };
/* The counters: the sequence number above COUNT_BITS, a chunk count below. */
enum { COUNT_BITS = 24 };
#define COUNT_MASK ((UINT64_C(1) << COUNT_BITS) - 1)
/* How long a wait polls before it sleeps: about what the last chunks of a bucket take, so that
 * the common short wait does not pay a wake-up. */
#define SPIN_S 50e-6

/* One rank's part of a slot in the control block: what it started, and where; and the ticket of
 * its group of chunks. */
typedef struct shm_pub {
    _Atomic uint64_t seq; /* the last use of the slot this rank started */
    int64_t off;          /* byte offset of the range's first element in window `win` */
    int64_t win;
    _Atomic uint64_t ticket; /* seq << COUNT_BITS | chunks of this rank's group handed out */
    char pad[32];
} shm_pub;

typedef struct shm_ctr {
    _Atomic uint64_t done; /* seq << COUNT_BITS | chunks made */
    char pad[56];
} shm_ctr;

/* The control block's head: the bell waiting ranks sleep on (a futex), rung by every start and
 * every completion while anyone sleeps. */
typedef struct shm_bell {
    _Atomic uint32_t bell;
    char pad1[60];
    _Atomic uint32_t sleepers;
    _Atomic uint32_t waiters; /* ranks inside a wait */
    char pad2[56];
} shm_bell;

typedef struct shm_win {
    MPI_Win win;
    char **base; /* every rank's part */
    size_t bytes;
} shm_win;

typedef struct shm_slot {
    uint64_t seq; /* this rank's current use */
    int active, done;
    mgt_coll kind;
    size_t lo, count, nchunks;
} shm_slot;

typedef struct shm_state {
    shm_win *wins;
    int nwins;
    shm_win ctl_win; /* rank 0's part holds the control block; base NULL: none yet */
    char *ctl;       /* shm_bell, then nslots x (shm_ctr, world x shm_pub) */
    shm_slot *slot;
    int nslots;
    float *tmp; /* CHUNK floats: a chunk's sums */
} shm_state;

static size_t slot_bytes(int world) {
    return sizeof(shm_ctr) + (size_t)world * sizeof(shm_pub);
}

static shm_bell *bell_of(const shm_state *s) {
    return (shm_bell *)s->ctl;
}

static shm_ctr *ctr_of(const mgt_comm *c, const shm_state *s, int slot) {
    return (shm_ctr *)(s->ctl + sizeof(shm_bell) + (size_t)slot * slot_bytes(c->world));
}

static shm_pub *pub_of(const mgt_comm *c, const shm_state *s, int slot, int r) {
    return (shm_pub *)((char *)ctr_of(c, s, slot) + sizeof(shm_ctr)) + r;
}

/* Wakes the ranks sleeping in a wait (after a start or a completion). */
static void ring(shm_state *s) {
    shm_bell *b = bell_of(s);
    atomic_fetch_add(&b->bell, 1);
    if (atomic_load(&b->sleepers) > 0)
        syscall(SYS_futex, (uint32_t *)&b->bell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void check(int rc, const char *call) {
    if (rc != MPI_SUCCESS) {
        char msg[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(rc, msg, &len);
        mgt_die("%s failed in the shared-memory transport: %s", call, msg);
    }
}

/* Open MPI backs a shared window with a file in /dev/shm (its osc_sm_backing_directory, where
 * that folder is writable), and a file system too small for it ends the job inside
 * MPI_Win_allocate_shared with MPI_ERR_INTERN and no word of what to do. So the room is checked
 * first, the same on every rank (rank 0 looks, and says): each rank's part on whole pages, a page
 * more for each rank and one for the window's own state (a little more than Open MPI asks). A
 * folder that cannot be looked at is left to MPI. Collective. */
static int check_room(mgt_comm *c, size_t bytes, mgt_err *err) {
    const double page = (double)sysconf(_SC_PAGESIZE);
    double mine = (ceil((double)bytes / page) + 1) * page, need = 0, avail = -1;
    MPI_Allreduce(&mine, &need, 1, MPI_DOUBLE, MPI_SUM, c->mpi);
    need += page;
    const char *dir = getenv("OMPI_MCA_osc_sm_backing_directory");
    if (!dir || !*dir)
        dir = "/dev/shm";
    struct statvfs v;
    if (c->rank == 0 && access(dir, W_OK) == 0 && statvfs(dir, &v) == 0)
        avail = (double)v.f_bavail * (double)v.f_frsize;
    MPI_Bcast(&avail, 1, MPI_DOUBLE, 0, c->mpi);
    if (avail < 0 || need <= avail)
        return 0;
    return mgt_errf(err,
                    "--transport shm: the ranks need %.1f MiB of shared memory in %s, which has "
                    "%.1f MiB free; use --transport mpi, or make %s larger (a container's "
                    "--shm-size, or mount -o remount,size=... %s)",
                    need / 1048576, dir, avail / 1048576, dir, dir);
}

/* A window of `bytes` per rank (collective), and every rank's part of it. */
static int new_window(mgt_comm *c, size_t bytes, shm_win *w, mgt_err *err) {
    if (check_room(c, bytes, err) < 0)
        return -1;
    MPI_Info info;
    MPI_Info_create(&info);
    /* each rank's part on its own pages (near its core on a NUMA node) */
    MPI_Info_set(info, "alloc_shared_noncontig", "true");
    char *mine = NULL;
    int rc = MPI_Win_allocate_shared((MPI_Aint)bytes, 1, info, c->mpi, &mine, &w->win);
    MPI_Info_free(&info);
    if (rc != MPI_SUCCESS)
        return mgt_errf(err,
                        "cannot allocate %zu bytes of memory shared between the ranks of this "
                        "node (MPI_Win_allocate_shared); use --transport mpi",
                        bytes);
    w->bytes = bytes;
    w->base = calloc((size_t)c->world, sizeof *w->base);
    if (!w->base)
        return mgt_errf(err, "out of host memory");
    for (int r = 0; r < c->world; r++) {
        MPI_Aint size = 0;
        int unit = 0;
        check(MPI_Win_shared_query(w->win, r, &size, &unit, &w->base[r]), "MPI_Win_shared_query");
    }
    return 0;
}

static void free_window(shm_win *w) {
    MPI_Win_free(&w->win);
    free(w->base);
    w->base = NULL;
}

static void *shm_share(mgt_comm *c, size_t bytes, mgt_err *err) {
    shm_state *s = c->impl;
    shm_win *nw = realloc(s->wins, sizeof *nw * (size_t)(s->nwins + 1));
    if (!nw) {
        mgt_errf(err, "out of host memory");
        return NULL;
    }
    s->wins = nw;
    /* 64-byte multiples: every rank's part starts on a cache line */
    const size_t n = (bytes + 63) & ~(size_t)63;
    if (new_window(c, n, &nw[s->nwins], err) < 0)
        return NULL;
    char *mine = nw[s->nwins++].base[c->rank];
    memset(mine, 0, n); /* zeroed, as the backend's memory is */
    return mine;
}

static int shm_reserve(mgt_comm *c, int n, mgt_err *err) {
    shm_state *s = c->impl;
    if (n <= s->nslots)
        return 0;
    shm_slot *ns = calloc((size_t)n, sizeof *ns);
    if (!ns)
        return mgt_errf(err, "out of host memory for %d communication requests", n);
    /* A new control block (no request is in flight while slots are reserved), zeroed by its
     * holder before anyone reads it. */
    if (s->ctl_win.base)
        free_window(&s->ctl_win);
    const size_t bytes = c->rank == 0 ? sizeof(shm_bell) + (size_t)n * slot_bytes(c->world) : 0;
    if (new_window(c, bytes, &s->ctl_win, err) < 0) {
        free(ns);
        return -1;
    }
    s->ctl = s->ctl_win.base[0];
    if (c->rank == 0)
        memset(s->ctl, 0, bytes);
    check(MPI_Barrier(c->mpi), "MPI_Barrier");
    free(s->slot);
    s->slot = ns;
    s->nslots = n;
    return 0;
}

/* The window holding buf[lo, lo + count), or -1. */
static int window_of(const mgt_comm *c, const shm_state *s, const float *buf, size_t lo,
                     size_t count) {
    const uintptr_t a = (uintptr_t)(buf + lo), b = (uintptr_t)(buf + lo + count);
    for (int i = 0; i < s->nwins; i++) {
        const uintptr_t base = (uintptr_t)s->wins[i].base[c->rank];
        if (a >= base && b <= base + s->wins[i].bytes)
            return i;
    }
    return -1;
}

static void shm_start(mgt_comm *c, int slot, mgt_coll kind, float *buf, size_t lo, size_t count) {
    shm_state *s = c->impl;
    shm_slot *q = &s->slot[slot];
    const int w = window_of(c, s, buf, lo, count);
    if (w < 0)
        mgt_die("the shared-memory transport was handed a buffer outside its shared memory; "
                "please report this (--transport mpi avoids it)");
    q->seq++;
    q->kind = kind;
    q->lo = lo;
    q->count = count;
    q->nchunks = (count + CHUNK - 1) / CHUNK;
    if (q->nchunks > COUNT_MASK || q->seq >= UINT64_C(1) << (64 - COUNT_BITS))
        mgt_die("the shared-memory transport cannot count %zu chunks; use --transport mpi",
                q->nchunks);
    q->active = 1;
    q->done = q->nchunks == 0;
    shm_pub *p = pub_of(c, s, slot, c->rank);
    p->off = (int64_t)((char *)(buf + lo) - s->wins[w].base[c->rank]);
    p->win = w;
    atomic_store_explicit(&p->seq, q->seq, memory_order_release);
    ring(s);
}

/* The range's element i (from lo) in rank r's buffer. */
static float *at(const mgt_comm *c, const shm_state *s, int slot, int r, size_t i) {
    const shm_pub *p = pub_of(c, s, slot, r);
    return (float *)(s->wins[p->win].base[r] + p->off) + i;
}

/* The sums of elements [a, b) of the range (from lo) in rank order, into tmp. */
static void sum_into(const mgt_comm *c, const shm_state *s, int slot, size_t a, size_t b,
                     float *restrict tmp) {
    const size_t n = b - a;
    memcpy(tmp, at(c, s, slot, 0, a), n * sizeof(float));
    for (int r = 1; r < c->world; r++) {
        const float *restrict x = at(c, s, slot, r, a);
        for (size_t i = 0; i < n; i++)
            tmp[i] += x[i];
    }
}

/* Chunk k of slot q: its results where the kind puts them. */
static void make_chunk(mgt_comm *c, shm_state *s, int slot, const shm_slot *q, size_t k) {
    const size_t a = k * CHUNK, b = a + CHUNK < q->count ? a + CHUNK : q->count;
    if (q->kind == MGT_COLL_ALLREDUCE) {
        if (c->world == 2) { /* one pass: both addends read, the sum written to both */
            float *restrict x = at(c, s, slot, 0, a), *restrict y = at(c, s, slot, 1, a);
            for (size_t i = 0; i < b - a; i++) {
                const float v = x[i] + y[i];
                x[i] = v;
                y[i] = v;
            }
            return;
        }
        sum_into(c, s, slot, a, b, s->tmp);
        for (int r = 0; r < c->world; r++)
            memcpy(at(c, s, slot, r, a), s->tmp, (b - a) * sizeof(float));
        return;
    }
    /* The owners' kinds: the chunk cut at the owners' boundaries. */
    for (int o = 0; o < c->world; o++) {
        size_t x, y;
        mgt_comm_owned(c, o, q->lo + a, b - a, &x, &y);
        if (x == y)
            continue;
        x -= q->lo;
        y -= q->lo;
        if (q->kind == MGT_COLL_REDUCE_OWNERS) {
            sum_into(c, s, slot, x, y, s->tmp);
            memcpy(at(c, s, slot, o, x), s->tmp, (y - x) * sizeof(float));
        } else {
            for (int r = 0; r < c->world; r++)
                if (r != o)
                    memcpy(at(c, s, slot, r, x), at(c, s, slot, o, x), (y - x) * sizeof(float));
        }
    }
}

/* Takes a chunk of use `seq` of a group of n chunks: its index, or -1 when none is left. */
static long take(_Atomic uint64_t *ticket, uint64_t seq, size_t n) {
    if (n == 0)
        return -1;
    uint64_t w = atomic_load_explicit(ticket, memory_order_relaxed);
    for (;;) {
        uint64_t k;
        if (w >> COUNT_BITS < seq)
            k = 0;
        else if (w >> COUNT_BITS == seq && (w & COUNT_MASK) < n)
            k = w & COUNT_MASK;
        else
            return -1;
        if (atomic_compare_exchange_weak_explicit(ticket, &w, seq << COUNT_BITS | (k + 1),
                                                  memory_order_acq_rel, memory_order_relaxed))
            return (long)k;
    }
}

/* Counts one more chunk of use `seq` made; returns whether that was the last of n. */
static int made(_Atomic uint64_t *done, uint64_t seq, size_t n) {
    uint64_t w = atomic_load_explicit(done, memory_order_relaxed);
    for (;;) {
        const uint64_t nw = w >> COUNT_BITS < seq ? seq << COUNT_BITS | 1 : w + 1;
        if (atomic_compare_exchange_weak_explicit(done, &w, nw, memory_order_release,
                                                  memory_order_relaxed))
            return (nw & COUNT_MASK) == n;
    }
}

/* Whether the slot's current use is complete (every chunk made). */
static int complete(const mgt_comm *c, shm_state *s, int slot) {
    shm_slot *q = &s->slot[slot];
    if (!q->done) {
        const uint64_t w = atomic_load_explicit(&ctr_of(c, s, slot)->done, memory_order_acquire);
        q->done = w >> COUNT_BITS > q->seq ||
                  (w >> COUNT_BITS == q->seq && (w & COUNT_MASK) == q->nchunks);
    }
    return q->done;
}

/* Once every rank has started the slot: makes the chunks left in this rank's group, and with
 * `steal` those left in every other group too; and whether the slot is complete. */
static int advance(mgt_comm *c, shm_state *s, int slot, int steal) {
    shm_slot *q = &s->slot[slot];
    if (q->done)
        return 1;
    shm_ctr *ctr = ctr_of(c, s, slot);
    for (int r = 0; r < c->world; r++)
        if (atomic_load_explicit(&pub_of(c, s, slot, r)->seq, memory_order_acquire) < q->seq)
            return 0;
    for (int i = 0; i < (steal ? c->world : 1); i++) {
        const int g = (c->rank + i) % c->world;
        const size_t first = q->nchunks * (size_t)g / (size_t)c->world,
                     end = q->nchunks * (size_t)(g + 1) / (size_t)c->world;
        long k;
        while ((k = take(&pub_of(c, s, slot, g)->ticket, q->seq, end - first)) >= 0) {
            make_chunk(c, s, slot, q, first + (size_t)k);
            if (made(&ctr->done, q->seq, q->nchunks))
                ring(s);
        }
    }
    return complete(c, s, slot);
}

/* A test makes this rank's own chunks, unless another rank waits (see the top). */
static int shm_test(mgt_comm *c, int slot) {
    shm_state *s = c->impl;
    if (atomic_load_explicit(&bell_of(s)->waiters, memory_order_relaxed) > 0)
        return complete(c, s, slot);
    return advance(c, s, slot, 0);
}

/* Whether slot `slot` is complete, after making what chunks of every slot in flight can be. */
static int poll_all(mgt_comm *c, shm_state *s, int slot) {
    for (int i = 0; i < s->nslots; i++)
        if (i != slot && s->slot[i].active)
            (void)advance(c, s, i, 1);
    return advance(c, s, slot, 1);
}

/* Waits for one slot, making chunks of every slot in flight meanwhile, and with nothing left to
 * make sleeping on the bell (see the top). Sleeps are bounded: a lost wake-up would cost a
 * millisecond. */
static void shm_wait(mgt_comm *c, int slot) {
    shm_state *s = c->impl;
    shm_bell *b = bell_of(s);
    double t0 = 0;
    atomic_fetch_add(&b->waiters, 1);
    while (!poll_all(c, s, slot)) {
        if (t0 == 0)
            t0 = mgt_now();
        if (mgt_now() - t0 < SPIN_S)
            continue;
        atomic_fetch_add(&b->sleepers, 1);
        const uint32_t v = atomic_load(&b->bell);
        if (!poll_all(c, s, slot)) {
            struct timespec ts = {0, 1000 * 1000};
            syscall(SYS_futex, (uint32_t *)&b->bell, FUTEX_WAIT, v, &ts, NULL, 0);
        }
        atomic_fetch_sub(&b->sleepers, 1);
    }
    atomic_fetch_sub(&b->waiters, 1);
    s->slot[slot].active = 0;
}

/* Blocking sums of any buffer (synchronised batchnorm's statistics): MPI's own. */
static void shm_allreduce_f32(mgt_comm *c, float *buf, size_t count) {
    for (size_t off = 0; off < count; off += INT_MAX) {
        size_t n = count - off < INT_MAX ? count - off : INT_MAX;
        check(MPI_Allreduce(MPI_IN_PLACE, buf + off, (int)n, MPI_FLOAT, MPI_SUM, c->mpi),
              "MPI_Allreduce");
    }
}

static void shm_destroy(mgt_comm *c) {
    shm_state *s = c->impl;
    if (!s)
        return;
    for (int i = 0; i < s->nwins; i++)
        free_window(&s->wins[i]);
    if (s->ctl_win.base)
        free_window(&s->ctl_win);
    free(s->wins);
    free(s->slot);
    free(s->tmp);
    free(s);
    c->impl = NULL;
}

static const mgt_comm_ops shm_ops = {
    .name = "shm",
    .allreduce_sum_f32 = shm_allreduce_f32,
    .reserve = shm_reserve,
    .start = shm_start,
    .test = shm_test,
    .wait = shm_wait,
    .destroy = shm_destroy,
    .share = shm_share,
};

int mgt_comm_init_shm(mgt_comm *c, MPI_Comm mpi, double timeout_s, mgt_err *err) {
    mgt_comm_init_common(c, mpi, timeout_s);
    c->ops = &shm_ops;
    c->host_progress = 1;
    shm_state *s = calloc(1, sizeof *s);
    c->impl = s;
    if (!s || !(s->tmp = malloc(CHUNK * sizeof(float))))
        return mgt_errf(err, "out of host memory");
    int init = 0;
    MPI_Initialized(&init);
    if (init) {
        MPI_Comm node;
        int local = 0;
        check(MPI_Comm_split_type(mpi, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
              "MPI_Comm_split_type");
        MPI_Comm_size(node, &local);
        MPI_Comm_free(&node);
        /* (every rank sees the same answer: the world is on one node or it is not) */
        if (local != c->world)
            return mgt_errf(err,
                            "--transport shm needs every rank on one node, but this rank's node "
                            "has %d of the %d; use --transport mpi (or auto)",
                            local, c->world);
    } else {
        return mgt_errf(err, "--transport shm needs MPI (start the job with mpirun or srun)");
    }
    return 0;
}
