/* clip.c: gradient clipping (see clip.h): its keys, and the backend calls between the
 * all-reduce and the update. */
#include "clip.h"

#include <string.h>

#include "parse.h"

static const char *const keys[] = {"clip_norm", "clip_value"};

const char *mgt_clip_key_at(int i) {
    return i >= 0 && i < (int)(sizeof keys / sizeof keys[0]) ? keys[i] : NULL;
}

int mgt_clip_set(mgt_clip_cfg *c, const char *key, const char *v, mgt_err *err) {
    float *at = !strcmp(key, "clip_norm") ? &c->norm : !strcmp(key, "clip_value") ? &c->value : 0;
    if (!at)
        return 0;
    float x;
    if (mgt_parse_float(v, &x) < 0 || x < 0)
        return mgt_errf(err, "%s = %s: expected a positive number (0: off), e.g. %s = %s", key, v,
                        key, at == &c->norm ? "1.0" : "0.5");
    *at = x;
    return 1;
}

int mgt_clip_init(mgt_clip *c, const mgt_clip_cfg *cfg, mgt_backend *be, mgt_err *err) {
    memset(c, 0, sizeof *c);
    c->cfg = *cfg;
    if (cfg->norm > 0 && !(c->work = be->ops->alloc(be, 2 * sizeof(double))))
        return mgt_errf(err, "out of %s memory for gradient clipping", be->ops->name);
    return 0;
}

void mgt_clip_apply(mgt_clip *c, mgt_backend *be, float *g, size_t count, int64_t global_n) {
    const double n = global_n > 0 ? (double)global_n : 1.0;
    if (c->cfg.value > 0)
        be->ops->clip_value(be, count, g, (float)(c->cfg.value * n));
    if (c->cfg.norm > 0)
        be->ops->clip_norm(be, count, g, c->cfg.norm * n, c->work);
}

void mgt_clip_free(mgt_clip *c, mgt_backend *be) {
    if (c->work)
        be->ops->free(be, c->work);
    memset(c, 0, sizeof *c);
}
