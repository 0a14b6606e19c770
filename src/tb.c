/* tb.c: TensorBoard event files (see tb.h): Event messages encoded by protobuf-c from
 * proto/event.proto, framed as TFRecords with ISA-L's CRC-32C. */
#include "tb.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <isa-l/crc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "event.pb-c.h"

#define TB_PREFIX "events.out.tfevents."

uint32_t mgt_tb_crc32c(const void *data, size_t len) {
    /* ISA-L's crc32_iscsi takes the running CRC as is: no inversion on the way in or out. The
     * standard CRC-32C starts from all ones and inverts the result (check value 0xE3069283 for
     * "123456789", asserted in tests/unit/test_tb.c). Its length is an int: long data goes in
     * pieces. The cast drops a const the function does not need (it only reads). */
    uint32_t crc = 0xFFFFFFFFu;
    const unsigned char *p = data;
    while (len > 0) {
        int piece = len > (1u << 30) ? 1 << 30 : (int)len;
        crc = crc32_iscsi((unsigned char *)p, piece, crc);
        p += piece;
        len -= (size_t)piece;
    }
    return crc ^ 0xFFFFFFFFu;
}

uint32_t mgt_tb_masked_crc(const void *data, size_t len) {
    uint32_t crc = mgt_tb_crc32c(data, len);
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static void put_le(uint8_t *out, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++)
        out[i] = (uint8_t)(v >> (8 * i));
}

void mgt_tb_frame(const void *data, size_t len, uint8_t *out) {
    put_le(out, (uint64_t)len, 8);
    put_le(out + 8, mgt_tb_masked_crc(out, 8), 4);
    if (out + 12 != data)
        memmove(out + 12, data, len);
    put_le(out + 12 + len, mgt_tb_masked_crc(out + 12, len), 4);
}

static double wall_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Packs the event into one framed record and writes it with one write(2) (looping only on a
 * partial write or EINTR). */
static int write_event(mgt_tb *tb, const Tensorboard__Event *ev, mgt_err *err) {
    if (tb->fd < 0)
        return mgt_errf(err, "%s: the TensorBoard event file is not open", tb->path);
    size_t len = tensorboard__event__get_packed_size(ev);
    uint8_t *rec = malloc(len + 16);
    if (!rec)
        return mgt_errf(err, "out of memory for a TensorBoard event of %zu bytes", len);
    tensorboard__event__pack(ev, rec + 12);
    mgt_tb_frame(rec + 12, len, rec);
    size_t done = 0, total = len + 16;
    while (done < total) {
        ssize_t w = write(tb->fd, rec + done, total - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            int e = w < 0 ? errno : EIO;
            free(rec);
            return mgt_errf(err,
                            "cannot write %s: %s; free space there, or train with "
                            "--no-tensorboard",
                            tb->path, strerror(e));
        }
        done += (size_t)w;
    }
    free(rec);
    return 0;
}

/* mkdir -p for dir (its parents included). */
static int make_dir(const char *dir, mgt_err *err) {
    char tmp[1024];
    if (snprintf(tmp, sizeof tmp, "%s", dir) >= (int)sizeof tmp)
        return mgt_errf(err, "%s: path too long", dir);
    for (char *p = tmp + 1;; p++) {
        int end = *p == 0;
        if (*p == '/' || end) {
            *p = 0;
            struct stat st;
            int e = mkdir(tmp, 0755) == 0 ? 0 : errno;
            if (e == EEXIST && (stat(tmp, &st) != 0 || !S_ISDIR(st.st_mode)))
                e = ENOTDIR; /* a file of that name is in the way */
            if (e && e != EEXIST)
                return mgt_errf(err,
                                "cannot create the TensorBoard folder %s: %s; pass --out "
                                "with a writable folder, or train with --no-tensorboard",
                                tmp, strerror(e));
            if (end)
                break;
            *p = '/';
        }
    }
    return 0;
}

/* The largest <time> among dir's event files (0 if none): a new file gets a later one, so that
 * TensorBoard, which reads a folder's files in name order, reads the runs in the order they ran
 * even when two start within one second or the clock went back. */
static long long latest_time(const char *dir) {
    long long latest = 0;
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    size_t np = strlen(TB_PREFIX);
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strncmp(e->d_name, TB_PREFIX, np))
            continue;
        char *end;
        long long t = strtoll(e->d_name + np, &end, 10);
        if (end != e->d_name + np && *end == '.' && t > latest)
            latest = t;
    }
    closedir(d);
    return latest;
}

int mgt_tb_open(mgt_tb *tb, const char *dir, int64_t first_step, mgt_err *err) {
    tb->fd = -1;
    snprintf(tb->path, sizeof tb->path, "%s", dir);
    if (make_dir(dir, err) < 0)
        return -1;
    char host[256];
    if (gethostname(host, sizeof host - 1) != 0)
        snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = 0;
    long long t = (long long)time(NULL), later = latest_time(dir) + 1;
    if (t < later)
        t = later;
    /* O_EXCL: a name that exists already (another run into this folder in the same second) is
     * never opened, let alone truncated; the next second is tried instead. */
    for (int tries = 0;; tries++, t++) {
        int n = snprintf(tb->path, sizeof tb->path, "%s/" TB_PREFIX "%lld.%s", dir, t, host);
        if (n >= (int)sizeof tb->path)
            return mgt_errf(err, "%s: path too long for a TensorBoard event file", dir);
        tb->fd = open(tb->path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
        if (tb->fd >= 0)
            break;
        if (errno != EEXIST || tries == 100)
            return mgt_errf(err,
                            "cannot create %s: %s; pass --out with a writable folder, or "
                            "train with --no-tensorboard",
                            tb->path, strerror(errno));
    }
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.wall_time = wall_time();
    ev.what_case = TENSORBOARD__EVENT__WHAT_FILE_VERSION;
    ev.file_version = "brain.Event:2";
    Tensorboard__SessionLog start = TENSORBOARD__SESSION_LOG__INIT;
    start.status = TENSORBOARD__SESSION_LOG__SESSION_STATUS__START;
    if (write_event(tb, &ev, err) < 0)
        goto fail;
    ev.step = first_step;
    ev.what_case = TENSORBOARD__EVENT__WHAT_SESSION_LOG;
    ev.session_log = &start;
    if (write_event(tb, &ev, err) < 0)
        goto fail;
    return 0;
fail:
    mgt_tb_close(tb);
    return -1;
}

int mgt_tb_scalars(mgt_tb *tb, int64_t step, int n, const char *const *tags, const double *values,
                   mgt_err *err) {
    Tensorboard__Summary__Value *v = calloc((size_t)(n > 0 ? n : 1), sizeof *v);
    Tensorboard__Summary__Value **vp = calloc((size_t)(n > 0 ? n : 1), sizeof *vp);
    if (!v || !vp) {
        free(v);
        free(vp);
        return mgt_errf(err, "out of memory for %d TensorBoard scalars", n);
    }
    for (int i = 0; i < n; i++) {
        tensorboard__summary__value__init(&v[i]);
        v[i].tag = (char *)tags[i]; /* protobuf-c's strings are char *; it only reads them */
        v[i].value_case = TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
        v[i].simple_value = (float)values[i];
        vp[i] = &v[i];
    }
    Tensorboard__Summary sum = TENSORBOARD__SUMMARY__INIT;
    sum.n_value = (size_t)n;
    sum.value = vp;
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.wall_time = wall_time();
    ev.step = step;
    ev.what_case = TENSORBOARD__EVENT__WHAT_SUMMARY;
    ev.summary = &sum;
    int rc = write_event(tb, &ev, err);
    free(v);
    free(vp);
    return rc;
}

void mgt_tb_close(mgt_tb *tb) {
    if (tb->fd < 0)
        return;
    fsync(tb->fd); /* best effort: every record is already in the file */
    close(tb->fd);
    tb->fd = -1;
}
