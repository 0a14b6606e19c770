/* parse.c: strict parsing of numbers and names, and edit-distance suggestions. */
#include "parse.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

char *mgt_trim(char *s) {
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1]))
        s[--n] = 0;
    size_t i = 0;
    while (s[i] && isspace((unsigned char)s[i]))
        i++;
    if (i)
        memmove(s, s + i, n - i + 1);
    return s;
}

int mgt_parse_i64(const char *s, int64_t *v) {
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (!*s || errno || *end)
        return -1;
    *v = x;
    return 0;
}

int mgt_parse_int(const char *s, int *v) {
    int64_t x;
    if (mgt_parse_i64(s, &x) < 0 || x < -2147483647LL || x > 2147483647LL)
        return -1;
    *v = (int)x;
    return 0;
}

int mgt_parse_float(const char *s, float *v) {
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    /* Finite as a float: 1e39 is a finite double but an infinite float. */
    if (!*s || errno || *end || !isfinite(x) || fabs(x) > FLT_MAX)
        return -1;
    *v = (float)x;
    return 0;
}

int mgt_parse_bool(const char *s, int *v) {
    static const char *yes[] = {"true", "yes", "on", "1"}, *no[] = {"false", "no", "off", "0"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(s, yes[i])) {
            *v = 1;
            return 0;
        }
        if (!strcasecmp(s, no[i])) {
            *v = 0;
            return 0;
        }
    }
    return -1;
}

/* A comma-separated list of up to max items, each parsed by one() into v[i]. */
static int parse_list(const char *s, void *v, size_t size, int max,
                      int (*one)(const char *s, void *out)) {
    char buf[256];
    if (strlen(s) >= sizeof buf) /* a list cut short would parse as another list */
        return -1;
    snprintf(buf, sizeof buf, "%s", s);
    int n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == max || one(mgt_trim(tok), (char *)v + (size_t)n * size) < 0)
            return -1;
        n++;
    }
    return n;
}

static int one_int(const char *s, void *out) {
    return mgt_parse_int(s, out);
}

static int one_float(const char *s, void *out) {
    return mgt_parse_float(s, out);
}

int mgt_parse_int_list(const char *s, int *v, int max) {
    return parse_list(s, v, sizeof *v, max, one_int);
}

int mgt_parse_float_list(const char *s, float *v, int max) {
    return parse_list(s, v, sizeof *v, max, one_float);
}

static const char *act_names[] = {"none",    "relu", "sigmoid",  "tanh",
                                  "softmax", "gelu", "gelu_tanh"};
enum { NACTS = sizeof act_names / sizeof act_names[0] };
_Static_assert(NACTS == MGT_ACT_GELU_TANH + 1, "one name per activation of backend.h");

int mgt_parse_act(const char *s, mgt_act *a) {
    for (int i = 0; i < NACTS; i++)
        if (!strcasecmp(s, act_names[i])) {
            *a = (mgt_act)i;
            return 0;
        }
    if (!strcasecmp(s, "linear")) { /* Keras' name for none */
        *a = MGT_ACT_NONE;
        return 0;
    }
    return -1;
}

const char *mgt_act_name(mgt_act a) { return (unsigned)a < NACTS ? act_names[a] : "?"; }

int mgt_check_name(const char *s, mgt_err *err) {
    size_t n = strlen(s);
    if (n == 0 || n > 63)
        return mgt_errf(err, "a name has 1 to 63 characters");
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '_' && s[i] != '-' && s[i] != '.')
            return mgt_errf(err, "use letters, digits, '_', '-' or '.' only");
    return 0;
}

/* Optimal-string-alignment distance: insertions, deletions, substitutions and swaps of two
 * neighbours ("adma" -> "adam") each cost 1; letters compare case-insensitively. */
static int edit_distance(const char *a, const char *b) {
    int la = (int)strlen(a), lb = (int)strlen(b);
    if (la > 63 || lb > 63)
        return 99;
    int d[64][64];
    for (int i = 0; i <= la; i++)
        d[i][0] = i;
    for (int j = 0; j <= lb; j++)
        d[0][j] = j;
    for (int i = 1; i <= la; i++)
        for (int j = 1; j <= lb; j++) {
            int ca = tolower((unsigned char)a[i - 1]), cb = tolower((unsigned char)b[j - 1]);
            int best = d[i - 1][j - 1] + (ca != cb);
            if (d[i - 1][j] + 1 < best)
                best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best)
                best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && ca == tolower((unsigned char)b[j - 2]) &&
                tolower((unsigned char)a[i - 2]) == cb && d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[la][lb];
}

const char *mgt_nearest(const char *s, const char *const *cands, int n) {
    const char *best = NULL;
    int bd = 1 << 30;
    for (int i = 0; i < n; i++) {
        int d = edit_distance(s, cands[i]);
        /* A prefix ("--epoch" for "--epochs") counts as close. */
        if (strlen(s) >= 3 && !strncmp(cands[i], s, strlen(s)))
            d = 1;
        if (d < bd) {
            bd = d;
            best = cands[i];
        }
    }
    int len = (int)strlen(s);
    int limit = len <= 4 ? 1 : len <= 8 ? 2 : 3;
    return bd <= limit ? best : NULL;
}
