/* mgt_data_bench: how many images per second an image set's transforms give, per thread count:
 * the work a training rank's loader does for every sample (images.h): read the stored image
 * (pread; the page cache holds the set after a first pass), crop and resize it to the input
 * (training: random-resized crop and flip; evaluation: resize and centre crop), bytes / 255, and
 * the [input] normalisation, into a batch of floats, on the loader's thread pool.
 *
 *   mgt_data_bench --data DIR [--split train] [--input 224,224] [--mode train|eval]
 *                  [--threads 1,2,4] [--batch 256] [--batches 20] [--warmup 2]
 *
 * Per thread count: warm-up batches (which also read the set into the page cache), then the
 * timed ones; prints the wall and CPU time (all threads: getrusage) per batch and
 *   images/s        = timed images / wall seconds
 *   images/s/core   = images/s / threads (the rate one core gives when the threads have a core
 *                     each; on a shared or smaller machine the CPU column says what was had)
 *   images/CPU-s    = timed images / CPU seconds used (load-independent)
 * and, once every thread count ran, with --parts, what each part of a sample's work costs on one
 * thread (the read; the crop, resize and scaling; the normalisation, made in the same pass on the
 * same thread; and, for comparison, the separate pass over the batch it replaces), then the
 * process's peak resident memory after reading every stored image at least once (--pass: a whole
 * pass over the set first), which does not grow with the set's size: samples are read into
 * per-thread buffers, not mapped. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "data/images.h"
#include "util.h"

static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec * 1e-6;
}

/* This thread's CPU time: --parts runs on the calling thread alone (a pool of one), so that a
 * loaded machine stretches none of its figures. */
static double thread_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void usage(void) {
    fprintf(stderr, "usage: mgt_data_bench --data DIR [--split train|test] [--input H,W] "
                    "[--mode train|eval] [--threads 1,2,4] [--batch 256] [--batches 20] "
                    "[--warmup 2] [--pass] [--parts]\n");
    exit(2);
}

int main(int argc, char **argv) {
    const char *dir = NULL, *split = "train", *mode = "train", *threads_s = "1";
    int h = 224, w = 224, batch = 256, batches = 20, warmup = 2, pass = 0, parts = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--pass")) {
            pass = 1;
            continue;
        }
        if (!strcmp(a, "--parts")) {
            parts = 1;
            continue;
        }
        if (!v)
            usage();
        if (!strcmp(a, "--data"))
            dir = v;
        else if (!strcmp(a, "--split"))
            split = v;
        else if (!strcmp(a, "--mode"))
            mode = v;
        else if (!strcmp(a, "--threads"))
            threads_s = v;
        else if (!strcmp(a, "--input")) {
            if (sscanf(v, "%d,%d", &h, &w) != 2)
                usage();
        } else if (!strcmp(a, "--batch"))
            batch = atoi(v);
        else if (!strcmp(a, "--batches"))
            batches = atoi(v);
        else if (!strcmp(a, "--warmup"))
            warmup = atoi(v);
        else
            usage();
        i++;
    }
    if (!dir || batch < 1 || batches < 1 || warmup < 0 || h < 1 || w < 1 ||
        (strcmp(mode, "train") && strcmp(mode, "eval")))
        usage();
    /* ImageNet's normalisation, as a ResNet-50 model file gives it */
    const mgt_input_tf tf = {
        .norm = 1, .nvalues = 3, .mean = {0.485f, 0.456f, 0.406f}, .std = {0.229f, 0.224f, 0.225f}};
    mgt_dataset ds;
    mgt_err e;
    if (mgt_dataset_load_images(&ds, dir, split, h, w, 3, 1 << 20, &tf, &e) < 0) {
        fprintf(stderr, "mgt_data_bench: %s\n", e.msg);
        return 2;
    }
    const mgt_augment a = {
        .flip = 1, .resized_crop = 1, .scale = {0.08f, 1.0f}, .ratio = {3.0f / 4.0f, 4.0f / 3.0f}};
    const int train = !strcmp(mode, "train");
    const size_t elems = (size_t)h * (size_t)w * 3;
    float *x = malloc(sizeof(float) * elems * (size_t)batch);
    int32_t *labels = malloc(sizeof(int32_t) * (size_t)batch);
    int64_t *rows = malloc(sizeof(int64_t) * (size_t)batch);
    if (!x || !labels || !rows) {
        fprintf(stderr, "mgt_data_bench: out of memory for a batch of %d\n", batch);
        return 2;
    }
    char desc[256];
    printf("# %s (%s split): %s\n", dir, split, mgt_images_describe(&ds, desc, sizeof desc));
    printf("# %s transform to %dx%dx3, batches of %d, %d warm-up + %d timed per thread count\n",
           train ? "training (random-resized crop, flip)" : "evaluation (resize, centre crop)", h,
           w, batch, warmup, batches);
    printf("# threads  ms/batch  images/s  images/s/core  CPU-s/batch  images/CPU-s\n");
    int64_t next = 0;
    if (pass) { /* every stored image once: the page cache warm, the peak memory below honest */
        mgt_images_threads(&ds, 1);
        for (int64_t at = 0; at < ds.n; at += batch) {
            const int n = ds.n - at < batch ? (int)(ds.n - at) : batch;
            for (int i = 0; i < n; i++)
                rows[i] = at + i;
            mgt_images_gather(&ds, rows, n, train ? &a : NULL, 1, 0, 1, x, labels);
        }
    }
    for (const char *p = threads_s; *p;) {
        const int t = atoi(p);
        mgt_images_threads(&ds, t); /* the pool is made again for this count */
        double wall = 0, cpu = 0;
        for (int b = 0; b < warmup + batches; b++) {
            for (int i = 0; i < batch; i++)
                rows[i] = (next++ * 7919) % ds.n; /* spread over the shards */
            const double t0 = mgt_now(), c0 = cpu_seconds();
            mgt_images_gather(&ds, rows, batch, train ? &a : NULL, 1, (uint64_t)b, 1, x, labels);
            if (b >= warmup) {
                wall += mgt_now() - t0;
                cpu += cpu_seconds() - c0;
            }
        }
        const double n = (double)batch * batches;
        printf("%9d %9.1f %9.0f %14.1f %12.3f %13.1f\n", t, 1e3 * wall / batches, n / wall,
               n / wall / t, cpu / batches, n / cpu);
        fflush(stdout);
        p = strchr(p, ',');
        if (!p)
            break;
        p++;
    }
    if (parts) { /* one thread: what each part of a sample's work costs, and where it runs */
        mgt_images_threads(&ds, 1);
        const int n = batch;
        uint8_t *buf = malloc(mgt_images_max_bytes(&ds));
        double t_read = 0, t_plain = 0, t_norm = 0, t_serial = 0;
        for (int rep = 0; rep < batches + 1; rep++) {
            for (int i = 0; i < n; i++)
                rows[i] = (next++ * 7919) % ds.n;
            const int timed = rep > 0; /* the first pass warms the page cache */
            double t0 = thread_seconds();
            for (int i = 0; i < n; i++) {
                int d[4];
                if (mgt_images_read(&ds, rows[i], buf, d, &e) < 0) {
                    fprintf(stderr, "mgt_data_bench: %s\n", e.msg);
                    return 2;
                }
            }
            double t1 = thread_seconds();
            mgt_images_gather(&ds, rows, n, train ? &a : NULL, 1, rep, 0, x, labels);
            double t2 = thread_seconds();
            mgt_images_gather(&ds, rows, n, train ? &a : NULL, 1, rep, 1, x, labels);
            double t3 = thread_seconds();
            mgt_images_gather(&ds, rows, n, train ? &a : NULL, 1, rep, 0, x, labels);
            double t4 = thread_seconds();
            mgt_dataset_normalize(&ds, x, n); /* the pass over the batch it replaces */
            double t5 = thread_seconds();
            if (timed) {
                t_read += t1 - t0, t_plain += t2 - t1, t_norm += t3 - t2;
                t_serial += t5 - t4;
            }
        }
        const double per = 1e3 / ((double)n * batches); /* seconds in all -> ms per sample */
        const double read = t_read * per, plain = t_plain * per, norm = t_norm * per;
        printf("# per-sample parts, one thread, CPU ms: read %.4f, crop+resize+scale %.4f, "
               "normalised on the same pass %.4f (so normalisation %.4f), old separate pass "
               "over the batch %.4f\n",
               read, plain - read, norm - read, norm - plain, t_serial * per);
        free(buf);
    }
    int64_t set_bytes = 0;
    for (int64_t r = 0; r < ds.n; r++) {
        int d[4];
        mgt_images_dims(&ds, r, d);
        set_bytes += (int64_t)d[0] * d[1] * 3;
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("# peak resident memory %.1f MiB (the set: %lld images, %.1f MiB stored%s)\n",
           (double)ru.ru_maxrss / 1024.0, (long long)ds.n,
           (double)set_bytes / 1048576.0,
           pass ? ", every one read" : "");
    free(x);
    free(labels);
    free(rows);
    mgt_dataset_free(&ds);
    return 0;
}
