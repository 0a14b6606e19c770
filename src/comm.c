/* comm.c: the MPI transport, its asynchronous requests and their progress, and the watchdog that
 * keeps a job from hanging.
 *
 * MPI counts are int: buffers larger than INT_MAX elements are sent in pieces.
 *
 * Requests (comm.h). The sums are made here, from point-to-point messages, so that each element
 * is always summed in rank order, ((x0 + x1) + x2) + ..., whatever the message sizes: a
 * reduce-scatter in which every rank sends each owner its part and the owner adds the parts up
 * in rank order, then (ALLREDUCE) each owner sends its sums to every rank. REDUCE_OWNERS is the
 * first half with ZeRO-1's owner slices, ALLREDUCE both halves with the range cut evenly over the
 * ranks; so bucketed and one-shot reductions, and ZeRO-1's and plain data-parallel's, give the
 * same bits on any number of ranks, which an MPI library's own collective does not promise (its
 * algorithm, and with it the order of the additions, changes with the message size). Each rank
 * does 1/world of the additions and sends and receives (world - 1)/world of the range twice,
 * like a ring, in one step per half; Open MPI's non-blocking all-reduce on fewer than 4 ranks
 * is instead a binomial tree that makes rank 0 do every addition while the others wait for it.
 * GATHER_OWNERS is the second half alone, with the owner slices. Every message is tagged with
 * its request slot and stage, so requests may be started, and complete, in a different order
 * on different ranks (the update takes the buckets as they arrive), which MPI's collectives
 * forbid.
 * MPI moves a request only while the process is inside MPI, and the additions between the halves
 * are made by whoever finds the first half complete, so something must keep calling in while
 * backward computes:
 *   - test mode (the default): the reducer's test calls, made between layers;
 *   - thread mode: a progress thread per rank that tests the outstanding requests every few tens
 *     of microseconds. All of this file's MPI calls then take one mutex, so MPI is never entered
 *     by two threads at once: MPI_THREAD_SERIALIZED is enough (runtime.c asks for it), and no
 *     other module calls MPI during a step (every collective of the step goes through here).
 * bench/overlap measures the two modes' exposed communication. */
#include "comm.h"

#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "runtime.h"
#include "util.h"

/* The watchdog: the main thread stamps the start of each collective; a thread checks once a
 * second and, past the timeout, reports and exits the process (mpirun then ends the others). It
 * never calls MPI itself, so MPI_THREAD_FUNNELED is enough. */
struct mgt_watchdog {
    pthread_t thread;
    double timeout;
    int rank;
    _Atomic double since; /* 0: not inside a collective */
    _Atomic(const char *) what;
    atomic_int stop;
};

static void *watch(void *arg) {
    struct mgt_watchdog *d = arg;
    while (!atomic_load(&d->stop)) {
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
        double since = atomic_load(&d->since);
        if (since > 0 && mgt_now() - since > d->timeout) {
            fprintf(stderr,
                    "rank %d: %s did not complete within %.0f s: another rank died or stopped; "
                    "ending the job (see the other ranks' messages above; raise --comm-timeout "
                    "if steps are legitimately this slow)\n",
                    d->rank, atomic_load(&d->what), d->timeout);
            fflush(stderr);
            mgt_runtime_exit_now(124);
        }
    }
    return NULL;
}

void mgt_comm_enter(mgt_comm *c, const char *what) {
    if (c->dog) {
        atomic_store(&c->dog->what, what);
        atomic_store(&c->dog->since, mgt_now());
    }
}

void mgt_comm_leave(mgt_comm *c) {
    if (c->dog)
        atomic_store(&c->dog->since, 0.0);
}

static void mpi_check(int rc, const char *call, const char *what) {
    if (rc != MPI_SUCCESS) {
        char s[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(rc, s, &len);
        mgt_die("%s failed during %s: %s", call, what, s);
    }
}

/* ---- the MPI transport's requests -------------------------------------------------------- */

/* One request slot: the MPI requests of its current stage (one per peer and INT_MAX piece),
 * the stage, and for the sums the parts received from the other ranks. */
typedef struct mpi_slot {
    MPI_Request *req;
    int n, cap;
    int active;  /* started and not yet waited for */
    int done;    /* seen complete (thread mode: by the progress thread) */
    mgt_coll kind;
    int stage;   /* 1: parts travelling to their owner; 2: owners' parts travelling to all */
    float *buf;
    size_t lo, count;
    float *parts; /* (world - 1) x this rank's part: the others' addends */
    size_t parts_cap;
} mpi_slot;

typedef struct mpi_state {
    mpi_slot *slot;
    int nslots;
    /* Thread mode: the progress thread, and the mutex every MPI call of this file takes. */
    int threaded;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop, pending; /* slots active and not yet complete */
} mpi_state;

static void lock(mpi_state *s) {
    if (s && s->threaded)
        pthread_mutex_lock(&s->mu);
}

static void unlock(mpi_state *s) {
    if (s && s->threaded)
        pthread_mutex_unlock(&s->mu);
}

static mpi_state *mpi_state_of(mgt_comm *c) {
    return c->ops && !strcmp(c->ops->name, "mpi") ? c->impl : NULL;
}

static void mpi_allreduce_f32(mgt_comm *c, float *buf, size_t count) {
    mpi_state *s = c->impl;
    lock(s);
    for (size_t off = 0; off < count; off += INT_MAX) {
        size_t n = count - off < INT_MAX ? count - off : INT_MAX;
        mpi_check(MPI_Allreduce(MPI_IN_PLACE, buf + off, (int)n, MPI_FLOAT, MPI_SUM, c->mpi),
                  "MPI_Allreduce", "gradient all-reduce");
    }
    unlock(s);
}

static int mpi_reserve(mgt_comm *c, int n, mgt_err *err) {
    mpi_state *s = c->impl;
    if (n <= s->nslots)
        return 0;
    /* Two message tags per slot (p2p): within what this MPI allows (at least 32767). */
    int *ub = NULL, has = 0;
    MPI_Comm_get_attr(c->mpi, MPI_TAG_UB, &ub, &has);
    const long long max_tag = has && ub ? *ub : 32767;
    if (2LL * n - 1 > max_tag)
        return mgt_errf(err,
                        "%d communication requests per step need message tags up to %lld, "
                        "beyond this MPI's %lld; use larger buckets (--bucket-mb)",
                        n, 2LL * n - 1, max_tag);
    mpi_slot *ns = realloc(s->slot, sizeof *ns * (size_t)n);
    if (!ns)
        return mgt_errf(err, "out of host memory for %d communication requests", n);
    memset(ns + s->nslots, 0, sizeof *ns * (size_t)(n - s->nslots));
    s->slot = ns;
    s->nslots = n;
    return 0;
}

/* Room for one more request in slot q (grows on a slot's first use, before the loop settles). */
static MPI_Request *next_req(mgt_comm *c, mpi_slot *q) {
    if (q->n == q->cap) {
        int cap = q->cap ? 2 * q->cap : 2 * c->world;
        MPI_Request *r = realloc(q->req, sizeof *r * (size_t)cap);
        if (!r)
            mgt_die("out of host memory for %d communication requests", cap);
        q->req = r;
        q->cap = cap;
    }
    return &q->req[q->n++];
}

void mgt_comm_slice(size_t count, int r, int world, size_t *lo, size_t *n) {
    /* Rank r's share starts at r/world of the arena, rounded down to 16 floats (64 bytes: vector
     * loads, cuBLAS and NCCL alignment); the last ends at the arena's end. */
    size_t a = r == 0 ? 0 : ((size_t)((double)count * r / world) & ~(size_t)15);
    size_t b = r + 1 == world ? count : ((size_t)((double)count * (r + 1) / world) & ~(size_t)15);
    if (a > count)
        a = count;
    if (b < a)
        b = a;
    *lo = a;
    *n = b - a;
}

/* Rank r's part of the slot's range: its owner slice (REDUCE_OWNERS, GATHER_OWNERS), or its
 * slice of the range itself (ALLREDUCE). */
static void part_of(const mgt_comm *c, const mpi_slot *q, int r, size_t *a, size_t *b) {
    if (q->kind != MGT_COLL_ALLREDUCE) {
        mgt_comm_owned(c, r, q->lo, q->count, a, b);
        return;
    }
    size_t x, n;
    mgt_comm_slice(q->count, r, c->world, &x, &n);
    *a = q->lo + x;
    *b = q->lo + x + n;
}

/* Point-to-point messages of [p, p + n) with a peer, in INT_MAX pieces. The tag is the slot and
 * the stage, so the requests of different slots in flight at once never match each other's. */
static void p2p(mgt_comm *c, mpi_slot *q, int slot, int send, float *p, size_t n, int peer) {
    const int tag = 2 * slot + q->stage - 1;
    for (size_t off = 0; off < n; off += INT_MAX) {
        MPI_Request *r = next_req(c, q);
        const int m = (int)(n - off < INT_MAX ? n - off : INT_MAX);
        if (send)
            mpi_check(MPI_Isend(p + off, m, MPI_FLOAT, peer, tag, c->mpi, r), "MPI_Isend",
                      "gradient reduction");
        else
            mpi_check(MPI_Irecv(p + off, m, MPI_FLOAT, peer, tag, c->mpi, r), "MPI_Irecv",
                      "gradient reduction");
    }
}

/* Stage 1 of the sums: each other rank's part of this rank's data goes to it, and the other
 * ranks' addends of this rank's part come in. */
static void start_sums(mgt_comm *c, mpi_slot *q, int slot) {
    size_t a, b;
    part_of(c, q, c->rank, &a, &b);
    const size_t mine = b - a, need = mine * (size_t)(c->world - 1);
    if (need > q->parts_cap) {
        float *p = realloc(q->parts, need * sizeof(float));
        if (!p)
            mgt_die("out of host memory for the gradient reduction (%zu bytes)",
                    need * sizeof(float));
        q->parts = p;
        q->parts_cap = need;
    }
    q->stage = 1;
    for (int r = 0, k = 0; r < c->world; r++) {
        if (r == c->rank)
            continue;
        size_t x, y;
        part_of(c, q, r, &x, &y);
        p2p(c, q, slot, 1, q->buf + x, y - x, r);
        if (mine > 0) /* (parts is NULL while no part was ever owned) */
            p2p(c, q, slot, 0, q->parts + (size_t)k * mine, mine, r);
        k++;
    }
}

static void add_to(float *restrict acc, const float *restrict x, size_t n) {
    for (size_t i = 0; i < n; i++)
        acc[i] += x[i];
}

/* Stage 2 (and all of GATHER_OWNERS): this rank's part goes to every rank, theirs come in. */
static void start_gather(mgt_comm *c, mpi_slot *q, int slot) {
    size_t a, b;
    part_of(c, q, c->rank, &a, &b);
    q->stage = 2;
    for (int r = 0; r < c->world; r++) {
        if (r == c->rank)
            continue;
        size_t x, y;
        part_of(c, q, r, &x, &y);
        p2p(c, q, slot, 1, q->buf + a, b - a, r);
        p2p(c, q, slot, 0, q->buf + x, y - x, r);
    }
}

/* Stage 1 is complete: this rank's part becomes the sum of every rank's addends in rank order;
 * then (ALLREDUCE) stage 2 sends it to every rank and takes theirs. Returns 1 when nothing is
 * left in flight. */
static int finish_sums(mgt_comm *c, mpi_slot *q, int slot) {
    size_t a, b;
    part_of(c, q, c->rank, &a, &b);
    const size_t mine = b - a;
    float *own = q->buf + a;
    /* The addends in rank order: this rank's own, the others' from parts (k-th other rank). A
     * rank may own none of a small range. */
    float *acc = c->rank == 0 ? own : q->parts;
    for (int r = 1; r < c->world && mine > 0; r++)
        add_to(acc, r == c->rank ? own : q->parts + (size_t)(r < c->rank ? r : r - 1) * mine, mine);
    if (acc != own && mine > 0)
        memcpy(own, acc, mine * sizeof(float));
    q->n = 0;
    if (q->kind != MGT_COLL_ALLREDUCE)
        return 1;
    start_gather(c, q, slot);
    return q->n == 0;
}

/* Whether slot q's requests are complete, moving it to its next stage when its current one is. */
static int advance(mgt_comm *c, mpi_slot *q, int slot) {
    for (;;) {
        int flag = 0;
        mpi_check(MPI_Testall(q->n, q->req, &flag, MPI_STATUSES_IGNORE), "MPI_Testall",
                  "a gradient request");
        if (!flag)
            return 0;
        if (q->stage != 1 || finish_sums(c, q, slot))
            return 1;
    }
}

static void mpi_start(mgt_comm *c, int slot, mgt_coll kind, float *buf, size_t lo, size_t count) {
    mpi_state *s = c->impl;
    mpi_slot *q = &s->slot[slot];
    lock(s);
    q->n = 0;
    q->kind = kind;
    q->buf = buf;
    q->lo = lo;
    q->count = count;
    q->stage = 0;
    if (kind == MGT_COLL_GATHER_OWNERS) {
        start_gather(c, q, slot);
        q->done = q->n == 0;
    } else {
        start_sums(c, q, slot);
        q->done = q->n == 0 && finish_sums(c, q, slot);
    }
    q->active = 1;
    if (s->threaded && !q->done) {
        s->pending++;
        pthread_cond_signal(&s->cv);
    }
    unlock(s);
}

static int mpi_test(mgt_comm *c, int slot) {
    mpi_state *s = c->impl;
    mpi_slot *q = &s->slot[slot];
    if (s->threaded) { /* the progress thread tests; the flag is read under its mutex */
        lock(s);
        int done = q->done;
        unlock(s);
        return done;
    }
    if (!q->done)
        q->done = advance(c, q, slot);
    return q->done;
}

/* Waits for one slot by testing every active one: a rank may wait for its requests in another
 * order than its peers, and a slot's next stage starts only where it is tested, so a blocking
 * wait on one slot could wait for a peer that waits for another. (MPI_Wait spins as well.) */
static void mpi_wait(mgt_comm *c, int slot) {
    mpi_state *s = c->impl;
    mpi_slot *q = &s->slot[slot];
    lock(s);
    while (!q->done)
        for (int i = 0; i < s->nslots; i++) {
            mpi_slot *o = &s->slot[i];
            if (o->active && !o->done && advance(c, o, i)) {
                o->done = 1;
                if (s->threaded)
                    s->pending--;
            }
        }
    q->active = 0;
    unlock(s);
}

/* Thread mode: tests the outstanding requests while there are any. The pause between rounds
 * lets the compute thread have the core (a rank of a busy node has none to spare) and is short
 * against a layer's backward; the lock is held only inside MPI. */
static void *progress_main(void *arg) {
    mgt_comm *c = arg;
    mpi_state *s = c->impl;
    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        if (s->pending == 0) {
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        for (int i = 0; i < s->nslots; i++) {
            mpi_slot *q = &s->slot[i];
            if (!q->active || q->done)
                continue;
            if (advance(c, q, i)) {
                q->done = 1;
                s->pending--;
            }
        }
        pthread_mutex_unlock(&s->mu);
        struct timespec ts = {0, 20 * 1000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

int mgt_comm_set_progress(mgt_comm *c, mgt_progress how, mgt_err *err) {
    mpi_state *s = mpi_state_of(c);
    if (how == MGT_PROGRESS_TEST || !s || c->world == 1 || s->threaded)
        return 0; /* other transports progress on their own; one rank has nothing to progress */
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    if (level < MPI_THREAD_SERIALIZED)
        return mgt_errf(err, "--comm-progress thread needs MPI_THREAD_SERIALIZED or more, but MPI "
                             "was started with less (a program that starts MPI itself must ask for "
                             "it in MPI_Init_thread); use --comm-progress test");
    if (pthread_mutex_init(&s->mu, NULL) != 0 || pthread_cond_init(&s->cv, NULL) != 0)
        return mgt_errf(err, "cannot set up the communication progress thread's lock");
    s->threaded = 1;
    if (pthread_create(&s->thread, NULL, progress_main, c) != 0) {
        s->threaded = 0;
        return mgt_errf(err, "cannot start the communication progress thread");
    }
    c->progress_thread = 1;
    return 0;
}

/* MPI_Gatherv's int counts and displacements from size_t counts (root only); NULL elsewhere. */
static int *gather_layout(mgt_comm *c, const size_t *counts, int root, const char *what) {
    if (c->rank != root)
        return NULL;
    int *rc = malloc(2 * sizeof(int) * (size_t)c->world);
    if (!rc)
        mgt_die("out of host memory for a gather of %d ranks", c->world);
    size_t off = 0;
    for (int r = 0; r < c->world; r++) {
        if (counts[r] > INT_MAX || off > INT_MAX)
            mgt_die("%s: %zu elements are too many for one MPI_Gatherv", what, off + counts[r]);
        rc[r] = (int)counts[r];
        rc[c->world + r] = (int)off;
        off += counts[r];
    }
    return rc;
}

static void mpi_destroy(mgt_comm *c) {
    mpi_state *s = c->impl;
    if (!s)
        return;
    if (s->threaded) {
        pthread_mutex_lock(&s->mu);
        s->stop = 1;
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
        pthread_cond_destroy(&s->cv);
        pthread_mutex_destroy(&s->mu);
    }
    for (int i = 0; i < s->nslots; i++) {
        free(s->slot[i].req);
        free(s->slot[i].parts);
    }
    free(s->slot);
    free(s);
    c->impl = NULL;
}

static const mgt_comm_ops mpi_ops = {
    .name = "mpi",
    .allreduce_sum_f32 = mpi_allreduce_f32,
    .reserve = mpi_reserve,
    .start = mpi_start,
    .test = mpi_test,
    .wait = mpi_wait,
    .destroy = mpi_destroy,
};

void mgt_comm_init_mpi(mgt_comm *c, MPI_Comm mpi, double timeout_s) {
    mgt_comm_init_common(c, mpi, timeout_s);
    c->ops = &mpi_ops;
    c->impl = calloc(1, sizeof(mpi_state));
    if (!c->impl)
        mgt_die("out of host memory");
    c->host_progress = 1;
}

void mgt_comm_init_common(mgt_comm *c, MPI_Comm mpi, double timeout_s) {
    memset(c, 0, sizeof *c);
    c->mpi = mpi;
    c->timeout = timeout_s;
    int init = 0;
    MPI_Initialized(&init);
    c->world = 1; /* a process started without a launcher runs without MPI: a world of one */
    if (init) {
        MPI_Comm_rank(mpi, &c->rank);
        MPI_Comm_size(mpi, &c->world);
    }
    if (timeout_s > 0 && c->world > 1) {
        c->dog = calloc(1, sizeof *c->dog);
        if (!c->dog)
            mgt_die("out of host memory");
        c->dog->timeout = timeout_s;
        c->dog->rank = c->rank;
        if (pthread_create(&c->dog->thread, NULL, watch, c->dog) != 0)
            mgt_die("cannot start the communication watchdog thread");
    }
}

void mgt_comm_destroy(mgt_comm *c) {
    if (c->dog) {
        atomic_store(&c->dog->stop, 1);
        pthread_join(c->dog->thread, NULL);
        free(c->dog);
        c->dog = NULL;
    }
    if (c->ops && c->ops->destroy)
        c->ops->destroy(c);
}

void mgt_allreduce_sum(mgt_comm *c, float *buf, size_t count, const char *what) {
    if ((c->world == 1 && !c->always) || count == 0)
        return;
    mgt_comm_enter(c, what);
    c->ops->allreduce_sum_f32(c, buf, count);
    mgt_comm_leave(c);
}

void mgt_bcast(mgt_comm *c, void *buf, size_t bytes, int root, const char *what) {
    if (c->world == 1 || bytes == 0)
        return;
    mgt_comm_enter(c, what);
    lock(mpi_state_of(c));
    for (size_t off = 0; off < bytes; off += INT_MAX) {
        size_t n = bytes - off < INT_MAX ? bytes - off : INT_MAX;
        mpi_check(MPI_Bcast((char *)buf + off, (int)n, MPI_BYTE, root, c->mpi), "MPI_Bcast", what);
    }
    unlock(mpi_state_of(c));
    mgt_comm_leave(c);
}

/* Both gathers: `count` items of MPI type t (size bytes each) from every rank to root. */
static void gatherv(mgt_comm *c, const void *send, size_t count, MPI_Datatype t, size_t size,
                    void *recv, const size_t *counts, int root, const char *what) {
    if (c->world == 1) {
        if (count && recv != send)
            memcpy(recv, send, count * size);
        return;
    }
    int *rc = gather_layout(c, counts, root, what);
    mgt_comm_enter(c, what);
    lock(mpi_state_of(c));
    mpi_check(MPI_Gatherv(send, (int)count, t, recv, rc, rc ? rc + c->world : NULL, t, root,
                          c->mpi),
              "MPI_Gatherv", what);
    unlock(mpi_state_of(c));
    mgt_comm_leave(c);
    free(rc);
}

void mgt_gatherv(mgt_comm *c, const float *send, size_t count, float *recv, const size_t *counts,
                 int root, const char *what) {
    gatherv(c, send, count, MPI_FLOAT, sizeof(float), recv, counts, root, what);
}

void mgt_scatterv(mgt_comm *c, const float *send, const size_t *counts, float *recv, size_t count,
                  int root, const char *what) {
    if (c->world == 1) {
        if (count && recv != send)
            memcpy(recv, send, count * sizeof(float));
        return;
    }
    int *rc = gather_layout(c, counts, root, what);
    mgt_comm_enter(c, what);
    lock(mpi_state_of(c));
    mpi_check(MPI_Scatterv(send, rc, rc ? rc + c->world : NULL, MPI_FLOAT, recv, (int)count,
                           MPI_FLOAT, root, c->mpi),
              "MPI_Scatterv", what);
    unlock(mpi_state_of(c));
    mgt_comm_leave(c);
    free(rc);
}

void mgt_gather_host(mgt_comm *c, const void *send, size_t bytes, void *recv, const size_t *counts,
                     int root, const char *what) {
    gatherv(c, send, bytes, MPI_BYTE, 1, recv, counts, root, what);
}

void mgt_allreduce_host_f64(mgt_comm *c, double *buf, size_t count, const char *what) {
    if (c->world == 1 || count == 0)
        return;
    mgt_comm_enter(c, what);
    lock(mpi_state_of(c));
    mpi_check(MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_DOUBLE, MPI_SUM, c->mpi),
              "MPI_Allreduce", what);
    unlock(mpi_state_of(c));
    mgt_comm_leave(c);
}

void mgt_comm_set_owners(mgt_comm *c, const size_t *owners) {
    c->owners = owners;
}

void mgt_comm_owned(const mgt_comm *c, int r, size_t lo, size_t count, size_t *a, size_t *b) {
    const size_t hi = lo + count;
    size_t x = c->owners[r] > lo ? c->owners[r] : lo;
    size_t y = c->owners[r + 1] < hi ? c->owners[r + 1] : hi;
    *a = x;
    *b = y > x ? y : x;
}

int mgt_comm_shares(const mgt_comm *c) {
    return c->ops && c->ops->share;
}

void *mgt_comm_share(mgt_comm *c, size_t bytes, mgt_err *err) {
    if (!mgt_comm_shares(c)) {
        mgt_errf(err, "this transport has no shared memory; please report this");
        return NULL;
    }
    return c->ops->share(c, bytes, err);
}

int mgt_comm_requests_on(const mgt_comm *c) {
    return (c->world > 1 || c->always) && c->ops->start;
}

int mgt_comm_reserve(mgt_comm *c, int n, mgt_err *err) {
    return mgt_comm_requests_on(c) ? c->ops->reserve(c, n, err) : 0;
}

void mgt_comm_start(mgt_comm *c, int slot, mgt_coll kind, float *buf, size_t lo, size_t count) {
    if (!mgt_comm_requests_on(c))
        return;
    if (kind != MGT_COLL_ALLREDUCE && !c->owners)
        mgt_die("an owners' collective without owner slices; please report this");
    c->ops->start(c, slot, kind, buf, lo, count);
}

int mgt_comm_test(mgt_comm *c, int slot) {
    return mgt_comm_requests_on(c) ? c->ops->test(c, slot) : 1;
}

void mgt_comm_wait(mgt_comm *c, int slot, const char *what) {
    if (!mgt_comm_requests_on(c))
        return;
    mgt_comm_enter(c, what);
    c->ops->wait(c, slot);
    mgt_comm_leave(c);
}
