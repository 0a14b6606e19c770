/* parse.h: strict value parsing and "did you mean" suggestions, for model files and the CLI. */
#ifndef MGT_PARSE_H
#define MGT_PARSE_H

#include <stdint.h>

#include "backend.h"
#include "util.h"

char *mgt_trim(char *s); /* in place; returns s */
/* Whole string must be the number. Return 0 or -1. */
int mgt_parse_i64(const char *s, int64_t *v);
int mgt_parse_int(const char *s, int *v);
int mgt_parse_float(const char *s, float *v); /* finite as a float only */
int mgt_parse_bool(const char *s, int *v);    /* true/false, yes/no, on/off, 1/0 */
/* "28,28,1" -> up to max ints; returns how many, or -1 on a bad item or a list over 255 chars. */
int mgt_parse_int_list(const char *s, int *v, int max);
/* "0.485, 0.456, 0.406" -> up to max floats, the same way. */
int mgt_parse_float_list(const char *s, float *v, int max);
int mgt_parse_act(const char *s, mgt_act *a);
const char *mgt_act_name(mgt_act a);
/* Layer names: letters, digits, '_', '-', '.', at most 63 characters. */
int mgt_check_name(const char *s, mgt_err *err);
/* The candidate closest to s by edit distance, if close enough to be a likely typo; else NULL. */
const char *mgt_nearest(const char *s, const char *const *cands, int n);

#endif
