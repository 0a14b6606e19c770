/* test_layer_cost.c: each layer's FLOPs and bytes (src/layer_cost.c), against counts written out
 * here by hand for a small graph, and the floors and the memory estimate built on them.
 *
 * The graph has a first convolution (no input gradient: its input is the model's), a strided
 * "same" convolution, a batch norm, a separable convolution, a residual sum whose input has two
 * consumers (the gradient summed once), a max pool, global average pooling and a dense layer.
 * Every count is recomputed from the layer's own geometry with the rules layer_cost.h states,
 * so a change of rule, or of a layer's geometry, fails here. */
#include <math.h>
#include <string.h>

#include "layer_cost.h"
#include "model.h"
#include "tally.h"
#include "train_cfg.h"

static const char *text =
    "[input]\nshape = 8,8,3\n"
    "[conv2d]\nname = c1\nfilters = 4\nkernel = 3\npadding = same\nactivation = relu\n"
    "[conv2d]\nname = c2\nfilters = 6\nkernel = 2\nstride = 2\npadding = same\n"
    "[batchnorm]\nname = bn\n"
    "[separable_conv2d]\nname = s1\nfilters = 6\nkernel = 3\npadding = same\nactivation = relu\n"
    "[add]\nname = r\ninputs = s1, bn\n"
    "[maxpool]\nname = p\nsize = 2\n"
    "[global_avgpool]\nname = g\n"
    "[dense]\nname = out\nunits = 5\n"
    "[train]\noptimizer = adam\nloss = sparse_categorical_crossentropy\nbatch_size = 4\n";

enum { N = 4 };

/* Relative agreement to double rounding (the counts are sums of a few exact products). */
static int near(double a, double b) {
    return fabs(a - b) <= 1e-12 * (fabs(b) > 1 ? fabs(b) : 1);
}

static mgt_cost fwd_of(const mgt_model *m, int i, int e) {
    mgt_cost f, b;
    mgt_layer_cost(m, i, N, e, &f, &b);
    return f;
}

static mgt_cost bwd_of(const mgt_model *m, int i, int e) {
    mgt_cost f, b;
    mgt_layer_cost(m, i, N, e, &f, &b);
    return b;
}

/* Fusion groups (fuse.c): b + a (batchnorm, ReLU) and b2 + s + r (batchnorm, residual sum of
 * a, ReLU): each counted at its last layer, one pass each way, nothing at the others. */
static const char *grouped =
    "[input]\nshape = 4,4,2\n"
    "[conv2d]\nname = c\nfilters = 3\nkernel = 1\n"
    "[batchnorm]\nname = b\n"
    "[activation]\nname = a\ntype = relu\n"
    "[conv2d]\nname = c2\nfilters = 3\nkernel = 1\n"
    "[batchnorm]\nname = b2\n"
    "[add]\nname = s\ninputs = b2, a\n"
    "[activation]\nname = r\ntype = relu\n"
    "[global_avgpool]\nname = g\n"
    "[dense]\nname = out\nunits = 5\n"
    "[train]\noptimizer = sgd\nloss = sparse_categorical_crossentropy\nbatch_size = 4\n";

static void test_groups(tally *t) {
    mgt_model m;
    mgt_train_cfg train;
    mgt_err e;
    if (mgt_model_file_parse(&m, &train, "groups.cfg", grouped, &e) < 0) {
        fprintf(stderr, "%s\n", e.msg);
        CHECK(t, 0);
        return;
    }
    const double X = N * 4 * 4 * 3, C = 3;
    for (int i = 0; i < 7; i++)
        if (i == 1 || i == 4 || i == 5) { /* b, b2, s: inside a group */
            const mgt_cost f = fwd_of(&m, i, 4), b = bwd_of(&m, i, 4);
            CHECK(t, f.bytes == 0 && f.flops == 0 && b.bytes == 0 && b.flops == 0);
        }
    /* b + a: x read, y written; backward x and dy read, dx written (c has weights) */
    mgt_cost f = fwd_of(&m, 2, 4), b = bwd_of(&m, 2, 4);
    CHECK(t, near(f.bytes, 4 * 2 * X + 16 * C) && near(f.flops, 7 * X));
    CHECK(t, near(b.bytes, 4 * 3 * X + 16 * C) && near(b.flops, 11 * X));
    CHECK(t, near(fwd_of(&m, 2, 2).bytes, 2 * 2 * X + 16 * C));
    /* b2 + s + r: x and the residual read, y written; backward x, dy and y (the ReLU's mask)
     * read, dx and the residual's gradient written (the first of a's two) */
    f = fwd_of(&m, 6, 4), b = bwd_of(&m, 6, 4);
    CHECK(t, near(f.bytes, 4 * 3 * X + 16 * C) && near(f.flops, 8 * X));
    CHECK(t, near(b.bytes, 4 * 5 * X + 16 * C) && near(b.flops, 12 * X));
    char kind[320];
    mgt_layer_label(&m, 1, kind, sizeof kind);
    CHECK(t, !strcmp(kind, "batchnorm (runs in a)"));
    mgt_layer_label(&m, 6, kind, sizeof kind);
    CHECK(t, !strcmp(kind, "activation (group: b2 + s + r)"));
    mgt_layer_label(&m, 3, kind, sizeof kind);
    CHECK(t, !strcmp(kind, "conv2d"));
    /* without fusion each layer counts its own pass */
    m.no_fusion = 1;
    CHECK(t, near(fwd_of(&m, 1, 4).bytes, 4 * 2 * X + 16 * C) && fwd_of(&m, 5, 4).bytes > 0);
    mgt_model_free(&m);
}

/* A GPT of one block at its smallest: the embedding with its table tied to the head, layer norm,
 * the fused QKV, causal attention, a GELU dense layer on [in][out] weights, the head. */
static const char *gpt =
    "[input]\ncontext = 6\nvocab = 10\n"
    "[embedding]\nname = e\nunits = 8\n"
    "[layernorm]\nname = ln\n"
    "[dense]\nname = qkv\nunits = 24\nweight_layout = in_out\n"
    "[attention]\nname = at\nheads = 2\n"
    "[dense]\nname = fc\nunits = 32\nweight_layout = in_out\nactivation = gelu_tanh\n"
    "[dense]\nname = pr\nunits = 8\nweight_layout = in_out\n"
    "[dense]\nname = head\nunits = 10\nuse_bias = false\ntied = e.wte.weight\n"
    "[train]\noptimizer = adamw\nloss = sparse_categorical_crossentropy\nbatch_size = 4\n";

static void test_seq(tally *t) {
    mgt_model m;
    mgt_train_cfg train;
    mgt_err e;
    if (mgt_model_file_parse(&m, &train, "gpt.cfg", gpt, &e) < 0) {
        fprintf(stderr, "%s\n", e.msg);
        CHECK(t, 0);
        return;
    }
    const double T = 6, C = 8, Y = N * T * C;
    /* embedding: forward reads a token row and a position row a position (float32) and the ids,
     * writes y; backward reads dy and the ids, adds into the token rows (read and written),
     * writes the position table's gradient, and does not clear the token table's: the tied head
     * wrote it first */
    mgt_cost f = fwd_of(&m, 0, 4), b = bwd_of(&m, 0, 4);
    CHECK(t, near(f.bytes, 4 * Y + 8 * Y + 4 * N * T) && near(f.flops, Y));
    CHECK(t, near(b.bytes, 4 * Y + 8 * Y + 4 * N * T + 4 * T * C) && near(b.flops, 2 * Y));
    /* attention: T (T + 1) / 2 causal pairs a head, d = 4: two products a pair forward (and an
     * exponential, 4 flops), five backward (and 6 flops) */
    const double pairs = N * 2 * T * (T + 1) / 2, d = 4;
    f = fwd_of(&m, 3, 4), b = bwd_of(&m, 3, 4);
    CHECK(t, near(f.mma, 4 * pairs * d) && near(f.flops, 4 * pairs * d + 4 * pairs));
    CHECK(t, near(b.mma, 10 * pairs * d) && near(b.flops, 10 * pairs * d + 6 * pairs));
    CHECK(t, near(f.bytes, 4 * (3 * Y + Y) + 4 * N * 2 * T));
    CHECK(t, near(b.bytes, 4 * (3 * Y + 2 * Y + 3 * Y) + 4 * N * 2 * T));
    /* the GELU dense layer writes its product (kept for backward) beside y */
    const double Yf = N * T * 32, Pf = 8 * 32 + 32;
    f = fwd_of(&m, 4, 4);
    CHECK(t, near(f.mma, 2 * N * T * 8 * 32) && near(f.bytes, 4 * (Y + 2 * Yf) + 4 * Pf));
    mgt_model_free(&m);
}

int main(void) {
    tally t = {0, 0};
    mgt_model m;
    mgt_train_cfg train;
    mgt_err e;
    if (mgt_model_file_parse(&m, &train, "cost.cfg", text, &e) < 0) {
        fprintf(stderr, "%s\n", e.msg);
        return 1;
    }
    /* c1: 8x8x3 -> 8x8x4, 3x3; bias and relu; no input gradient */
    {
        const double mac = (double)N * 8 * 8 * 4 * 3 * 3 * 3, Y = N * 8 * 8 * 4, X = N * 8 * 8 * 3;
        const double P = 4 * 3 * 3 * 3 + 4;
        const mgt_cost f = fwd_of(&m, 0, 4), b = bwd_of(&m, 0, 4);
        CHECK(&t, near(f.mma, 2 * mac) && near(f.flops, 2 * mac + Y + Y));
        CHECK(&t, near(f.bytes, 4 * (X + Y) + 4 * P));
        /* backward: dW only (2 mac), db (Y), relu' (Y); reads dy, x, y; writes dW, db */
        CHECK(&t, near(b.mma, 2 * mac) && near(b.flops, 2 * mac + Y + Y));
        CHECK(&t, near(b.bytes, 4 * (Y + X) + 8 * P + 4 * Y));
        const mgt_cost h = fwd_of(&m, 0, 2); /* bf16 activations: half their bytes */
        CHECK(&t, near(h.bytes, 2 * (X + Y) + 4 * P));
    }
    /* c2: 8x8x4 -> 4x4x6, 2x2 stride 2; its input gradient is needed (c1 has weights) */
    {
        const double mac = (double)N * 4 * 4 * 6 * 2 * 2 * 4, Y = N * 4 * 4 * 6, X = N * 8 * 8 * 4;
        const double P = 6 * 4 * 2 * 2 + 6;
        const mgt_cost b = bwd_of(&m, 1, 4);
        CHECK(&t, near(b.mma, 4 * mac) && near(b.flops, 4 * mac + Y));
        CHECK(&t, near(b.bytes, 4 * (Y + X + X) + 8 * P));
    }
    /* bn: 4x4x6 read and written; its output feeds s1 and r: the add's gradient is the sum's */
    {
        const double X = N * 4 * 4 * 6;
        const mgt_cost f = fwd_of(&m, 2, 4), b = bwd_of(&m, 2, 4);
        CHECK(&t, near(f.bytes, 4 * 2 * X + 4 * 4 * 6));
        CHECK(&t, near(b.bytes, 4 * 3 * X + 4 * 4 * 6));
    }
    /* s1: depthwise 3x3 on 6 channels (ordinary cores) then pointwise 6 -> 6 (matrix unit) */
    {
        const double dmac = (double)N * 4 * 4 * 6 * 3 * 3, pmac = (double)N * 4 * 4 * 6 * 6;
        const double Y = N * 4 * 4 * 6;
        const mgt_cost f = fwd_of(&m, 3, 4);
        CHECK(&t, near(f.mma, 2 * pmac) && near(f.flops, 2 * (dmac + pmac) + Y + Y));
        /* its input (bn's output) has a second consumer, the add, which runs backward first:
         * s1 adds its share into the gradient the add wrote, reading it once more */
        const mgt_cost b = bwd_of(&m, 3, 4);
        const double P = 6 * 9 + 6 * 6 + 6;
        CHECK(&t, near(b.bytes, 4 * (Y + Y + Y + Y) + 8 * P + 4 * Y));
    }
    /* r: the sum's gradient is dy itself: nothing moves */
    {
        const mgt_cost b = bwd_of(&m, 4, 4);
        CHECK(&t, b.bytes == 0 && b.flops == 0);
    }
    /* dense: 6 -> 5 */
    {
        const mgt_cost f = fwd_of(&m, 7, 4);
        CHECK(&t, near(f.mma, 2.0 * N * 6 * 5));
    }
    /* floors: bytes or FLOPs, whichever takes longer, at the H200's reached rates by default
     * (4.3 TB/s, BF16 790 TFLOP/s), an H100's by its name, and a copy rate measured on the
     * device in place of the table's */
    {
        mgt_rates r, h100, other, x;
        CHECK(&t,
              mgt_rates_for(NULL, "bf16", 0, &r) == 0 && mgt_rates_for("", "tf32", 0, &x) == 0 &&
                  mgt_rates_for(NULL, "fp32", 0, &x) == 0 && mgt_rates_for(NULL, "x", 0, &x) == -1);
        CHECK(&t, strstr(r.name, "H200") != NULL && strstr(r.name, "4.30 TB/s") != NULL);
        const mgt_cost big_math = {.flops = 1e12, .mma = 1e12, .bytes = 1e6};
        const mgt_cost big_mem = {.flops = 1e6, .mma = 0, .bytes = 3e9};
        int mem = -1;
        CHECK(&t, near(mgt_cost_floor(&big_math, &r, &mem), 1e12 / 790e12) && mem == 0);
        CHECK(&t, near(mgt_cost_floor(&big_mem, &r, &mem), 3e9 / 4.3e12) && mem == 1);
        CHECK(&t, mgt_rates_for("NVIDIA H100 80GB HBM3", "bf16", 0, &h100) == 0 &&
                      near(mgt_cost_floor(&big_mem, &h100, &mem), 3e9 / 3.0e12));
        CHECK(&t, mgt_rates_for("NVIDIA H200", "bf16", 4.0e12, &r) == 0 &&
                      near(mgt_cost_floor(&big_mem, &r, &mem), 3e9 / 4.0e12) &&
                      strstr(r.name, "measured") != NULL);
        CHECK(&t,
              mgt_rates_for("Emulated GPU 0", "tf32", 1e11, &other) == 0 &&
                  strstr(other.name, "Emulated GPU 0 (arithmetic rates unknown") == other.name &&
                  near(mgt_cost_floor(&big_math, &other, &mem), 1e12 / 390e12));
    }
    /* the update: Adam reads w, g, m, v and writes w, m, v */
    {
        const mgt_optim_cfg opt = mgt_train_optim(&train);
        const mgt_cost u = mgt_update_cost(&m, &opt);
        CHECK(&t, near(u.bytes, 4.0 * 7 * (double)m.param_count));
    }
    /* the memory estimate: its parts add up, and its arena is the plan's */
    {
        mgt_mem_estimate me;
        const mgt_optim_cfg opt = mgt_train_optim(&train);
        if (mgt_memory_estimate(&m, N, 0, 0, &opt, train.accum_steps, &me) == 0) {
            mgt_plan p;
            CHECK(&t, mgt_model_plan(&m, N, 1, &p, &e) == 0);
            CHECK(&t, me.act == (double)p.arena && me.workspace > 0);
            CHECK(&t, near(me.total, me.act + me.params + me.batch + me.workspace + me.other));
            CHECK(&t, near(me.params, 4.0 * (4 * (double)m.param_count + (double)m.buffer_count) +
                                          4.0 * 4 * 6));
            mgt_plan_free(&p);
        } else {
            printf("memory estimate: no GPU backend in this build, not checked\n");
        }
    }
    /* the memory estimate with bf16 activations: the plan of 2-byte values */
    {
        mgt_mem_estimate me;
        const mgt_optim_cfg opt = mgt_train_optim(&train);
        if (mgt_memory_estimate(&m, N, 1, 0, &opt, train.accum_steps, &me) == 0) {
            mgt_model half = m;
            half.act_bytes = 2;
            mgt_plan p, q;
            CHECK(&t, mgt_model_plan(&half, N, 1, &p, &e) == 0 &&
                          mgt_model_plan(&m, N, 1, &q, &e) == 0);
            CHECK(&t, me.act == (double)p.arena && p.arena < q.arena);
            mgt_plan_free(&p);
            mgt_plan_free(&q);
        }
    }
    mgt_model_free(&m);
    test_groups(&t);
    test_seq(&t);
    printf("test_layer_cost: %d checks passed%s\n", t.pass, t.fail ? "" : "");
    if (t.fail)
        fprintf(stderr, "test_layer_cost: %d checks FAILED\n", t.fail);
    return t.fail ? 1 : 0;
}
