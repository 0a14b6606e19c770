/* replay.c: feeds files to a fuzz target's entry point without libFuzzer, so that the committed
 * corpus and every input that once crashed run in the normal test suite, under the build's own
 * compiler and sanitizers.
 *
 *   fuzz_replay_<target> PATH...   each PATH a file or a folder of files (dot files skipped)
 *
 * An input that crashes, hangs or fails a check ends the process (the test fails, naming the
 * file just announced); otherwise it prints how many inputs it replayed. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

/* Replays one file; returns 0, or -1 if it cannot be read. */
static int replay_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? 2 * cap : 4096;
            uint8_t *b = realloc(buf, cap);
            if (!b) {
                free(buf);
                fclose(f);
                return -1;
            }
            buf = b;
        }
        size_t r = fread(buf + len, 1, cap - len, f);
        len += r;
        if (r == 0)
            break;
    }
    int bad = ferror(f);
    fclose(f);
    if (!bad) {
        fprintf(stderr, "replaying %s (%zu bytes)\n", path, len);
        LLVMFuzzerTestOneInput(buf, len);
    }
    free(buf);
    return bad ? -1 : 0;
}

static int cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Replays a file, or every file of a folder in name order; counts them in *n. */
static int replay(const char *path, int *n) {
    struct stat sb;
    if (stat(path, &sb) != 0)
        return -1;
    if (!S_ISDIR(sb.st_mode)) {
        (*n)++;
        return replay_file(path);
    }
    DIR *d = opendir(path);
    if (!d)
        return -1;
    char **names = NULL;
    size_t cnt = 0, cap = 0;
    int rc = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.')
            continue;
        if (cnt == cap) {
            cap = cap ? 2 * cap : 64;
            char **more = realloc(names, cap * sizeof *names);
            if (!more) {
                rc = -1;
                break;
            }
            names = more;
        }
        size_t l = strlen(path) + strlen(e->d_name) + 2;
        if (!(names[cnt] = malloc(l))) {
            rc = -1;
            break;
        }
        snprintf(names[cnt++], l, "%s/%s", path, e->d_name);
    }
    closedir(d);
    if (cnt)
        qsort(names, cnt, sizeof *names, cmp);
    for (size_t i = 0; i < cnt; i++) {
        if (!rc)
            rc = replay(names[i], n);
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv) {
    int n = 0;
    for (int i = 1; i < argc; i++)
        if (replay(argv[i], &n) < 0) {
            fprintf(stderr, "cannot read %s\n", argv[i]);
            return 1;
        }
    printf("replayed %d inputs, none failed\n", n);
    return 0;
}
