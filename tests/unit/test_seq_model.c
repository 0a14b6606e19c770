/* test_seq_model.c: a GPT-2-shaped language model on the CPU backend: two blocks written once in
 * a [repeat], an output layer tied to the token embedding, GELU in the MLP.
 *
 *   - the model file: {i} and {input} expanded per block into Hugging Face's names, the tied
 *     layer without a tensor of its own, the parameter count GPT-2's formula gives;
 *   - the gradient of the loss (each sample's mean over its positions of the next token's
 *     cross-entropy) w.r.t. every tensor against central finite differences of the same loss
 *     computed in double from the model's float32 logits (the tied table's gradient is the sum
 *     of both its uses, the embedding's share added to the output layer's);
 *   - the planned model against one whose every tensor has its own memory, and two lanes
 *     against one: the same loss and gradients bit for bit;
 *   - the errors of [repeat], [input] context/vocab and the sequence layers, each naming
 *     file:line. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "model.h"
#include "modelstep.h"
#include "tally.h"
#include "train_cfg.h"

enum { T = 9, V = 13, C = 8, BATCH = 3 };

static const char *gpt_text =
    "[input]\ncontext = 9\nvocab = 13\n"
    "[embedding]\nname = transformer\nunits = 8\n"
    "[repeat]\ncount = 2\n"
    "[layernorm]\nname = transformer.h.{i}.ln_1\n"
    "[dense]\nname = transformer.h.{i}.attn.c_attn\nunits = 24\nweight_layout = in_out\n"
    "[attention]\nname = transformer.h.{i}.attn\nheads = 2\n"
    "[dense]\nname = transformer.h.{i}.attn.c_proj\nunits = 8\nweight_layout = in_out\n"
    "[add]\nname = transformer.h.{i}.res_1\ninputs = transformer.h.{i}.attn.c_proj, {input}\n"
    "[layernorm]\nname = transformer.h.{i}.ln_2\n"
    "[dense]\nname = transformer.h.{i}.mlp.c_fc\nunits = 32\nweight_layout = in_out\n"
    "activation = gelu_tanh\n"
    "[dense]\nname = transformer.h.{i}.mlp.c_proj\nunits = 8\nweight_layout = in_out\n"
    "[add]\nname = transformer.h.{i}.res_2\n"
    "inputs = transformer.h.{i}.mlp.c_proj, transformer.h.{i}.res_1\n"
    "[end]\n"
    "[layernorm]\nname = transformer.ln_f\n"
    "[dense]\nname = lm_head\nunits = 13\nuse_bias = false\ntied = transformer.wte.weight\n"
    "[train]\noptimizer = adam\nloss = sparse_categorical_crossentropy\nbatch_size = 3\n";

static mgt_train_cfg cfg;

static int parse(mgt_model *m, const char *text, mgt_err *e) {
    if (mgt_model_file_parse(m, &cfg, "gpt.cfg", text, e) < 0)
        return -1;
    return mgt_train_apply_loss(&cfg, m, e);
}

/* The model parsed and allocated on be, weights from the seed, one batch of tokens. */
static int make(mgt_model *m, mgt_backend *be, int share) {
    mgt_err e;
    if (parse(m, gpt_text, &e) < 0) {
        fprintf(stderr, "parse: %s\n", e.msg);
        return -1;
    }
    m->no_memory_sharing = !share;
    if (mgt_model_alloc(m, be, BATCH, &e) < 0) {
        fprintf(stderr, "alloc: %s\n", e.msg);
        return -1;
    }
    mgt_model_init_host(m, 7, m->w, m->buf);
    for (size_t i = 0; i < m->param_count; i++) /* layer norms and biases away from 1 and 0 */
        m->w[i] += 0.1f * (2 * mgt_uniform(99, i) - 1);
    for (int i = 0; i < BATCH * T; i++) {
        m->x[i] = (float)(mgt_rand64(5, (uint64_t)i) % V);
        m->labels[i] = (int32_t)(mgt_rand64(6, (uint64_t)i) % V);
    }
    return 0;
}

static double step(mgt_model *m, mgt_backend *be, int backward) {
    return model_step(m, be, BATCH, 1, 1, backward, NULL);
}

/* The loss in double from the model's logits: per sample, the mean over positions of
 * log-sum-exp minus the label's logit; summed over the samples. */
static double loss_double(mgt_model *m, mgt_backend *be) {
    step(m, be, 0);
    const float *y = m->layers[m->nlayers - 1].y;
    double sum = 0;
    for (int r = 0; r < BATCH * T; r++) {
        const float *l = y + (size_t)r * V;
        double mx = l[0], se = 0;
        for (int k = 1; k < V; k++)
            mx = l[k] > mx ? l[k] : mx;
        for (int k = 0; k < V; k++)
            se += exp(l[k] - mx);
        sum += (mx + log(se) - l[m->labels[r]]) / T;
    }
    return sum;
}

/* Central differences (h = 1e-2: truncation ~h^2 = 1e-4 of the O(1) third derivatives, and the
 * float32 forward's rounding, ~1e-6 of the loss, over h: 1e-4) on up to 24 components of each
 * tensor, against its analytic gradient: within 2e-2 of the tensor's largest component (a
 * missing term or a wrong index is off by O(1)). */
static void fd_tensors(tally *t, mgt_model *m, mgt_backend *be) {
    step(m, be, 1);
    float *g = malloc(m->param_count * sizeof(float));
    memcpy(g, m->g, m->param_count * sizeof(float));
    for (int p = 0; p < m->nparams; p++) {
        const mgt_param *q = &m->params[p];
        double scale = 1e-6, worst = 0;
        for (size_t i = 0; i < q->count; i++)
            scale = fabs(g[q->offset + i]) > scale ? fabs(g[q->offset + i]) : scale;
        for (int k = 0; k < 24 && (size_t)k < q->count; k++) {
            const size_t i =
                q->offset +
                (q->count <= 24 ? (size_t)k : mgt_rand64(8, (uint64_t)(p * 100 + k)) % q->count);
            const float old = m->w[i];
            m->w[i] = old + 1e-2f;
            const double up = loss_double(m, be);
            m->w[i] = old - 1e-2f;
            const double down = loss_double(m, be);
            m->w[i] = old;
            const double num = (up - down) / ((double)(old + 1e-2f) - (double)(old - 1e-2f));
            const double err = fabs(num - g[i]) / scale;
            worst = err > worst ? err : worst;
        }
        if (!(worst <= 2e-2))
            fprintf(stderr, "tensor %s: finite differences off by %.3g of its largest gradient\n",
                    q->name, worst);
        CHECK(t, worst <= 2e-2);
    }
    free(g);
}

static int has_param(const mgt_model *m, const char *name, int64_t d0, int64_t d1) {
    for (int i = 0; i < m->nparams; i++)
        if (!strcmp(m->params[i].name, name))
            return m->params[i].shape[0] == d0 &&
                   (m->params[i].ndim == 1 || m->params[i].shape[1] == d1);
    return 0;
}

static void test_file(tally *t) {
    mgt_model m;
    mgt_err e;
    CHECK(t, parse(&m, gpt_text, &e) == 0);
    CHECK(t, m.nlayers == 1 + 2 * 9 + 2);
    CHECK(t, has_param(&m, "transformer.wte.weight", V, C));
    CHECK(t, has_param(&m, "transformer.wpe.weight", T, C));
    CHECK(t, has_param(&m, "transformer.h.1.attn.c_attn.weight", C, 3 * C));
    CHECK(t, has_param(&m, "transformer.h.1.mlp.c_proj.weight", 4 * C, C));
    CHECK(t, has_param(&m, "transformer.ln_f.bias", C, 0));
    CHECK(t, !has_param(&m, "lm_head.weight", V, C));
    /* GPT-2's count with tied embeddings: wte, wpe, per block 12 C^2 + 13 C, the final norm */
    const size_t want = (size_t)V * C + (size_t)T * C + 2 * (12 * C * C + 13 * C) + 2 * C;
    size_t have = 0;
    for (int i = 0; i < m.nparams; i++)
        have += m.params[i].count;
    CHECK(t, have == want);
    /* block 1's first residual sum takes block 0's last layer ({input}) */
    const int r = layer_at(&m, "transformer.h.1.res_1");
    CHECK(t, r >= 0 && m.layers[r].inputs[1] == layer_at(&m, "transformer.h.0.res_2"));
    CHECK(t, m.labels_per_sample == T && m.classes == V);
    mgt_model_free(&m);
}

/* The gradients, finite differences, and the executor's variants bit for bit. */
static void test_grads(tally *t, mgt_backend *be1, mgt_backend *be2) {
    mgt_model a, b, c;
    if (make(&a, be1, 1) || make(&b, be1, 0) || make(&c, be2, 1)) {
        CHECK(t, 0);
        return;
    }
    const double la = step(&a, be1, 1), lb = step(&b, be1, 1), lc = step(&c, be2, 1);
    CHECK(t, la == lb && la == lc);
    CHECK(t, !memcmp(a.g, b.g, a.param_count * sizeof(float)));
    CHECK(t, !memcmp(a.g, c.g, a.param_count * sizeof(float)));
    CHECK(t, a.plan.arena < b.plan.arena);
    /* the loss: the sum over samples of their mean over positions, as the double one */
    const double ld = loss_double(&a, be1);
    CHECK(t, fabs(la - ld) <= 1e-5 * ld);
    fd_tensors(t, &a, be1);
    mgt_model_free(&a);
    mgt_model_free(&b);
    mgt_model_free(&c);
}

/* gpt_text with `from` replaced by `to` (first occurrence), parsed. */
static int parse_edit(const char *from, const char *to, mgt_err *e) {
    const char *at = strstr(gpt_text, from);
    if (!at)
        return 0;
    char text[8192];
    snprintf(text, sizeof text, "%.*s%s%s", (int)(at - gpt_text), gpt_text, to, at + strlen(from));
    mgt_model m;
    const int rc = parse(&m, text, e);
    if (rc == 0)
        mgt_model_free(&m);
    return rc;
}

static void test_errors(tally *t) {
    mgt_err e;
    CHECK_ERR(t, parse_edit("count = 2\n", "", &e), &e, "gpt.cfg:7:", "needs count = N");
    CHECK_ERR(t, parse_edit("count = 2\n", "count = 0\n", &e), &e,
              "gpt.cfg:8:", "count = 0: expected a whole number from 1");
    CHECK_ERR(t, parse_edit("[end]\n", "", &e), &e,
              "gpt.cfg:46:", "[train] inside the [repeat] at line 7", "end it with [end] first");
    CHECK_ERR(t, parse_edit("[end]\n", "[repeat]\n", &e), &e, "repeated blocks do not nest");
    CHECK_ERR(t, parse_edit("[layernorm]\nname = transformer.ln_f\n", "[end]\n", &e), &e,
              "[end] without a [repeat]");
    CHECK_ERR(t, parse_edit("units = 24\n", "units = 25\n", &e), &e,
              "gpt.cfg:15:", "transformer.h.0.attn: gets 25 channels", "3C");
    CHECK_ERR(t, parse_edit("heads = 2\n", "heads = 2\nhead = 2\n", &e), &e,
              "gpt.cfg:18:", "has no key 'head'", "(block 0 of the [repeat] at line 7)");
    CHECK_ERR(t, parse_edit("name = transformer.h.{i}.ln_1", "name = ln_1", &e), &e,
              "layer name 'ln_1' is already used");
    CHECK_ERR(t, parse_edit("vocab = 13\n", "", &e), &e, "gpt.cfg:1:", "has context but no vocab");
    CHECK_ERR(t, parse_edit("context = 9\n", "context = 9\nshape = 2,2,1\n", &e), &e,
              "gives both shape");
    CHECK_ERR(t, parse_edit("tied = transformer.wte.weight", "tied = transformer.wpe.weight", &e),
              &e, "tied = transformer.wpe.weight: a tensor of shape [9, 8]");
    CHECK_ERR(t, parse_edit("tied = transformer.wte.weight", "tied = wte.weight", &e), &e,
              "no layer above it has that tensor");
    CHECK_ERR(t, parse_edit("heads = 2", "heads = 3", &e), &e, "multiple of heads = 3");
    CHECK_ERR(t, parse_edit("use_bias = false\n", "use_bias = false\nactivation = softmax\n", &e),
              &e, "remove its activation = softmax");
    CHECK_ERR(t,
              parse_edit("[layernorm]\nname = transformer.ln_f\n",
                         "[layernorm]\nname = transformer.ln_f\n[activation]\ntype = gelu\n"
                         "[add]\ninputs = activation_1, transformer.ln_f\nactivation = gelu\n",
                         &e),
              &e, "activation = gelu is supported on [dense] and [activation] layers");
}

int main(void) {
    tally t = {0, 0};
    mgt_backend be1, be2;
    if (mgt_cpu_backend_init(&be1, 1) || mgt_cpu_backend_init(&be2, 2))
        return 2;
    test_file(&t);
    test_grads(&t, &be1, &be2);
    test_errors(&t);
    mgt_backend_destroy(&be1);
    mgt_backend_destroy(&be2);
    printf("test_seq_model: %d checks passed, %d failed\n", t.pass, t.fail);
    return t.fail ? 1 : 0;
}
