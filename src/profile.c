/* profile.c: per-phase timing, its summary table and the Chrome-trace timeline. */
#include "profile.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime.h"
#include "tensor_io.h"

static const char *phase_names[MGT_PH_COUNT] = {"data", "forward", "backward", "allreduce",
                                                "update"};
/* A request's span is named by its kind (comm.h's mgt_coll); "allreduce" is also the phase's
 * name, so a timeline of a plain run keeps the five names. */
static const char *coll_names[] = {"allreduce", "reduce-scatter", "all-gather"};

int mgt_profile_init(mgt_profile *p, int on, int64_t max_steps, mgt_backend *be, mgt_err *err) {
    memset(p, 0, sizeof *p);
    p->on = on;
    p->be = be;
    if (!on)
        return 0;
    p->step_cap = max_steps < 1 ? 1 : max_steps;
    p->cap = p->step_cap * MGT_PH_COUNT;
    p->spans = malloc(sizeof *p->spans * (size_t)p->cap);
    p->inflight = calloc((size_t)p->step_cap, sizeof(double));
    for (int i = 0; i < MGT_PH_COUNT; i++)
        p->dur[i] = malloc(sizeof(double) * (size_t)p->step_cap);
    for (int i = 0; i < MGT_PH_COUNT; i++)
        if (!p->dur[i] || !p->spans || !p->inflight)
            return mgt_errf(err, "out of memory for the profile of %lld steps",
                            (long long)max_steps);
    p->device = be && be->ops->time_mark && be->ops->time_read;
    p->first_step = -1;
    for (int i = 0; i < MGT_TIME_SETS; i++)
        p->set_step[i] = -1;
    p->origin = mgt_now();
    return 0;
}

void mgt_profile_sync(mgt_profile *p, mgt_comm *c) {
    if (!p->on)
        return;
    double one = 1;
    mgt_allreduce_host_f64(c, &one, 1, "profile start");
    p->origin = mgt_now();
}

/* The CPU seconds this process has used so far, all its threads: beside a phase's wall time,
 * what it cost where other work shares the cores (a phase that waited for the cores has more
 * wall than CPU time, one whose lanes all ran has up to lanes times as much CPU). */
static double cpu_now(void) {
    struct timespec t;
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t) != 0)
        return 0;
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void add_span(mgt_profile *p, double start, double dur, int phase, int64_t step,
                     double cpu) {
    if (p->nspans < p->cap)
        p->spans[p->nspans++] =
            (mgt_span){start - p->origin, dur, phase, (int32_t)step, -2, 0, 0, cpu};
}

static void store_step(mgt_profile *p, const double *cur) {
    if (p->nsteps >= p->step_cap)
        return;
    for (int i = 0; i < MGT_PH_COUNT; i++)
        p->dur[i][p->nsteps] = cur[i];
    p->inflight[p->nsteps] = p->cur_inflight;
    p->cur_inflight = 0;
    p->nsteps++;
}

int mgt_profile_reserve_requests(mgt_profile *p, int per_step, mgt_err *err) {
    if (!p->on || per_step <= 0)
        return 0;
    const int64_t cap = p->step_cap * (MGT_PH_COUNT + per_step);
    mgt_span *s = realloc(p->spans, sizeof *s * (size_t)cap);
    if (!s)
        return mgt_errf(err, "out of memory for the profile of %lld steps", (long long)p->step_cap);
    p->spans = s;
    p->cap = cap;
    return 0;
}

void mgt_profile_request(mgt_profile *p, int bucket, int coll, size_t bytes, double t0, double t1) {
    if (!p->on || p->nspans >= p->cap)
        return;
    p->spans[p->nspans++] = (mgt_span){t0 - p->origin, t1 - t0, MGT_PH_ALLREDUCE, (int32_t)p->step,
                                       bucket,         coll,    (int64_t)bytes,   -1};
    p->requests = 1;
}

void mgt_profile_inflight(mgt_profile *p, double seconds) {
    if (p->on)
        p->cur_inflight = seconds;
}

/* Reads device timing set k (waiting for its last point) into a step's phases. */
static void collect(mgt_profile *p, int k) {
    if (p->set_step[k] < 0 || p->set_points[k] < 2) {
        p->set_step[k] = -1;
        return;
    }
    double sec[MGT_TIME_POINTS], cur[MGT_PH_COUNT] = {0};
    int n = p->set_points[k];
    p->be->ops->time_read(p->be, k, n, sec);
    for (int i = 1; i < n; i++) {
        double d = sec[i] - sec[i - 1];
        cur[p->set_phase[k][i]] += d;
        add_span(p, p->set_t0[k] + sec[i - 1], d, p->set_phase[k][i], p->set_step[k], -1);
    }
    store_step(p, cur);
    p->set_step[k] = -1;
}

void mgt_profile_data_host(mgt_profile *p, double seconds) {
    if (p->on)
        p->cur_data_host += seconds;
}

void mgt_profile_begin_step(mgt_profile *p, int64_t step) {
    if (!p->on)
        return;
    if (p->first_step >= 0 && step > p->first_step + 4) { /* past the warm-up, as marks do */
        p->data_host += p->cur_data_host;
        p->data_host_steps++;
    }
    p->cur_data_host = 0;
    mgt_profile_marks_step(p, step);
    p->step = step;
    if (p->first_step < 0)
        p->first_step = step;
    memset(p->cur, 0, sizeof p->cur);
    p->mark = mgt_now();
    if (!p->device)
        p->cpu_mark = cpu_now();
    if (p->device) {
        int k = (int)(step % MGT_TIME_SETS);
        p->set = k;
        if (p->set_step[k] == step && p->set_points[k] == 1)
            return;    /* point 0 was queued at the end of the previous step */
        collect(p, k); /* the step that used this set before, MGT_TIME_SETS steps ago */
        p->set_step[k] = step;
        p->set_points[k] = 1;
        p->set_t0[k] = p->mark;
        p->be->ops->time_mark(p->be, k, 0);
    }
}

void mgt_profile_phase(mgt_profile *p, int phase) {
    if (!p->on)
        return;
    if (p->device) {
        int k = p->set, i = p->set_points[k];
        if (i < MGT_TIME_POINTS) {
            p->be->ops->time_mark(p->be, k, i);
            p->set_phase[k][i] = phase;
            p->set_points[k] = i + 1;
        } else { /* a full set (many micro-batches): its last point moves here, so the last
                    span runs on to this phase's end and counts as this phase */
            p->be->ops->time_mark(p->be, k, i - 1);
            p->set_phase[k][i - 1] = phase;
        }
        return;
    }
    const double now = mgt_now(), cpu = cpu_now();
    p->cur[phase] += now - p->mark;
    add_span(p, p->mark, now - p->mark, phase, p->step, cpu - p->cpu_mark);
    p->mark = now;
    p->cpu_mark = cpu;
}

/* On the device, the next step's point 0 is queued right after this step's last one: the device
 * timeline is tiled without gaps, and whatever keeps the device idle between two steps (a host
 * that is late with the next batch or launch) counts as the next step's data wait. */
void mgt_profile_end_step(mgt_profile *p) {
    if (!p->on)
        return;
    if (!p->device) {
        store_step(p, p->cur);
        return;
    }
    int64_t next = p->step + 1;
    int k = (int)(next % MGT_TIME_SETS);
    collect(p, k);
    p->set_step[k] = next;
    p->set_points[k] = 1;
    p->set_t0[k] = mgt_now();
    p->be->ops->time_mark(p->be, k, 0);
}

void mgt_profile_gap(mgt_profile *p) {
    if (!p->on || !p->device)
        return;
    int k = (int)((p->step + 1) % MGT_TIME_SETS);
    if (p->set_step[k] == p->step + 1 && p->set_points[k] == 1)
        p->set_step[k] = -1; /* begin_step queues a fresh point 0 */
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Per rank: mean and p95 (ms) of each phase, the mean step, the steps counted, and the mean time
 * with a request in flight (-1: not measured). */
/* A rank's figures: mean and p95 of each phase, then these. */
enum { ST_STEP = 2 * MGT_PH_COUNT, ST_N, ST_INFLIGHT, ST_EXPOSED, NSTAT };

/* The first steps warm caches and allocators: up to 5 are left out when there are enough. */
static int64_t skipped(int64_t n) {
    return n > 20 ? 5 : 0;
}

static void stats(mgt_profile *p, double *out) {
    double total = 0;
    int64_t n = p->nsteps, skip = skipped(n);
    for (int i = 0; i < MGT_PH_COUNT; i++) {
        double *d = p->dur[i] + skip, sum = 0;
        int64_t m = n - skip;
        for (int64_t j = 0; j < m; j++)
            sum += d[j];
        qsort(d, (size_t)m, sizeof(double), cmp_double);
        out[2 * i] = m ? 1e3 * sum / (double)m : 0;
        out[2 * i + 1] = m ? 1e3 * d[(int64_t)(0.95 * (double)(m - 1))] : 0;
        total += out[2 * i];
    }
    out[ST_STEP] = total;
    out[ST_N] = (double)(n - skip);
    double fl = 0;
    for (int64_t j = skip; j < n; j++)
        fl += p->inflight[j];
    out[ST_INFLIGHT] = p->requests && n > skip ? 1e3 * fl / (double)(n - skip) : -1;
    out[ST_EXPOSED] = -1;
}

/* Collective (host timing): the mean over the steps of the part of this rank's wait after every
 * rank had handed over its last gradients, in ms. The hand-over of a step is the latest start of
 * a gradient request (not the weights' all-gather, which follows the update) on any rank; the
 * ranks' clocks share one origin (mgt_profile_sync). -1 when there is nothing to split. */
static double exposed_after_handover(mgt_profile *p, mgt_comm *c) {
    const int64_t skip = skipped(p->nsteps), m = p->nsteps - skip;
    if (p->device || m <= 0 || c->world < 2)
        return -1;
    const int root = c->rank == 0;
    double *h = malloc(sizeof(double) * (size_t)m);
    double *all = root ? malloc(sizeof(double) * (size_t)m * (size_t)c->world) : NULL;
    size_t *counts = root ? malloc(sizeof(size_t) * (size_t)c->world) : NULL;
    if (!h || (root && (!all || !counts)))
        mgt_die("out of host memory for the profile's hand-over times of %lld steps", (long long)m);
    for (int64_t j = 0; j < m; j++)
        h[j] = -HUGE_VAL;
    for (int64_t i = 0; i < p->nspans; i++) {
        const mgt_span *s = &p->spans[i];
        const int64_t j = s->step - p->first_step - skip;
        if (s->bucket != -2 && s->coll != MGT_COLL_GATHER_OWNERS && j >= 0 && j < m &&
            s->start > h[j])
            h[j] = s->start;
    }
    for (int r = 0; root && r < c->world; r++)
        counts[r] = sizeof(double) * (size_t)m;
    mgt_gather_host(c, h, sizeof(double) * (size_t)m, all, counts, 0, "profile gather");
    for (int r = 1; root && r < c->world; r++)
        for (int64_t j = 0; j < m; j++)
            h[j] = all[(size_t)r * (size_t)m + (size_t)j] > h[j]
                       ? all[(size_t)r * (size_t)m + (size_t)j]
                       : h[j];
    mgt_bcast(c, h, sizeof(double) * (size_t)m, 0, "profile hand-over times");
    double exposed = 0;
    for (int64_t i = 0; i < p->nspans; i++) {
        const mgt_span *s = &p->spans[i];
        const int64_t j = s->step - p->first_step - skip;
        if (s->bucket == -2 && s->phase == MGT_PH_ALLREDUCE && j >= 0 && j < m) {
            const double a = s->start > h[j] ? s->start : h[j], b = s->start + s->dur;
            exposed += b > a ? b - a : 0;
        }
    }
    free(h);
    free(all);
    free(counts);
    return 1e3 * exposed / (double)m;
}

static int write_trace(const char *path, const mgt_span *spans, const int64_t *counts, int world,
                       mgt_err *err) {
    int64_t total = 0;
    for (int r = 0; r < world; r++)
        total += counts[r];
    size_t cap = 4096 + (size_t)total * 192 + (size_t)world * 384, len = 0;
    char *s = malloc(cap);
    if (!s)
        return mgt_errf(err, "out of memory writing the timeline");
    len +=
        (size_t)snprintf(s + len, cap - len,
                         MGT_TIMELINE_HEAD ", \"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
    for (int r = 0; r < world; r++)
        len += (size_t)snprintf(s + len, cap - len,
                                "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, "
                                "\"tid\": 0, \"args\": {\"name\": \"rank %d\"}},\n"
                                "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, "
                                "\"tid\": 0, \"args\": {\"name\": \"step phases\"}},\n"
                                "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, "
                                "\"tid\": 1, \"args\": {\"name\": \"requests in flight\"}},\n",
                                r, r, r, r);
    const mgt_span *sp = spans;
    for (int r = 0; r < world; r++)
        for (int64_t i = 0; i < counts[r]; i++, sp++) {
            if (sp->bucket == -2) {
                char cpu[48] = "";
                if (sp->cpu >= 0)
                    snprintf(cpu, sizeof cpu, ", \"cpu_ms\": %.3f", sp->cpu * 1e3);
                len += (size_t)snprintf(s + len, cap - len,
                                        "{\"name\": \"%s\", \"cat\": \"step\", \"ph\": \"X\", "
                                        "\"pid\": %d, \"tid\": 0, \"ts\": %.3f, \"dur\": %.3f, "
                                        "\"args\": {\"step\": %d%s}},\n",
                                        phase_names[sp->phase], r, sp->start * 1e6, sp->dur * 1e6,
                                        sp->step, cpu);
                continue;
            }
            const int coll = sp->coll >= 0 && sp->coll < 3 ? sp->coll : 0;
            len += (size_t)snprintf(s + len, cap - len,
                                    "{\"name\": \"%s\", \"cat\": \"request\", \"ph\": \"X\", "
                                    "\"pid\": %d, \"tid\": 1, \"ts\": %.3f, \"dur\": %.3f, "
                                    "\"args\": {\"step\": %d, \"bucket\": %d, \"bytes\": %lld}},\n",
                                    coll_names[coll], r, sp->start * 1e6, sp->dur * 1e6, sp->step,
                                    sp->bucket, (long long)sp->bytes);
        }
    if (len >= 2 && s[len - 2] == ',')
        len -= 2;
    len += (size_t)snprintf(s + len, cap - len, "\n]}\n");
    int rc = mgt_atomic_write(path, s, len, err);
    free(s);
    return rc;
}

/* The TensorBoard scalars of the report: each phase's mean (and the step's) averaged over the
 * ranks' rows of `all`, at the step count reached. */
static int tb_means(mgt_profile *p, const double *all, int world, mgt_err *err) {
    char names[MGT_PH_COUNT + 1][32];
    const char *tags[MGT_PH_COUNT + 1];
    double values[MGT_PH_COUNT + 1];
    for (int i = 0; i <= MGT_PH_COUNT; i++) {
        snprintf(names[i], sizeof names[i], "profile/%s_ms",
                 i < MGT_PH_COUNT ? phase_names[i] : "step");
        tags[i] = names[i];
        values[i] = 0;
        for (int r = 0; r < world; r++)
            values[i] += all[(size_t)r * NSTAT + 2 * (size_t)i] / world;
    }
    return mgt_tb_scalars(p->tb, p->step + 1, MGT_PH_COUNT + 1, tags, values, err);
}

/* The backend's choices that change its numbers or speed (the GPU's convolution algorithms, with
 * their determinism), after the table: rank 0's, as every rank runs the same shapes. */
static void print_choices(mgt_backend *be) {
    if (!be || !be->ops->describe)
        return;
    const size_t n = be->ops->describe(be, NULL, 0);
    char *text = n ? malloc(n + 1) : NULL;
    if (!text)
        return; /* nothing to say, or no memory for it: the table above stands alone */
    be->ops->describe(be, text, n + 1);
    fputs(text, stdout);
    free(text);
}

int mgt_profile_report(mgt_profile *p, mgt_comm *c, const char *timeline_path, mgt_err *err) {
    if (!p->on)
        return 0;
    if (p->device) /* the sets still pending, oldest first (the next step's lone point 0 is dropped)
                    */
        for (int64_t s = p->step - MGT_TIME_SETS + 2; s <= p->step + 1; s++)
            if (s >= 0)
                collect(p, (int)(s % MGT_TIME_SETS));
    int world = c->world, root = c->rank == 0;
    double mine[NSTAT], *all = root ? malloc(sizeof(double) * NSTAT * (size_t)world) : NULL;
    size_t *counts = root ? malloc(sizeof(size_t) * (size_t)world) : NULL;
    stats(p, mine);
    mine[ST_EXPOSED] = exposed_after_handover(p, c);
    for (int r = 0; root && r < world; r++)
        counts[r] = sizeof mine;
    mgt_gather_host(c, mine, sizeof mine, all, counts, 0, "profile gather");
    if (root) {
        printf("Profile (ms per step over %.0f steps; mean / p95):\n", mine[ST_N]);
        printf("%-6s", "rank");
        for (int i = 0; i < MGT_PH_COUNT; i++)
            printf(" %17s", phase_names[i]);
        printf(" %9s %10s\n", "step", "allreduce");
        for (int r = 0; r < world; r++) {
            double *s = all + (size_t)r * NSTAT;
            printf("%-6d", r);
            for (int i = 0; i < MGT_PH_COUNT; i++)
                printf(" %8.3f /%7.3f", s[2 * i], s[2 * i + 1]);
            double step = s[ST_STEP];
            printf(" %9.3f %9.1f%%\n", step,
                   step > 0 ? 100.0 * s[2 * MGT_PH_ALLREDUCE] / step : 0.0);
        }
        /* The table's allreduce is what the step waited for; the requests ran longer, mostly
         * behind backward. */
        if (all[ST_INFLIGHT] >= 0) {
            printf("allreduce = waiting after backward; in flight (hidden + waited for):");
            for (int r = 0; r < world; r++) {
                const double *s = all + (size_t)r * NSTAT, fl = s[ST_INFLIGHT];
                printf(" rank %d %.3f ms (%.0f%% hidden)%s", r, fl,
                       fl > 0 ? 100.0 * (1.0 - s[2 * MGT_PH_ALLREDUCE] / fl) : 0.0,
                       r + 1 < world ? "," : "\n");
            }
        }
        if (all[ST_EXPOSED] >= 0) {
            printf("allreduce = waiting for a slower rank's backward + exposed communication "
                   "(after every rank handed over its gradients):");
            for (int r = 0; r < world; r++) {
                const double *s = all + (size_t)r * NSTAT, w = s[2 * MGT_PH_ALLREDUCE];
                const double x = s[ST_EXPOSED] < w ? s[ST_EXPOSED] : w;
                printf(" rank %d %.3f + %.3f ms (%.1f%% of the step exposed)%s", r, w - x, x,
                       s[ST_STEP] > 0 ? 100.0 * x / s[ST_STEP] : 0.0, r + 1 < world ? "," : "\n");
            }
        }
        if (p->device && p->data_host_steps > 0) /* (with host timing it is the data phase) */
            printf("data phase on the host (rank 0, ms per step over %lld steps): %.3f waiting for "
                   "the loader and issuing the batch\n",
                   (long long)p->data_host_steps, 1e3 * p->data_host / (double)p->data_host_steps);
        mgt_profile_marks_report(p);
        print_choices(p->be);
        fflush(stdout);
    }
    int rc = root && p->tb && p->nsteps > 0 ? tb_means(p, all, world, err) : 0;
    if (rc == 0 && timeline_path) {
        /* Span counts first, then the spans themselves, gathered as bytes. */
        int64_t n = p->nspans, *ns = root ? malloc(sizeof(int64_t) * (size_t)world) : NULL;
        for (int r = 0; root && r < world; r++)
            counts[r] = sizeof(int64_t);
        mgt_gather_host(c, &n, sizeof n, ns, counts, 0, "timeline gather");
        mgt_span *spans = NULL;
        if (root) {
            int64_t total = 0;
            for (int r = 0; r < world; r++) {
                counts[r] = (size_t)ns[r] * sizeof(mgt_span);
                total += ns[r];
            }
            spans = malloc(sizeof(mgt_span) * (size_t)(total ? total : 1));
        }
        mgt_gather_host(c, p->spans, (size_t)n * sizeof(mgt_span), spans, counts, 0,
                        "timeline gather");
        if (root)
            rc = write_trace(timeline_path, spans, ns, world, err);
        free(spans);
        free(ns);
    }
    free(all);
    free(counts);
    return rc;
}

void mgt_profile_free(mgt_profile *p) {
    mgt_profile_marks_free(p);
    free(p->spans);
    free(p->inflight);
    for (int i = 0; i < MGT_PH_COUNT; i++)
        free(p->dur[i]);
    memset(p, 0, sizeof *p);
}
