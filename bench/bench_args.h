/* bench_args.h: command-line numbers for the benchmark programs, checked the same way in each:
 * a bad value ends the job on every rank with one line naming the flag. */
#ifndef MGT_BENCH_ARGS_H
#define MGT_BENCH_ARGS_H

#include "parse.h"
#include "runtime.h"

/* The value of `flag` as a whole number of at least `min`. */
static inline long bench_need_long(const char *flag, const char *v, long min) {
    int64_t x;
    if (mgt_parse_i64(v, &x) < 0 || x < min)
        mgt_die_all("%s %s: expected a whole number of at least %ld", flag, v, min);
    return (long)x;
}

#endif
