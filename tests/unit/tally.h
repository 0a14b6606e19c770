/* tally.h: the check macros the unit tests share. CHECK counts a condition; CHECK_ERR expects a
 * function to have failed (-1) with a message containing every given word. */
#ifndef MGT_TEST_TALLY_H
#define MGT_TEST_TALLY_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

typedef struct tally {
    int pass, fail;
} tally;

static inline void check_(tally *t, int ok, const char *what, const char *file, int line) {
    if (ok) {
        t->pass++;
        return;
    }
    t->fail++;
    fprintf(stderr, "%s:%d: check failed: %s\n", file, line, what);
}
#define CHECK(T, cond) check_((T), (cond) ? 1 : 0, #cond, __FILE__, __LINE__)

/* rc must be -1 and the message must contain every one of the given words (MGT_TEST_VERBOSE=1
 * prints the messages). */
static inline void check_err_(tally *t, int rc, const mgt_err *e, const char *const *words,
                       const char *file, int line) {
    int ok = rc == -1;
    for (int i = 0; ok && words[i]; i++)
        ok = strstr(e->msg, words[i]) != NULL;
    if (ok && getenv("MGT_TEST_VERBOSE")) /* to read the messages users will see */
        printf("  %s:%d: %s\n", file, line, e->msg);
    if (ok) {
        t->pass++;
        return;
    }
    t->fail++;
    fprintf(stderr, "%s:%d: expected an error containing", file, line);
    for (int i = 0; words[i]; i++)
        fprintf(stderr, " \"%s\"", words[i]);
    fprintf(stderr, "; got rc=%d msg=\"%s\"\n", rc, rc ? e->msg : "");
}
#define CHECK_ERR(T, rc, e, ...)                                                                   \
    check_err_((T), (rc), (e), (const char *const[]){__VA_ARGS__, NULL}, __FILE__, __LINE__)

#endif
