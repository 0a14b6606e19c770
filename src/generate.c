/* generate.c: sampling from a language model with a key/value cache (see generate.h). */
#include "generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "parse.h"

/* What the decoder keeps per layer: its output row, and an attention layer's cache. */
typedef struct dec_layer {
    float *y, *pre; /* [out.c]; a GELU dense layer's product */
    float *kc, *vc; /* attention: [context][C] keys and values */
} dec_layer;

typedef struct dec {
    mgt_model *m;
    mgt_backend *be;
    dec_layer *l;
    float *id;    /* the position's token id, as the embedding reads it */
    float *stats; /* a layer norm's mean and 1/std of the row */
} dec;

static const char *const runs[] = {"embedding", "layernorm", "dense",      "attention",
                                   "add",       "dropout",   "activation", NULL};

static int supported(const mgt_layer *l) {
    for (int i = 0; runs[i]; i++)
        if (!strcmp(l->type->name, runs[i]))
            return 1;
    return 0;
}

static float *param(const mgt_model *m, int i) {
    return i < 0 ? NULL : m->w + m->params[i].offset;
}

/* The row of layer l's input k (the token id for the model's input). */
static const float *input_row(const dec *d, const mgt_layer *l, int k) {
    return l->inputs[k] < 0 ? d->id : d->l[l->inputs[k]].y;
}

/* One position p through every layer: the last layer's row holds its logits after. */
static void step(dec *d, int p, int token) {
    mgt_model *m = d->m;
    mgt_backend *be = d->be;
    const mgt_ops *o = be->ops;
    const float idf = (float)token;
    o->to_device(be, d->id, &idf, sizeof idf);
    for (int i = 0; i < m->nlayers; i++) {
        const mgt_layer *l = &m->layers[i];
        dec_layer *dl = &d->l[i];
        const float *x = input_row(d, l, 0);
        const char *t = l->type->name;
        const int c = l->out.c, in = l->in.c;
        if (!strcmp(t, "embedding")) {
            const float *wpe = param(m, l->param[1]);
            o->embed_fwd(be, 1, 1, c, m->vocab, x, param(m, l->param[0]),
                         wpe ? wpe + (size_t)p * c : NULL, dl->y);
        } else if (!strcmp(t, "layernorm")) {
            o->layernorm_fwd(be, 1, c, l->cfg.epsilon, x, param(m, l->param[0]),
                             param(m, l->param[1]), dl->y, d->stats, d->stats + 1);
        } else if (!strcmp(t, "dense")) {
            const int tied = l->tied >= 0;
            const float *w = tied ? param(m, l->tied) : param(m, l->param[0]);
            const float *b = param(m, l->param[tied ? 0 : 1]);
            const mgt_act act = l->fused_act ? MGT_ACT_NONE : l->act;
            const int gelu = mgt_act_bwd_reads_x(act);
            if (l->cfg.w_in_out) {
                o->dense_io_fwd(be, 1, in, c, gelu ? act : MGT_ACT_NONE, x, w, b, dl->pre, dl->y);
                if (!gelu && act != MGT_ACT_NONE)
                    o->act_fwd(be, act, 1, c, dl->y, dl->y);
            } else {
                o->dense_fwd(be, 1, in, c, x, w, b, dl->y);
                if (act != MGT_ACT_NONE)
                    o->act_fwd(be, act, 1, c, dl->y, dl->y);
            }
        } else if (!strcmp(t, "attention")) { /* x: this position's q, k, v */
            o->copy(be, dl->kc + (size_t)p * c, x + c, sizeof(float) * (size_t)c);
            o->copy(be, dl->vc + (size_t)p * c, x + 2 * c, sizeof(float) * (size_t)c);
            o->attn_decode(be, c, l->cfg.heads, p, x, dl->kc, dl->vc, dl->y);
        } else if (!strcmp(t, "add")) {
            o->add2(be, (size_t)c, x, input_row(d, l, 1), dl->y);
            for (int k = 2; k < l->ninputs; k++)
                o->add2(be, (size_t)c, dl->y, input_row(d, l, k), dl->y);
        } else if (!strcmp(t, "activation")) {
            o->act_fwd(be, l->act, 1, c, x, dl->y);
        } else { /* dropout: none outside training */
            o->copy(be, dl->y, x, sizeof(float) * (size_t)c);
        }
        if (strcmp(t, "dense") && strcmp(t, "activation") && l->type->has_act &&
            l->act != MGT_ACT_NONE)
            o->act_fwd(be, l->act, 1, c, dl->y, dl->y);
    }
}

/* The next token from the logits (host memory, v of them). */
static int sample(float *logits, int v, const mgt_generate_opts *o, uint64_t key, int64_t n,
                  float *sorted) {
    int best = 0;
    for (int j = 1; j < v; j++)
        best = logits[j] > logits[best] ? j : best;
    if (!(o->temperature > 0))
        return best;
    float cut = -INFINITY; /* the k-th largest logit: the tokens below it are left out */
    if (o->top_k > 0 && o->top_k < v) {
        memcpy(sorted, logits, sizeof(float) * (size_t)v);
        int lo = 0, hi = v - 1, k = o->top_k - 1; /* quickselect, descending */
        while (lo < hi) {
            const float piv = sorted[(lo + hi) / 2];
            int i = lo, j = hi;
            while (i <= j) {
                while (sorted[i] > piv)
                    i++;
                while (sorted[j] < piv)
                    j--;
                if (i <= j) {
                    const float t = sorted[i];
                    sorted[i++] = sorted[j];
                    sorted[j--] = t;
                }
            }
            if (k <= j)
                hi = j;
            else if (k >= i)
                lo = i;
            else
                break;
        }
        cut = sorted[k];
    }
    double sum = 0;
    const double top = logits[best];
    for (int j = 0; j < v; j++)
        sum += logits[j] >= cut ? exp((logits[j] - top) / o->temperature) : 0.0;
    double u = (double)mgt_uniform(key, (uint64_t)n) * sum;
    for (int j = 0; j < v; j++) {
        if (logits[j] < cut)
            continue;
        u -= exp((logits[j] - top) / o->temperature);
        if (u < 0)
            return j;
    }
    return best;
}

/* The prompt as tokens: its bytes, or the ids it lists. */
static int prompt_tokens(const mgt_model *m, const char *prompt, int **out, int *n, mgt_err *err) {
    const size_t len = strlen(prompt);
    int *t = malloc(sizeof *t * (len + 1));
    int k = 0;
    if (!t)
        return mgt_errf(err, "out of host memory for the prompt");
    if (m->vocab == 256) {
        for (size_t i = 0; i < len; i++)
            t[k++] = (unsigned char)prompt[i];
    } else {
        for (const char *s = prompt; *s;) {
            while (*s == ' ' || *s == ',' || *s == '\t' || *s == '\n')
                s++;
            if (!*s)
                break;
            char *end;
            const long v = strtol(s, &end, 10);
            if (end == s || v < 0 || v >= m->vocab) {
                free(t);
                return mgt_errf(err,
                                "--prompt: model %s has a vocabulary of %d tokens (not bytes): "
                                "give the prompt as token ids from 0 to %d, separated by spaces "
                                "or commas, e.g. --prompt \"464 2068 7586\"",
                                m->name, m->vocab, m->vocab - 1);
            }
            t[k++] = (int)v;
            s = end;
        }
    }
    if (k == 0) {
        free(t);
        return mgt_errf(err, "--prompt is empty: give at least one %s",
                        m->vocab == 256 ? "character" : "token id");
    }
    *out = t;
    *n = k;
    return 0;
}

static void put_token(FILE *out, const mgt_model *m, int t, int first) {
    if (m->vocab == 256)
        fputc(t, out);
    else
        fprintf(out, first ? "%d" : " %d", t);
}

int mgt_generate(mgt_model *m, const mgt_generate_opts *o, FILE *out, mgt_err *err) {
    mgt_backend *be = m->be;
    const mgt_ops *ops = be->ops;
    if (m->vocab <= 0 || m->labels_per_sample <= 1)
        return mgt_errf(err,
                        "generate samples from a language model ([input] context and "
                        "vocab, a sequence of logits out); %s is not one",
                        m->name);
    for (int i = 0; i < m->nlayers; i++)
        if (!supported(&m->layers[i]))
            return mgt_errf(err,
                            "generate runs embedding, layernorm, dense, attention, add, dropout "
                            "and activation layers; layer %s (%s) is none of them",
                            m->layers[i].name, m->layers[i].type->name);
    if (!ops->attn_decode)
        return mgt_errf(err,
                        "generate: the %s backend has no attention for one position; use "
                        "--device cpu",
                        ops->name);
    int *tok = NULL, np = 0;
    if (prompt_tokens(m, o->prompt, &tok, &np, err) < 0)
        return -1;
    const int T = m->input.w, V = m->vocab;
    if (ops->reserve(be, sizeof(float) * (size_t)T) < 0) { /* attn_decode's weights */
        free(tok);
        return mgt_errf(err, "out of memory for the attention's weights of %d positions", T);
    }
    dec d = {.m = m, .be = be, .l = calloc((size_t)m->nlayers, sizeof(dec_layer))};
    int64_t total = np + o->max_new;
    int *seq = malloc(sizeof *seq * (size_t)total);
    float *logits = malloc(sizeof(float) * (size_t)V), *sorted = malloc(sizeof(float) * (size_t)V);
    int ok = d.l && seq && logits && sorted && (d.id = ops->alloc(be, sizeof(float))) &&
             (d.stats = ops->alloc(be, 2 * sizeof(float)));
    for (int i = 0; ok && i < m->nlayers; i++) {
        const mgt_layer *l = &m->layers[i];
        dec_layer *dl = &d.l[i];
        ok = (dl->y = ops->alloc(be, sizeof(float) * (size_t)l->out.c)) &&
             (dl->pre = ops->alloc(be, sizeof(float) * (size_t)l->out.c));
        if (ok && !strcmp(l->type->name, "attention"))
            ok = (dl->kc = ops->alloc(be, sizeof(float) * (size_t)T * l->out.c)) &&
                 (dl->vc = ops->alloc(be, sizeof(float) * (size_t)T * l->out.c));
    }
    int rc = 0;
    if (!ok)
        rc = mgt_errf(err, "out of memory for generation's buffers and caches");
    const uint64_t key = mgt_key3(o->seed, 0x47454e45ULL /* "GENE" */, 0);
    int64_t n = 0, p = 0; /* tokens in seq; the next position */
    for (int i = 0; i < np && rc == 0; i++) {
        seq[n++] = tok[i];
        put_token(out, m, tok[i], i == 0);
    }
    /* the prompt, position by position (its start cut to the context), then one token a step */
    int64_t from = n > T ? n - T : 0;
    for (int64_t g = 0; rc == 0 && g < o->max_new; g++) {
        for (; from < n; from++) {
            if (p == T) { /* the context is full: its last half again, from position 0 */
                from = n - T / 2;
                p = 0;
            }
            step(&d, (int)p++, seq[from]);
        }
        ops->to_host(be, logits, d.l[m->nlayers - 1].y, sizeof(float) * (size_t)V);
        const int next = sample(logits, V, o, key, g, sorted);
        seq[n++] = next;
        put_token(out, m, next, 0);
        fflush(out);
    }
    if (rc == 0 && m->vocab != 256)
        fputc('\n', out);
    for (int i = 0; d.l && i < m->nlayers; i++) {
        ops->free(be, d.l[i].y);
        ops->free(be, d.l[i].pre);
        ops->free(be, d.l[i].kc);
        ops->free(be, d.l[i].vc);
    }
    ops->free(be, d.id);
    ops->free(be, d.stats);
    free(d.l);
    free(seq);
    free(logits);
    free(sorted);
    free(tok);
    return rc;
}
