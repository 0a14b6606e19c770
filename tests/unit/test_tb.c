/* test_tb.c: TensorBoard event files (src/tb.c): CRC-32C, TFRecord framing, the events.
 *
 * - CRC-32C: ISA-L's crc32_iscsi behind mgt_tb_crc32c gives the standard check value 0xE3069283
 *   for "123456789", and equals a bitwise reference (the reflected polynomial 0x82F63B78, all-ones
 *   start, inverted result) on buffers of many lengths and alignments; the masked CRC is
 *   TFRecord's rotate-and-add of it.
 * - Framing: length, masked CRC of the length, data, masked CRC of the data, little-endian.
 * - A file as written: read back record by record while the writer is still open (each record
 *   is in the file once the call returns), every CRC checked against the reference, every Event
 *   decoded (protobuf-c): file_version "brain.Event:2", SessionLog START at the given step, then
 *   the scalars with their tags, steps and float32 values.
 * - A second writer in the same folder creates another file whose name sorts later, even within
 *   the same second and after a file whose time lies in the future, and leaves the first file's
 *   bytes as they were; a folder that cannot be created is an error naming it. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "event.pb-c.h"
#include "tb.h"

#include "tally.h"

/* Bit by bit, from the definition: no table, no library. */
static uint32_t crc32c_reference(const uint8_t *p, size_t n) {
    uint32_t crc = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        for (int k = 0; k < 8; k++)
            crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
    }
    return crc ^ 0xFFFFFFFFu;
}

static uint32_t masked_reference(const uint8_t *p, size_t n) {
    uint32_t c = crc32c_reference(p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static uint64_t get_le(const uint8_t *p, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static void test_crc(tally *t) {
    CHECK(t, mgt_tb_crc32c("123456789", 9) == 0xE3069283u);
    CHECK(t, mgt_tb_crc32c("", 0) == 0);
    enum { MAX = 70000 };
    uint8_t *buf = malloc(MAX + 8);
    if (!buf) {
        CHECK(t, !"out of memory");
        return;
    }
    for (int i = 0; i < MAX + 8; i++)
        buf[i] = (uint8_t)(mgt_rand64(7, (uint64_t)i) >> 32);
    const size_t lens[] = {1, 3, 7, 8, 9, 15, 16, 31, 64, 255, 256, 1000, 4097, MAX};
    int same = 1, masked = 1;
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++)
        for (int off = 0; off < 8; off++) { /* every alignment of the start */
            same &= mgt_tb_crc32c(buf + off, lens[k]) == crc32c_reference(buf + off, lens[k]);
            masked &= mgt_tb_masked_crc(buf + off, lens[k]) == masked_reference(buf + off, lens[k]);
        }
    CHECK(t, same);
    CHECK(t, masked);
    free(buf);
}

static void test_frame(tally *t) {
    const char *data = "an event's bytes";
    size_t n = strlen(data);
    uint8_t rec[64];
    mgt_tb_frame(data, n, rec);
    CHECK(t, get_le(rec, 8) == n);
    CHECK(t, get_le(rec + 8, 4) == masked_reference(rec, 8));
    CHECK(t, memcmp(rec + 12, data, n) == 0);
    CHECK(t, get_le(rec + 12 + n, 4) == masked_reference((const uint8_t *)data, n));
}

static uint8_t *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *d = malloc((size_t)size + 1);
    if (d && fread(d, 1, (size_t)size, f) != (size_t)size) {
        free(d);
        d = NULL;
    }
    fclose(f);
    *n = (size_t)size;
    return d;
}

/* Splits a file into its records, checking both CRCs of each; decodes up to max events. */
static int read_events(tally *t, const char *path, Tensorboard__Event **ev, int max) {
    size_t n;
    uint8_t *d = read_all(path, &n);
    CHECK(t, d != NULL);
    if (!d)
        return 0;
    int count = 0, crcs_ok = 1;
    size_t at = 0;
    while (at + 16 <= n && count < max) {
        uint64_t len = get_le(d + at, 8);
        if (at + 16 + len > n)
            break;
        crcs_ok &= get_le(d + at + 8, 4) == masked_reference(d + at, 8);
        crcs_ok &= get_le(d + at + 12 + len, 4) == masked_reference(d + at + 12, len);
        ev[count] = tensorboard__event__unpack(NULL, len, d + at + 12);
        CHECK(t, ev[count] != NULL);
        if (!ev[count])
            break;
        count++;
        at += 16 + len;
    }
    CHECK(t, crcs_ok);
    CHECK(t, at == n); /* whole records only */
    free(d);
    return count;
}

static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    if (!d)
        return -1;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += strncmp(e->d_name, "events.out.tfevents.", 20) == 0;
    closedir(d);
    return n;
}

static void test_file(tally *t, const char *root) {
    char dir[512], host[256];
    snprintf(dir, sizeof dir, "%s/run/tb", root); /* two levels that do not exist yet */
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    mgt_tb tb;
    mgt_err e;
    CHECK(t, mgt_tb_open(&tb, dir, 42, &e) == 0);
    /* TensorBoard's naming: events.out.tfevents.<unix seconds>.<host> */
    const char *base = strrchr(tb.path, '/') + 1;
    char *end;
    long long when = strtoll(base + 20, &end, 10);
    CHECK(t, strncmp(base, "events.out.tfevents.", 20) == 0);
    CHECK(t, when > 1700000000LL && *end == '.' && strcmp(end + 1, host) == 0);
    const char *tags[] = {"epoch/loss", "epoch/accuracy", "x"};
    double values[] = {0.4375, 1.0 / 3.0, -1e30};
    CHECK(t, mgt_tb_scalars(&tb, 7, 2, tags, values, &e) == 0);
    CHECK(t, mgt_tb_scalars(&tb, 1LL << 40, 1, tags + 2, values + 2, &e) == 0);

    /* Read while the writer is open: everything written is in the file already. */
    Tensorboard__Event *ev[8] = {0};
    int n = read_events(t, tb.path, ev, 8);
    CHECK(t, n == 4);
    if (n == 4) {
        CHECK(t, ev[0]->what_case == TENSORBOARD__EVENT__WHAT_FILE_VERSION &&
                     strcmp(ev[0]->file_version, "brain.Event:2") == 0);
        CHECK(t, ev[0]->wall_time > 1.7e9);
        CHECK(t,
              ev[1]->what_case == TENSORBOARD__EVENT__WHAT_SESSION_LOG &&
                  ev[1]->session_log->status == TENSORBOARD__SESSION_LOG__SESSION_STATUS__START &&
                  ev[1]->step == 42);
        CHECK(t, ev[2]->what_case == TENSORBOARD__EVENT__WHAT_SUMMARY && ev[2]->step == 7 &&
                     ev[2]->summary->n_value == 2);
        if (ev[2]->what_case == TENSORBOARD__EVENT__WHAT_SUMMARY && ev[2]->summary->n_value == 2)
            for (int i = 0; i < 2; i++) {
                const Tensorboard__Summary__Value *v = ev[2]->summary->value[i];
                CHECK(t, strcmp(v->tag, tags[i]) == 0);
                CHECK(t, v->value_case == TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE);
                CHECK(t, v->simple_value == (float)values[i]); /* float32, rounded once */
            }
        CHECK(t, ev[3]->step == 1LL << 40 && ev[3]->summary->n_value == 1 &&
                     ev[3]->summary->value[0]->simple_value == -1e30f);
        CHECK(t, ev[3]->wall_time >= ev[0]->wall_time);
    }
    for (int i = 0; i < n; i++)
        tensorboard__event__free_unpacked(ev[i], NULL);
    mgt_tb_close(&tb);
    CHECK(t, tb.fd < 0);
    mgt_tb_close(&tb); /* twice is fine */

    /* Another run into the same folder, at once: a new file, later in name order; the first
     * file is left as it was. Then one after a file named for the future. */
    size_t n1, n1b;
    uint8_t *first = read_all(tb.path, &n1);
    char first_path[1024];
    snprintf(first_path, sizeof first_path, "%s", tb.path);
    mgt_tb tb2;
    CHECK(t, mgt_tb_open(&tb2, dir, 1, &e) == 0);
    CHECK(t, strcmp(tb2.path, first_path) > 0);
    CHECK(t, mgt_tb_scalars(&tb2, 1, 1, tags, values, &e) == 0);
    mgt_tb_close(&tb2);
    uint8_t *again = read_all(first_path, &n1b);
    CHECK(t, first && again && n1 == n1b && memcmp(first, again, n1) == 0);
    free(first);
    free(again);
    char future[600];
    snprintf(future, sizeof future, "%s/events.out.tfevents.4000000000.elsewhere", dir);
    FILE *f = fopen(future, "w");
    CHECK(t, f != NULL);
    if (f)
        fclose(f);
    mgt_tb tb3;
    CHECK(t, mgt_tb_open(&tb3, dir, 1, &e) == 0);
    CHECK(t, strstr(tb3.path, "events.out.tfevents.4000000001.") != NULL);
    mgt_tb_close(&tb3);
    CHECK(t, count_files(dir) == 4);

    /* A folder under a regular file cannot be made. */
    char bad[700];
    snprintf(bad, sizeof bad, "%s/tb", future);
    mgt_tb tb4;
    CHECK_ERR(t, mgt_tb_open(&tb4, bad, 1, &e), &e, "cannot create the TensorBoard folder", future,
              "--no-tensorboard");
    CHECK(t, tb4.fd < 0);
    mgt_tb_close(&tb4);
}

int main(void) {
    tally t = {0, 0};
    test_crc(&t);
    test_frame(&t);
    char root[] = "/tmp/mgt-test-tb.XXXXXX";
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    test_file(&t, root);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0)
        fprintf(stderr, "note: could not remove %s\n", root);
    printf("test_tb: %d passed, %d failed\n", t.pass, t.fail);
    return t.fail ? 1 : 0;
}
