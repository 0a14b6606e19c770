/* mgt_compare: compares two weights files (.safetensors) tensor by tensor, or two .npy files,
 * by relative difference = max |a - b| / max |a| (per tensor). Exit 0 when every tensor is
 * within TOL, 1 otherwise, 2 on bad input. Prints the worst tensor.
 *   mgt_compare A B TOL [--only-weights]   (--only-weights skips optimizer.* tensors) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor_io.h"

static float *read_npy(const char *path, long *n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    unsigned char h[10];
    if (fread(h, 1, 10, f) != 10 || memcmp(h, "\x93NUMPY", 6)) {
        fclose(f);
        return NULL;
    }
    long hl = h[8] | (h[9] << 8);
    fseek(f, 0, SEEK_END);
    long size = ftell(f) - 10 - hl;
    fseek(f, 10 + hl, SEEK_SET);
    *n = size / 4;
    float *d = malloc((size_t)size + 4);
    if (d && fread(d, 4, (size_t)*n, f) != (size_t)*n) {
        free(d);
        d = NULL;
    }
    fclose(f);
    return d;
}

static double rel(const float *a, const float *b, long n) {
    double diff = 0, mag = 0;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= diff)) /* NaN counts as infinitely different */
            diff = isnan(d) ? INFINITY : d;
        if (fabs(a[i]) > mag)
            mag = fabs(a[i]);
    }
    return mag > 0 ? diff / mag : diff;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: mgt_compare A B TOL [--only-weights]\n");
        return 2;
    }
    double tol = atof(argv[3]), worst = 0;
    int only_weights = argc > 4 && !strcmp(argv[4], "--only-weights");
    const char *worst_name = "";
    size_t len = strlen(argv[1]);
    /* What is read is freed on every way out (done:): the sanitizer build, tests/sanitize,
     * checks this tool for leaks as it checks mgtrain. */
    mgt_safetensors A = {0}, B = {0};
    float *a = NULL, *b = NULL;
    int rc;
    if (len > 4 && !strcmp(argv[1] + len - 4, ".npy")) {
        long na, nb;
        a = read_npy(argv[1], &na);
        b = read_npy(argv[2], &nb);
        if (!a || !b || na != nb) {
            fprintf(stderr, "mgt_compare: cannot read both .npy files or sizes differ\n");
            rc = 2;
            goto done;
        }
        worst = rel(a, b, na);
        worst_name = "array";
    } else {
        mgt_err e;
        if (mgt_safetensors_read(argv[1], &A, &e) < 0 ||
            mgt_safetensors_read(argv[2], &B, &e) < 0) {
            fprintf(stderr, "mgt_compare: %s\n", e.msg);
            rc = 2;
            goto done;
        }
        int compared = 0;
        for (int i = 0; i < A.nt; i++) {
            if (only_weights && !strncmp(A.t[i].name, "optimizer.", 10))
                continue;
            const mgt_tensor_entry *t = mgt_safetensors_find(&B, A.t[i].name);
            long n = 1;
            for (int d = 0; d < A.t[i].ndim; d++)
                n *= (long)A.t[i].shape[d];
            if (!t) {
                fprintf(stderr, "mgt_compare: %s missing from %s\n", A.t[i].name, argv[2]);
                rc = 1;
                goto done;
            }
            double r = rel(A.t[i].data, t->data, n);
            compared++;
            if (r > worst || isnan(r)) {
                worst = r;
                worst_name = A.t[i].name;
            }
        }
        if (!compared) {
            fprintf(stderr, "mgt_compare: no tensors compared\n");
            rc = 2;
            goto done;
        }
        printf("compared %d tensors\n", compared);
    }
    printf("worst relative difference %.3g (%s), tolerance %.3g\n", worst, worst_name, tol);
    rc = worst <= tol ? 0 : 1;
done:
    free(a);
    free(b);
    mgt_safetensors_free(&A);
    mgt_safetensors_free(&B);
    return rc;
}
