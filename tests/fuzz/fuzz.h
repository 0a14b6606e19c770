/* fuzz.h: what the fuzz targets share.
 *
 * Each fuzz_<target>.c defines LLVMFuzzerTestOneInput, the entry point libFuzzer calls with one
 * input; the same file linked with replay.c (no libFuzzer) feeds it the committed corpus and the
 * regression inputs in the normal test suite. A target returns 0 for every input: bad input must
 * come back as an error from the code under test, never as a crash, a hang or a leak. Beyond what
 * the sanitizers see, FUZZ_CHECK states what must hold of a result (an error message was
 * written, a parsed model fits its capacities...), and aborts with the reason when it does not. */
#ifndef MGT_FUZZ_H
#define MGT_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: fuzz check failed: %s: ", __FILE__, __LINE__, #cond);          \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* A copy of the input with a terminating NUL (the code under test takes C strings). */
static inline char *fuzz_text(const uint8_t *data, size_t size) {
    char *s = malloc(size + 1);
    if (s) {
        for (size_t i = 0; i < size; i++)
            s[i] = (char)data[i];
        s[size] = 0;
    }
    return s;
}

#endif
