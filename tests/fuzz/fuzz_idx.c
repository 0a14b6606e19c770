/* fuzz_idx.c: the IDX reader (src/data/idx.c), plain and gzip.
 *
 * The input is a data folder's two files and how they are stored: byte 0 holds flags (bit 0:
 * the images file is named .gz, bit 1: the labels file is, bit 2: the images bytes are gzipped
 * before they are written, bit 3: the labels bytes are; bits 4-7: the class count the model
 * expects, 0 for "take it from the labels"), bytes 1-2 where the rest splits into the images
 * file and the labels file. The harness gzips so that the fuzzer reaches the IDX checks behind
 * the decompression; with bits 0-1 alone it feeds zlib whatever bytes it likes. Files go to a
 * fresh folder (in /dev/shm where there is one) removed after each input.
 *
 * A folder that loads must hold what the reader promises: at least one sample of a positive
 * shape, every label below the class count, all bytes readable. One that does not must say why,
 * naming a file or the folder. */
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "data/dataset.h"
#include "fuzz.h"

/* Writes len bytes to path, through gzip when gz is set. */
static int put(const char *path, const uint8_t *p, size_t len, int gz) {
    if (gz) {
        gzFile f = gzopen(path, "wb1");
        if (!f)
            return -1;
        int ok = len == 0 || gzwrite(f, p, (unsigned)len) == (int)len;
        return gzclose(f) == Z_OK && ok ? 0 : -1;
    }
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    int ok = len == 0 || fwrite(p, 1, len, f) == len;
    return fclose(f) == 0 && ok ? 0 : -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 3)
        return 0;
    const int flags = data[0], classes = flags >> 4;
    size_t split = (size_t)(data[1] | data[2] << 8);
    const uint8_t *rest = data + 3;
    size_t n = size - 3;
    if (split > n)
        split = n;

    char dir[64], images[128], labels[128];
    snprintf(dir, sizeof dir, "%s/mgt_fuzz_idx_XXXXXX",
             access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    if (!mkdtemp(dir))
        return 0;
    snprintf(images, sizeof images, "%s/train-images-idx3-ubyte%s", dir, flags & 1 ? ".gz" : "");
    snprintf(labels, sizeof labels, "%s/train-labels-idx1-ubyte%s", dir, flags & 2 ? ".gz" : "");
    if (put(images, rest, split, flags & 4) == 0 &&
        put(labels, rest + split, n - split, flags & 8) == 0) {
        mgt_dataset ds;
        mgt_err e = {{0}};
        if (mgt_dataset_load_idx(&ds, dir, "train", 0, 0, classes, &e) == 0) {
            FUZZ_CHECK(ds.n >= 1 && ds.h >= 1 && ds.w >= 1 && ds.c == 1, "%lld samples of %dx%d",
                       (long long)ds.n, ds.h, ds.w);
            FUZZ_CHECK(ds.classes >= 1 && (classes <= 0 || ds.classes == classes), "%d classes",
                       ds.classes);
            for (int64_t i = 0; i < ds.n; i++)
                FUZZ_CHECK(ds.labels[i] < ds.classes, "label %d", ds.labels[i]);
            volatile uint8_t last = ds.pixels[ds.n * ds.h * ds.w - 1];
            (void)last;
            mgt_dataset_free(&ds);
        } else {
            FUZZ_CHECK(strstr(e.msg, dir) != NULL, "message \"%s\"", e.msg);
        }
    }
    unlink(images);
    unlink(labels);
    rmdir(dir);
    return 0;
}
