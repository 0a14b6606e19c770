/* rundir.c: the run folder's lock, its protection, its temporaries, the model copy and run.json
 * (see rundir.h). */
#define _GNU_SOURCE
#include "rundir.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "runtime.h"
#include "tensor_io.h"

/* run.json is small; anything larger is not ours. */
enum { INFO_MAX = 1 << 20 };

void mgt_rundir_init(mgt_rundir *d, const char *dir) {
    memset(d, 0, sizeof *d);
    d->lock_fd = -1;
    snprintf(d->dir, sizeof d->dir, "%s", dir);
}

static double wall_now(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + tv.tv_usec * 1e-6;
}

/* "2026-11-23T13:55:00Z" */
static void iso_time(char *buf, size_t n, double t) {
    time_t s = (time_t)t;
    struct tm tm;
    if (!gmtime_r(&s, &tm) || !strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm))
        snprintf(buf, n, "%.0f", t);
}

/* The process exists (possibly as another user's: EPERM). */
static int alive(long pid) {
    return pid > 0 && (kill((pid_t)pid, 0) == 0 || errno == EPERM);
}

/* ---- the lock ---------------------------------------------------------------------------- */

/* The owner, as the lock file's first line says: "HOST PID SINCE JOB", JOB the Slurm job id
 * (SLURM_JOB_ID) or "-". */
typedef struct owner {
    char host[128];
    long pid;
    double since;
    char job[64];
} owner;

static int read_owner(int fd, owner *o) {
    char buf[512];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    memset(o, 0, sizeof *o);
    int got = sscanf(buf, "%127s %ld %lf %63s", o->host, &o->pid, &o->since, o->job);
    if (got == 3)
        snprintf(o->job, sizeof o->job, "-");
    return got >= 3 && o->pid > 0 ? 0 : -1;
}

static void describe_owner(char *buf, size_t n, const owner *o) {
    char t[32];
    iso_time(t, sizeof t, o->since);
    snprintf(buf, n, "pid %ld on %s, since %s%s%s", o->pid, o->host, t,
             strcmp(o->job, "-") ? ", Slurm job " : "", strcmp(o->job, "-") ? o->job : "");
}

/* This process's Slurm job ("-": none). A requeued job runs again under the same id, never
 * twice at once: a lock of its own id is the earlier run's, which Slurm ended. */
static void slurm_job(char *buf, size_t n) {
    const char *id = getenv("SLURM_JOB_ID");
    snprintf(buf, n, "%s", id && *id && !strpbrk(id, " \t\n") ? id : "-");
}

static int write_owner(mgt_rundir *d, int fd, const char *host, const char *path, mgt_err *err) {
    char text[512];
    d->lock_time = wall_now();
    owner me = {.pid = (long)getpid(), .since = d->lock_time};
    snprintf(me.host, sizeof me.host, "%s", host);
    slurm_job(me.job, sizeof me.job);
    char who[256];
    describe_owner(who, sizeof who, &me);
    int n = snprintf(text, sizeof text,
                     "%s %ld %.3f %s\nmgtrain is writing this run folder: %s; the lock goes when "
                     "it ends\n",
                     host, me.pid, me.since, me.job, who);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t)n, 0) != n || fsync(fd) != 0) {
        int e = errno;
        close(fd);
        return mgt_errf(err, "cannot write the lock file %s: %s; pass --out with a writable folder",
                        path, strerror(e));
    }
    d->lock_fd = fd;
    mgt_runtime_hold_lock(path); /* an ending that skips mgt_rundir_unlock still removes it */
    return 0;
}

/* flock, waiting up to a second for a process that looks at a lock it just found. Returns 0,
 * or -1 with errno (EWOULDBLOCK: held; anything else: the file system has no flock). */
static int flock_briefly(int fd, int wait) {
    for (int i = 0;; i++) {
        if (flock(fd, LOCK_EX | LOCK_NB) == 0)
            return 0;
        if (errno != EWOULDBLOCK || !wait || i == 100)
            return -1;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* The file at path is still the one open as fd (not removed and made anew meanwhile). */
static int same_file(int fd, const char *path) {
    struct stat a, b;
    return fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev &&
           a.st_ino == b.st_ino;
}

int mgt_rundir_lock(mgt_rundir *d, const char *host, char *notice, size_t notice_size,
                    mgt_err *err) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", d->dir, MGT_RUN_LOCK);
    notice[0] = 0;
    for (int attempt = 0; attempt < 100; attempt++) {
        int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd >= 0) {
            /* Ours: no other process holds it, unless one that found it an instant ago looks. */
            if (flock_briefly(fd, 1) != 0 && errno == EWOULDBLOCK) {
                close(fd);
                return mgt_errf(err, "cannot lock %s: another process holds it", path);
            }
            return write_owner(d, fd, host, path, err);
        }
        if (errno != EEXIST)
            return mgt_errf(err,
                            "cannot create the lock file %s: %s; pass --out with a writable "
                            "folder",
                            path, strerror(errno));
        fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd < 0) {
            if (errno == ENOENT)
                continue; /* released meanwhile */
            return mgt_errf(err, "cannot open the lock file %s: %s", path, strerror(errno));
        }
        const int locked = flock_briefly(fd, 0) == 0;
        const int no_flock = !locked && errno != EWOULDBLOCK;
        if (locked && !same_file(fd, path)) {
            close(fd); /* released and removed meanwhile: look again */
            continue;
        }
        owner o;
        char who[256] = "an unknown process";
        const int known = read_owner(fd, &o) == 0;
        if (known)
            describe_owner(who, sizeof who, &o);
        /* No owner line, yet nobody holds the lock: its creator writes the line the moment it
         * has made the file and locked it, so either it is in that instant (a fresh file: look
         * again shortly, without holding the lock it is about to take) or it was killed there
         * (an older file: take it over). */
        if (!known && locked) {
            struct stat sb;
            if (fstat(fd, &sb) == 0 &&
                wall_now() - ((double)sb.st_mtim.tv_sec + sb.st_mtim.tv_nsec * 1e-9) < 2.0) {
                close(fd);
                struct timespec ts = {0, 50 * 1000 * 1000};
                nanosleep(&ts, NULL);
                continue;
            }
            snprintf(notice, notice_size,
                     "notice: %s: took over a lock file with no owner in it (a process was "
                     "stopped while taking it)",
                     d->dir);
            return write_owner(d, fd, host, path, err);
        }
        /* Held by a live process: its flock, or (where the file system has no flock) its pid. */
        if ((!locked && !no_flock) ||
            (no_flock && known && !strcmp(o.host, host) && alive(o.pid))) {
            close(fd);
            return mgt_errf(err,
                            "%s is in use by another mgtrain job (%s); wait for it to end, or "
                            "train into another --out",
                            d->dir, who);
        }
        char job[64];
        slurm_job(job, sizeof job);
        const int same_job = known && strcmp(job, "-") && !strcmp(job, o.job);
        if (!known || (strcmp(o.host, host) && !same_job)) {
            close(fd);
            return mgt_errf(err,
                            "%s is locked by %s (%s), which cannot be checked from %s; if no job "
                            "runs there any more, delete %s and start again",
                            d->dir, who, path, host, path);
        }
        snprintf(notice, notice_size,
                 "notice: %s: took over the lock of %s, which is no longer running (it ended "
                 "without releasing it%s)",
                 d->dir, who, same_job ? "; this is the same Slurm job, started again" : "");
        return write_owner(d, fd, host, path, err);
    }
    return mgt_errf(err, "cannot take the lock %s: it keeps changing hands", path);
}

void mgt_rundir_unlock(mgt_rundir *d) {
    if (d->lock_fd < 0)
        return;
    char path[600];
    snprintf(path, sizeof path, "%s/%s", d->dir, MGT_RUN_LOCK);
    mgt_runtime_hold_lock(NULL);
    unlink(path); /* while still holding it: whoever opens it next finds it gone */
    close(d->lock_fd);
    d->lock_fd = -1;
}

/* ---- what the folder holds ---------------------------------------------------------------- */

/* A checkpoint kept by --keep-checkpoints: checkpoint-<digits>.safetensors. */
static int is_numbered_checkpoint(const char *name) {
    const char *p = name + strlen("checkpoint-");
    if (strncmp(name, "checkpoint-", strlen("checkpoint-")) || !isdigit((unsigned char)*p))
        return 0;
    while (isdigit((unsigned char)*p))
        p++;
    return !strcmp(p, ".safetensors");
}

static const char *const run_files[] = {"weights.safetensors", "checkpoint.safetensors",
                                        "best.safetensors"};
enum { NRUN_FILES = sizeof run_files / sizeof run_files[0] };
/* The run's other files, which --overwrite removes with them. */
static const char *const run_logs[] = {"metrics.jsonl", "metrics.csv", "curves.png"};
enum { NRUN_LOGS = sizeof run_logs / sizeof run_logs[0] };

/* run.json of dir, parsed (NULL if missing or unreadable). */
static cJSON *read_info(const char *dir) {
    char path[600], *text = NULL;
    snprintf(path, sizeof path, "%s/%s", dir, MGT_RUN_INFO);
    mgt_err e;
    if (mgt_read_text_file(path, "run information", INFO_MAX, &text, NULL, &e) < 0)
        return NULL;
    cJSON *j = cJSON_Parse(text);
    free(text);
    return j;
}

static const char *json_str(const cJSON *j, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

int mgt_rundir_holds_run(const char *dir, mgt_err *err) {
    char files[256] = "", path[600];
    size_t n = 0;
    for (int i = 0; i < NRUN_FILES; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, run_files[i]);
        if (access(path, F_OK) == 0 && n < sizeof files)
            n += (size_t)snprintf(files + n, sizeof files - n, "%s%s", n ? ", " : "", run_files[i]);
    }
    DIR *dh = opendir(dir);
    int kept = 0;
    for (struct dirent *e; dh && (e = readdir(dh));)
        kept += is_numbered_checkpoint(e->d_name);
    if (dh)
        closedir(dh);
    if (kept && n < sizeof files)
        n += (size_t)snprintf(files + n, sizeof files - n, "%s%d older checkpoint%s", n ? ", " : "",
                              kept, kept > 1 ? "s" : "");
    if (!n)
        return 0;
    /* What the run was, from its run.json when there is one. */
    char what[700] = "";
    cJSON *info = read_info(dir);
    const char *model = json_str(info, "model"), *file = json_str(info, "model_file");
    if (model)
        snprintf(what, sizeof what, "model %s from %s; ", model, file ? file : "?");
    cJSON_Delete(info);
    char freedir[600] = "";
    for (int k = 2; k < 1000; k++) {
        snprintf(freedir, sizeof freedir, "%s-%d", dir, k);
        if (access(freedir, F_OK) != 0)
            break;
    }
    mgt_errf(err,
             "%s holds another run (%s%s); pass --resume to continue it, --overwrite to replace "
             "it, or another --out (%s is free)",
             dir, what, files, freedir);
    return 1;
}

int mgt_rundir_is_run(const char *dir) {
    static const char *const markers[] = {MGT_RUN_INFO, MGT_RUN_LOCK, "weights.safetensors",
                                          "checkpoint.safetensors"};
    char path[900];
    for (size_t i = 0; i < sizeof markers / sizeof markers[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, markers[i]);
        if (access(path, F_OK) == 0)
            return 1;
    }
    return 0;
}

int mgt_rundir_keeps(const char *dir, const char *name, const char *model_copy) {
    for (int i = 0; i < NRUN_FILES; i++)
        if (!strcmp(name, run_files[i]))
            return 1;
    for (int i = 0; i < NRUN_LOGS; i++)
        if (!strcmp(name, run_logs[i]))
            return 1;
    if (!strcmp(name, MGT_RUN_INFO) || !strcmp(name, MGT_RUN_LOCK) || is_numbered_checkpoint(name))
        return 1;
    if (model_copy)
        return !strcmp(name, model_copy);
    cJSON *info = read_info(dir);
    const char *copy = json_str(info, "model_copy");
    const int kept = copy && !strcmp(name, copy);
    cJSON_Delete(info);
    return kept;
}

int mgt_rundir_clear(mgt_rundir *d, mgt_err *err) {
    char path[900];
    /* The old run's model copy, as its run.json names it (a plain name ending in .cfg). */
    cJSON *info = read_info(d->dir);
    const char *copy = json_str(info, "model_copy");
    size_t cl = copy ? strlen(copy) : 0;
    if (copy && !strchr(copy, '/') && cl > 4 && !strcmp(copy + cl - 4, ".cfg")) {
        snprintf(path, sizeof path, "%s/%s", d->dir, copy);
        unlink(path);
    }
    cJSON_Delete(info);
    const char *const *lists[2] = {run_files, run_logs};
    const int counts[2] = {NRUN_FILES, NRUN_LOGS};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < counts[k]; i++) {
            snprintf(path, sizeof path, "%s/%s", d->dir, lists[k][i]);
            if (unlink(path) != 0 && errno != ENOENT)
                return mgt_errf(err, "--overwrite: cannot remove %s: %s", path, strerror(errno));
        }
    DIR *dh = opendir(d->dir);
    if (!dh)
        return mgt_errf(err, "cannot list %s: %s", d->dir, strerror(errno));
    int rc = 0;
    for (struct dirent *e; (e = readdir(dh));) {
        if (!is_numbered_checkpoint(e->d_name))
            continue;
        snprintf(path, sizeof path, "%s/%s", d->dir, e->d_name);
        if (unlink(path) != 0 && errno != ENOENT)
            rc = mgt_errf(err, "--overwrite: cannot remove %s: %s", path, strerror(errno));
    }
    closedir(dh);
    snprintf(path, sizeof path, "%s/%s", d->dir, MGT_RUN_INFO);
    if (!rc && unlink(path) != 0 && errno != ENOENT)
        rc = mgt_errf(err, "--overwrite: cannot remove %s: %s", path, strerror(errno));
    return rc;
}

int mgt_rundir_clean_temporaries(mgt_rundir *d, char *notice, size_t notice_size, mgt_err *err) {
    notice[0] = 0;
    DIR *dh = opendir(d->dir);
    if (!dh)
        return mgt_errf(err, "cannot list %s: %s", d->dir, strerror(errno));
    size_t n = 0;
    int removed = 0;
    for (struct dirent *e; (e = readdir(dh));) {
        const char *t = strstr(e->d_name, ".tmp.");
        if (!t || t == e->d_name)
            continue;
        char *end;
        errno = 0;
        long pid = strtol(t + 5, &end, 10);
        if (errno || *end || end == t + 5 || pid == (long)getpid())
            continue;
        char path[900];
        snprintf(path, sizeof path, "%s/%s", d->dir, e->d_name);
        struct stat sb;
        if (lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
            continue;
        /* Whoever wrote it is gone, or it was there before this job took the folder. */
        if (alive(pid) && (double)sb.st_mtime > d->lock_time)
            continue;
        if (unlink(path) != 0 && errno != ENOENT) {
            closedir(dh);
            return mgt_errf(err, "cannot remove the stale temporary file %s: %s", path,
                            strerror(errno));
        }
        if (removed++ == 0)
            n = (size_t)snprintf(notice, notice_size,
                                 "notice: %s: removed what a killed writer left behind:", d->dir);
        if (n < notice_size)
            n += (size_t)snprintf(notice + n, notice_size - n, " %s", e->d_name);
    }
    closedir(dh);
    return 0;
}

int mgt_rundir_copy_model(mgt_rundir *d, const char *name, const char *text, size_t len,
                          mgt_err *err) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s.cfg", d->dir, name);
    return mgt_atomic_write(path, text, len, err);
}

/* ---- run.json ------------------------------------------------------------------------------ */

static int write_info(mgt_rundir *d, mgt_err *err) {
    char *text = cJSON_Print(d->info);
    if (!text)
        return mgt_errf(err, "out of memory writing %s/%s", d->dir, MGT_RUN_INFO);
    char path[600];
    snprintf(path, sizeof path, "%s/%s", d->dir, MGT_RUN_INFO);
    size_t n = strlen(text);
    text[n] = '\n'; /* cJSON_Print's buffer ends in the NUL, replaced by a newline */
    int rc = mgt_atomic_write(path, text, n + 1, err);
    cJSON_free(text);
    return rc;
}

/* A whole number, written as its digits: cJSON keeps numbers as doubles, which round above 2^53
 * (a 64-bit seed would be recorded as another). */
static cJSON *whole_number(int64_t x) {
    char text[32];
    snprintf(text, sizeof text, "%" PRId64, x);
    return cJSON_CreateRaw(text);
}
static cJSON *seed_number(uint64_t x) {
    char text[32];
    snprintf(text, sizeof text, "%" PRIu64, x);
    return cJSON_CreateRaw(text);
}

/* The segments an earlier run.json listed, for a resumed run. One still "running" was not ended
 * by its process: it died (killed, or a failure that ended the job at once). */
static cJSON *earlier_segments(const char *dir) {
    cJSON *old = read_info(dir);
    cJSON *segs = cJSON_DetachItemFromObjectCaseSensitive(old, "segments");
    cJSON_Delete(old);
    if (!cJSON_IsArray(segs)) {
        cJSON_Delete(segs);
        return cJSON_CreateArray();
    }
    cJSON *s;
    cJSON_ArrayForEach(s, segs) {
        const char *how = json_str(s, "end");
        if (how && !strcmp(how, "running"))
            cJSON_ReplaceItemInObjectCaseSensitive(
                s, "end", cJSON_CreateString("died (no end was recorded)"));
    }
    return segs;
}

int mgt_rundir_begin(mgt_rundir *d, const mgt_run_info *ri, int resumed, int64_t start_step,
                     mgt_err *err) {
    cJSON_Delete(d->info);
    cJSON *j = d->info = cJSON_CreateObject();
    cJSON *segs = resumed ? earlier_segments(d->dir) : cJSON_CreateArray();
    cJSON *seg = cJSON_CreateObject();
    char now[32];
    iso_time(now, sizeof now, wall_now());
    int ok = j && segs && seg && cJSON_AddStringToObject(j, "model", ri->model) &&
             cJSON_AddStringToObject(j, "model_file", ri->model_file) &&
             cJSON_AddStringToObject(j, "model_copy", ri->model_copy) &&
             cJSON_AddNumberToObject(j, "world", ri->world) &&
             cJSON_AddNumberToObject(j, "nodes", ri->nodes) &&
             cJSON_AddItemToObject(j, "global_batch", whole_number(ri->global_batch)) &&
             cJSON_AddStringToObject(j, "optimizer", ri->optimizer) &&
             cJSON_AddNumberToObject(j, "learning_rate", ri->lr) &&
             cJSON_AddNumberToObject(j, "epochs", ri->epochs) &&
             cJSON_AddItemToObject(j, "seed", seed_number(ri->seed)) &&
             cJSON_AddStringToObject(j, "backend", ri->backend) &&
             cJSON_AddStringToObject(j, "data", ri->data) &&
             cJSON_AddStringToObject(j, "version", ri->version) &&
             cJSON_AddItemToObject(j, "flags",
                                   ri->nflags > 0 ? cJSON_CreateStringArray(
                                                        (const char *const *)ri->flags, ri->nflags)
                                                  : cJSON_CreateArray()) &&
             cJSON_AddItemToObject(seg, "start_step", whole_number(start_step)) &&
             cJSON_AddNullToObject(seg, "end_step") &&
             cJSON_AddNumberToObject(seg, "world", ri->world) &&
             cJSON_AddNumberToObject(seg, "nodes", ri->nodes) &&
             cJSON_AddStringToObject(seg, "started", now) && cJSON_AddNullToObject(seg, "ended") &&
             cJSON_AddStringToObject(seg, "end", "running") && cJSON_AddItemToArray(segs, seg);
    if (!ok) {
        cJSON_Delete(seg);
        cJSON_Delete(segs);
        return mgt_errf(err, "out of memory for %s/%s", d->dir, MGT_RUN_INFO);
    }
    seg = NULL;
    if (!cJSON_AddItemToObject(j, "segments", segs)) {
        cJSON_Delete(segs);
        return mgt_errf(err, "out of memory for %s/%s", d->dir, MGT_RUN_INFO);
    }
    return write_info(d, err);
}

int mgt_rundir_end(mgt_rundir *d, int64_t end_step, const char *how, mgt_err *err) {
    cJSON *segs = cJSON_GetObjectItemCaseSensitive(d->info, "segments");
    cJSON *seg = cJSON_GetArrayItem(segs, cJSON_GetArraySize(segs) - 1);
    if (!seg)
        return 0; /* not begun */
    char now[32];
    iso_time(now, sizeof now, wall_now());
    cJSON *a = whole_number(end_step), *b = cJSON_CreateString(now), *c = cJSON_CreateString(how);
    if (!a || !b || !c) {
        cJSON_Delete(a);
        cJSON_Delete(b);
        cJSON_Delete(c);
        return mgt_errf(err, "out of memory for %s/%s", d->dir, MGT_RUN_INFO);
    }
    cJSON_ReplaceItemInObjectCaseSensitive(seg, "end_step", a);
    cJSON_ReplaceItemInObjectCaseSensitive(seg, "ended", b);
    cJSON_ReplaceItemInObjectCaseSensitive(seg, "end", c);
    return write_info(d, err);
}

void mgt_rundir_free(mgt_rundir *d) {
    mgt_rundir_unlock(d);
    cJSON_Delete(d->info);
    d->info = NULL;
}

int mgt_rundir_find(const char *dir, char *model, char *weights, size_t n, mgt_err *err) {
    cJSON *info = read_info(dir);
    const char *copy = json_str(info, "model_copy");
    int rc = 0;
    if (!info)
        rc = mgt_errf(err,
                      "--run %s: no readable %s there; pass the --out folder of a training run, "
                      "or --model and --weights",
                      dir, MGT_RUN_INFO);
    else if (!copy || strchr(copy, '/'))
        rc = mgt_errf(err,
                      "--run %s: its %s names no copy of the model file (an older mgtrain trained "
                      "it); pass --model with the model file, and --weights",
                      dir, MGT_RUN_INFO);
    else {
        snprintf(model, n, "%s/%s", dir, copy);
        snprintf(weights, n, "%s/weights.safetensors", dir);
    }
    cJSON_Delete(info);
    return rc;
}

int mgt_rundir_read_record(const char *dir, mgt_run_record *r, mgt_err *err) {
    memset(r, 0, sizeof *r);
    r->nflags = -1;
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, MGT_RUN_INFO);
    if (access(path, F_OK) != 0)
        return 0;
    cJSON *info = read_info(dir);
    if (!info)
        return mgt_errf(err,
                        "%s is not readable JSON; the run's settings cannot be known: move it "
                        "away to resume with the flags given now alone",
                        path);
    const char *data = json_str(info, "data"), *copy = json_str(info, "model_copy");
    snprintf(r->data, sizeof r->data, "%s", data ? data : "");
    snprintf(r->model_copy, sizeof r->model_copy, "%s", copy && !strchr(copy, '/') ? copy : "");
    const cJSON *segs = cJSON_GetObjectItemCaseSensitive(info, "segments");
    const cJSON *last = cJSON_GetArrayItem(segs, cJSON_GetArraySize(segs) - 1);
    const cJSON *world = cJSON_GetObjectItemCaseSensitive(last, "world");
    r->world = cJSON_IsNumber(world) ? (int)world->valuedouble : 0;
    const cJSON *flags = cJSON_GetObjectItemCaseSensitive(info, "flags");
    int rc = 1;
    if (flags) {
        size_t used = 0;
        r->nflags = 0;
        const cJSON *f;
        cJSON_ArrayForEach(f, flags) {
            const size_t len = cJSON_IsString(f) ? strlen(f->valuestring) : 0;
            if (!cJSON_IsString(f) || strncmp(f->valuestring, "--", 2) ||
                used + len + 1 > sizeof r->flags) {
                rc = mgt_errf(err,
                              "%s: its \"flags\" are not the words of a command line (it was "
                              "edited or damaged); restore it, or move it away to resume with "
                              "the flags given now alone",
                              path);
                break;
            }
            memcpy(r->flags + used, f->valuestring, len + 1);
            used += len + 1;
            r->nflags++;
        }
    }
    cJSON_Delete(info);
    return rc;
}
