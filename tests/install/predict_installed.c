/* predict_installed.c: a user's program, built against the INSTALLED libmgt only
 * (cc predict_installed.c $(pkg-config --cflags --libs mgtrain) -lz; tests/cli/install.sh).
 *
 *   predict_installed MODEL WEIGHTS DATA_DIR EXPECTED.npy
 *
 * Reads DATA_DIR/t10k-images-idx3-ubyte.gz as a user would (zlib, pixels / 255.0f), predicts
 * with a predictor opened on MODEL and WEIGHTS, and compares the outputs bit for bit with
 * EXPECTED.npy, which `mgtrain predict` wrote for the same model, weights and data on one rank.
 * Then the errors a caller meets: a missing weights file, weights of another model, an unknown
 * device, bad arguments to predict. Prints ok/FAIL lines; exit status 1 if any check failed. */
#include <mgtrain/mgt.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

static int fails;

static void check(int ok, const char *what, const char *detail) {
    printf("%s: %s%s%s\n", ok ? "ok" : "FAIL", what, detail ? ": " : "", detail ? detail : "");
    fails += !ok;
}

static uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* The test images, scaled to [0,1]: n rows of rows*cols floats. */
static float *read_images(const char *dir, int64_t *n, int64_t *elems) {
    char path[1024];
    snprintf(path, sizeof path, "%s/t10k-images-idx3-ubyte.gz", dir);
    gzFile f = gzopen(path, "rb");
    unsigned char h[16];
    if (!f || gzread(f, h, 16) != 16 || be32(h) != 0x803) {
        fprintf(stderr, "%s: not an IDX image file\n", path);
        if (f)
            gzclose(f);
        return NULL;
    }
    *n = be32(h + 4);
    *elems = (int64_t)be32(h + 8) * be32(h + 12);
    size_t bytes = (size_t)(*n * *elems);
    unsigned char *u8 = malloc(bytes);
    float *x = malloc(bytes * sizeof(float));
    if (!u8 || !x || gzread(f, u8, (unsigned)bytes) != (int)bytes) {
        fprintf(stderr, "%s: short read\n", path);
        free(u8);
        free(x);
        gzclose(f);
        return NULL;
    }
    for (size_t i = 0; i < bytes; i++)
        x[i] = (float)u8[i] / 255.0f;
    free(u8);
    gzclose(f);
    return x;
}

/* The data of a float32 .npy file (little-endian, C order). */
static float *read_npy(const char *path, size_t *count) {
    FILE *f = fopen(path, "rb");
    unsigned char h[10];
    if (!f || fread(h, 1, 10, f) != 10 || memcmp(h, "\x93NUMPY", 6)) {
        fprintf(stderr, "%s: not a .npy file\n", path);
        if (f)
            fclose(f);
        return NULL;
    }
    long header = h[8] | (h[9] << 8);
    fseek(f, 0, SEEK_END);
    long size = ftell(f) - 10 - header;
    fseek(f, 10 + header, SEEK_SET);
    *count = (size_t)size / sizeof(float);
    float *d = malloc((size_t)size);
    if (d && fread(d, sizeof(float), *count, f) != *count) {
        free(d);
        d = NULL;
    }
    fclose(f);
    return d;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s MODEL WEIGHTS DATA_DIR EXPECTED.npy\n", argv[0]);
        return 2;
    }
    const char *model = argv[1], *weights = argv[2];
    char err[1024], detail[2048];
    printf("libmgt %s\n", mgt_library_version());

    int64_t n = 0, elems = 0;
    float *x = read_images(argv[3], &n, &elems);
    size_t expected_count = 0;
    float *expected = read_npy(argv[4], &expected_count);
    if (!x || !expected)
        return 2;

    mgt_predictor *p = mgt_predictor_open(model, NULL, weights, NULL, err, sizeof err);
    check(p != NULL, "mgt_predictor_open", p ? NULL : err);
    if (!p)
        return 1;
    int h, w, c;
    mgt_predictor_input_shape(p, &h, &w, &c);
    int64_t k = mgt_predictor_output_size(p);
    snprintf(detail, sizeof detail, "%dx%dx%d -> %lld %s", h, w, c, (long long)k,
             mgt_predictor_outputs_probabilities(p) ? "probabilities" : "logits");
    check(mgt_predictor_input_size(p) == elems && (int64_t)h * w * c == elems,
          "input shape matches the images", detail);
    check(expected_count == (size_t)(n * k), "the expected outputs hold n x classes floats", NULL);

    float *out = malloc(sizeof(float) * (size_t)(n * k));
    if (!out)
        return 2;
    memset(out, 0xff, sizeof(float) * (size_t)(n * k)); /* NaN where nothing is written */
    int rc = mgt_predictor_predict(p, x, n, out, err, sizeof err);
    check(rc == 0, "mgt_predictor_predict", rc ? err : NULL);
    size_t differ = 0, first = 0;
    for (size_t i = 0; i < expected_count; i++)
        if (memcmp(&out[i], &expected[i], sizeof(float)) != 0 && differ++ == 0)
            first = i;
    if (differ)
        snprintf(detail, sizeof detail,
                 "%zu of %zu differ; first at [%zu][%zu]: %.9g, mgtrain "
                 "predict %.9g",
                 differ, expected_count, first / (size_t)k, first % (size_t)k, out[first],
                 expected[first]);
    else
        snprintf(detail, sizeof detail, "%lld x %lld floats", (long long)n, (long long)k);
    check(differ == 0, "outputs equal mgtrain predict's bit for bit", detail);

    /* Errors come back as messages; nothing exits. */
    rc = mgt_predictor_predict(p, NULL, 3, out, err, sizeof err);
    check(rc == -1 && strstr(err, "NULL"), "predict with x NULL is an error", err);
    mgt_predictor_close(p);

    p = mgt_predictor_open(model, NULL, "no/such/weights.safetensors", NULL, err, sizeof err);
    check(!p && strstr(err, "no/such/weights.safetensors"), "a missing weights file is named", err);
    const char *other = "[input]\nshape = 28,28,1\n[flatten]\n[dense]\nunits = 10\n"
                        "[train]\noptimizer = sgd\nloss = sparse_categorical_crossentropy\n"
                        "batch_size = 32\n";
    p = mgt_predictor_open("other.cfg", other, weights, NULL, err, sizeof err);
    check(!p && strstr(err, weights), "weights of another model are refused", err);
    mgt_predictor_options o;
    mgt_predictor_options_init(&o);
    o.device = "tpu";
    p = mgt_predictor_open(model, NULL, weights, &o, err, sizeof err);
    check(!p && strstr(err, "tpu"), "an unknown device is refused", err);
    mgt_predictor_close(NULL);

    free(x);
    free(expected);
    free(out);
    printf("%d failed\n", fails);
    return fails ? 1 : 0;
}
