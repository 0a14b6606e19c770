/* layer_cost.c: each layer type's FLOPs and bytes (layer_cost.h), in one place. */
#include "layer_cost.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu.h"
#include "optim.h"
#include "runtime.h"

/* The GPUs whose rates were measured, the reached figures the floors use and the datasheets'
 * beside them (dense tensor-core rates: half the "with sparsity" ones):
 *   H200 (141 GB HBM3e, 132 SMs): a device-to-device copy of 8.6 GB moved 4.3 TB/s counting the
 *     bytes read and written (datasheet 4.8); an 8192^3 bf16 GEMM through PyTorch 788 TFLOP/s on
 *     random data, 769-798 over several machines (datasheet 990) (measured 2026-10-28 and
 *     2026-11-04);
 *   H100 SXM (80 GB HBM3): the copy about 3.0 TB/s (datasheet 3.35); bf16 754-775, TF32 378-396
 *     (datasheet 495), plain float32 SGEMM 51 TFLOP/s (datasheet 67, at the boost clock)
 *     (bench/results/gpu-2026-11-26-h100).
 * Both are Hopper with the same SMs and clocks: the H200's TF32 and float32 rates are the H100's
 * measured ones. */
static const struct gpu_rates {
    const char *match, *name;
    double copy, bf16, tf32, fp32;
} known[] = {
    {"H200", "NVIDIA H200", 4.3e12, 790e12, 390e12, 51e12},
    {"H100", "NVIDIA H100", 3.0e12, 765e12, 390e12, 51e12},
};

int mgt_rates_for(const char *gpu, const char *precision, double copy_bps, mgt_rates *r) {
    static const char *const names[] = {"fp32", "tf32", "bf16"};
    static const char *const units[] = {"FP32 (no TF32) on the float32 cores", "TF32 tensor cores",
                                        "BF16 tensor cores"};
    int k = 0;
    while (k < 3 && strcmp(precision, names[k]))
        k++;
    if (k == 3)
        return -1;
    const struct gpu_rates *g = &known[0];
    int unknown = 0;
    if (gpu && gpu[0]) {
        size_t i = 0;
        while (i < sizeof known / sizeof known[0] && !strstr(gpu, known[i].match))
            i++;
        unknown = i == sizeof known / sizeof known[0];
        g = unknown ? &known[0] : &known[i];
    }
    r->bw = copy_bps > 0 ? copy_bps : g->copy;
    r->fp32 = g->fp32;
    r->mma = k == 0 ? g->fp32 : k == 1 ? g->tf32 : g->bf16;
    snprintf(r->name, sizeof r->name, "%s%s%s, %s (memory %.2f TB/s, %s)", unknown ? gpu : g->name,
             unknown ? " (arithmetic rates unknown: the H200's taken)" : "",
             gpu && gpu[0] ? "" : " (no GPU named: the one the predictions are for)", units[k],
             r->bw / 1e12,
             copy_bps > 0 ? "a device-to-device copy measured on it now"
                          : "what a large device-to-device copy reaches on one");
    return 0;
}

/* Whether each layer's output gradient is needed (model.c's rule: it or a layer above it has
 * parameters), into ng[0 .. m->nlayers); -1 when out of memory. */
static int *needs_grad(const mgt_model *m) {
    int *ng = malloc(sizeof *ng * (size_t)(m->nlayers > 0 ? m->nlayers : 1));
    for (int i = 0; ng && i < m->nlayers; i++) {
        const mgt_layer *l = &m->layers[i];
        ng[i] = mgt_layer_trains(l);
        for (int k = 0; k < l->ninputs; k++)
            if (l->inputs[k] >= 0 && ng[l->inputs[k]])
                ng[i] = 1;
    }
    return ng;
}

/* Whether input slot k of layer j adds its gradient to one a later consumer wrote (model.c:
 * set_accumulate, which runs only when the model is allocated). */
static int accumulates(const mgt_model *m, int j, int k) {
    const mgt_layer *l = &m->layers[j];
    const int i = l->inputs[k];
    if (i < 0)
        return 0;
    for (int q = 0; q < k; q++)
        if (l->inputs[q] == i)
            return 1;
    for (int q = j + 1; q < m->nlayers; q++)
        for (int r = 0; r < m->layers[q].ninputs; r++)
            if (m->layers[q].inputs[r] == i)
                return 1;
    return 0;
}

static double elems(mgt_shape s) {
    return (double)s.h * s.w * s.c;
}

/* The fusion group layer i runs in (fuse.c), into *g, and whether i is a convolution whose bias
 * a batchnorm cancels, into *cancelled: the model's own once it is allocated, else found now (as
 * the model would find them on its backend, none cancelled without one). Returns the group's
 * index, -1 for none. */
static int group_at(const mgt_model *m, int i, mgt_group *g, int *cancelled) {
    *cancelled = i >= 0 && i < m->nlayers && m->layers[i].bias_cancelled;
    if (m->group_of) {
        const int q = m->group_of[i];
        if (q >= 0)
            *g = m->groups[q];
        return q;
    }
    const size_t L = (size_t)(m->nlayers > 0 ? m->nlayers : 1);
    mgt_group *gs = malloc(sizeof *gs * L);
    int *of = malloc(sizeof *of * L), *bias = malloc(sizeof *bias * L);
    if (!gs || !of || !bias)
        mgt_die("out of host memory for the fusion groups of %d layers", m->nlayers);
    mgt_fuse_find(m, gs, of, bias);
    const int q = of[i];
    if (q >= 0)
        *g = gs[q];
    for (int b = 0; b < m->nlayers; b++)
        *cancelled |= bias[b] == i;
    free(gs), free(of), free(bias);
    return q;
}

int mgt_layer_group(const mgt_model *m, int i, mgt_group *g) {
    int cancelled;
    return group_at(m, i, g, &cancelled);
}

void mgt_layer_label(const mgt_model *m, int i, char *buf, size_t n) {
    const mgt_layer *l = &m->layers[i];
    mgt_group g;
    if (mgt_layer_group(m, i, &g) < 0) {
        snprintf(buf, n, "%s", l->type->name);
    } else if (g.tail != i) {
        snprintf(buf, n, "%s (runs in %s)", l->type->name, m->layers[g.tail].name);
    } else {
        const int part[] = {g.bn, g.add, g.act};
        int len = snprintf(buf, n, "%s (group:", l->type->name);
        for (int k = 0, first = 1; k < 3 && len >= 0 && (size_t)len < n; k++)
            if (part[k] >= 0 && (k == 0 || part[k] != part[k - 1])) {
                len += snprintf(buf + len, n - (size_t)len, "%s%s", first ? " " : " + ",
                                m->layers[part[k]].name);
                first = 0;
            }
        if (len >= 0 && (size_t)len < n)
            snprintf(buf + len, n - (size_t)len, ")");
    }
}

/* A fusion group's passes, counted at its tail (the group's other layers count nothing): one
 * pass forward, the batchnorm's input and the residual read, the tail's output written; backward
 * x and the tail's output gradient read (and the tail's output, where the ReLU's mask comes from
 * it: model.c's mask_from_y), the batchnorm's input gradient and the residual's written (each
 * re-read where it adds to one already there), the batchnorm's statistics and parameters as for
 * a batchnorm alone. */
static void group_cost(const mgt_model *m, const mgt_group *g, const int *ng, double nn, double e,
                       mgt_cost *fwd, mgt_cost *bwd) {
    const mgt_layer *bn = &m->layers[g->bn];
    const double X = nn * elems(bn->in), C = bn->in.c;
    const int relu = g->act >= 0, add = g->add >= 0;
    fwd->flops = 6 * X + (add ? X : 0) + (relu ? X : 0);
    fwd->bytes = e * (X + (add ? X : 0) + X) + 4 * 4 * C;
    bwd->flops = 10 * X + (relu ? X : 0);
    bwd->bytes = e * (X + X + (add && relu ? X : 0)) + 4 * 4 * C;
    const int in = bn->inputs[0];
    if (in >= 0 && ng[in])
        bwd->bytes += e * X * (accumulates(m, g->bn, 0) ? 2 : 1);
    const int r = add ? m->layers[g->add].inputs[g->res] : -1;
    if (r >= 0 && ng[r]) {
        bwd->flops += X;
        bwd->bytes += e * X * (accumulates(m, g->add, g->res) ? 2 : 1);
    }
}

void mgt_layer_cost(const mgt_model *m, int i, int n, int act_bytes, mgt_cost *fwd, mgt_cost *bwd) {
    const mgt_layer *l = &m->layers[i];
    const char *t = l->type->name;
    const double e = act_bytes, nn = n > 0 ? n : 0;
    const double X = nn * elems(l->in), Y = nn * elems(l->out);
    double P = 0; /* its parameters' values (their range in the arena holds alignment too) */
    for (int j = 0; j < 4; j++)
        if (l->param[j] >= 0)
            P += (double)m->params[l->param[j]].count;
    if (l->tied >= 0) /* an output layer on the token table reads it as its weight */
        P += (double)m->params[l->tied].count;
    memset(fwd, 0, sizeof *fwd);
    memset(bwd, 0, sizeof *bwd);
    /* Backward: does it run, and which input gradients does it make. */
    int *ng = needs_grad(m);
    if (!ng)
        mgt_die("out of host memory for the costs of %d layers", m->nlayers);
    const int runs = ng[i];
    mgt_group g;
    int cancelled;
    if (group_at(m, i, &g, &cancelled) >= 0) { /* all of it at the tail, nothing elsewhere */
        if (g.tail == i)
            group_cost(m, &g, ng, nn, e, fwd, bwd);
        if (!runs)
            memset(bwd, 0, sizeof *bwd);
        free(ng);
        return;
    }
    /* a bias a batchnorm cancels is left out, its gradient written as zeros (fuse.c) */
    const int bias = l->cfg.bias && !cancelled;
    double dx = 0, dx_acc = 0; /* input values whose gradient is written, and re-read to add */
    for (int k = 0; k < l->ninputs; k++) {
        const int j = l->inputs[k];
        if (j < 0 || !ng[j])
            continue;
        const double v = nn * elems(mgt_layer_input_shape(m, l, k));
        dx += v;
        dx_acc += accumulates(m, i, k) ? v : 0;
    }
    double xin = 0; /* every input's values */
    for (int k = 0; k < l->ninputs; k++)
        xin += nn * elems(mgt_layer_input_shape(m, l, k));
    /* The layer's own activation: fused into forward; backward reads y (or its sign) once. */
    const int act = l->act != MGT_ACT_NONE && !l->fused_act;
    fwd->flops = act ? Y : 0;

    double mac = 0, mac_mma = 0; /* multiply-adds per pass, and those on the matrix unit */
    if (!strcmp(t, "conv2d")) {
        const mgt_conv_shape s =
            mgt_conv2d_geometry(n, l->in.h, l->in.w, l->in.c, l->cfg.filters, l->cfg.kernel,
                                l->cfg.kernel_w, l->cfg.stride, l->cfg.same);
        mac_mma = (double)s.n * s.oh * s.ow * s.oc * s.kh * s.kw * s.c;
    } else if (!strcmp(t, "dense")) { /* a sequence's: every position, elems(in) = T C */
        mac_mma = nn * elems(l->in) * l->cfg.units;
    } else if (!strcmp(t, "depthwise_conv2d") || !strcmp(t, "separable_conv2d")) {
        const mgt_conv_shape d =
            mgt_conv2d_geometry(n, l->in.h, l->in.w, l->in.c, l->in.c, l->cfg.kernel,
                                l->cfg.kernel_w, l->cfg.stride, l->cfg.same);
        mac = (double)d.n * d.oh * d.ow * d.c * d.kh * d.kw;
        if (t[0] == 's') /* the pointwise 1x1 after it: a product on the matrix unit */
            mac_mma = (double)d.n * d.oh * d.ow * d.c * l->cfg.filters;
    }
    if (mac || mac_mma) { /* the products: y = x * W (+ b) */
        fwd->flops += 2 * (mac + mac_mma) + (bias ? Y : 0);
        fwd->mma = 2 * mac_mma;
        /* a GELU's layer keeps the product for its backward (dense.c): written beside y */
        fwd->bytes = e * (X + Y) + 4 * P + (act && mgt_act_bwd_reads_x(l->act) ? e * Y : 0);
        /* dW (and db) from x and dy; dx from dy and W where needed */
        bwd->flops = 2 * (mac + mac_mma) * (dx > 0 ? 2 : 1) + (bias ? Y : 0);
        bwd->mma = 2 * mac_mma * (dx > 0 ? 2 : 1);
        bwd->bytes = e * (Y + X + dx + dx_acc) + 4 * 2 * P;
    } else if (!strcmp(t, "attention")) {
        /* per head and query, scores against the keys at or before it (causal: T (T + 1) / 2
         * pairs a head, all T^2 otherwise) and the weighted values: two products of d = C /
         * heads multiply-adds a pair, and an exponential (about 4 flops) a pair. Backward
         * recomputes the scores and forms dV, dP, dQ and dK: five products a pair. Bytes: the
         * fused QKV in, the output, one log-sum-exp a head and position; no T x T matrix. */
        const double T = l->out.w, H = l->cfg.heads, d = (double)l->out.c / H;
        const double pairs = nn * H * (l->cfg.causal ? T * (T + 1) / 2 : T * T);
        fwd->flops += 2 * 2 * pairs * d + 4 * pairs;
        fwd->mma = 2 * 2 * pairs * d;
        fwd->bytes = e * (X + Y) + 4 * nn * H * T;
        bwd->flops = 2 * 5 * pairs * d + 6 * pairs;
        bwd->mma = 2 * 5 * pairs * d;
        bwd->bytes = e * (X + 2 * Y + dx + dx_acc) + 4 * nn * H * T;
    } else if (!strcmp(t, "layernorm")) {
        /* mean and variance (two passes over the row), normalise, scale and shift; the row's
         * mean and 1/std kept (8 bytes a row). Backward: x, dy read, dx written, and the two
         * parameter sums over the rows (a second pass over x and dy) */
        const double rows = nn * l->in.h * l->in.w;
        fwd->flops += 8 * X;
        fwd->bytes = e * (X + Y) + 8 * rows + 4 * P;
        bwd->flops = 14 * X;
        bwd->bytes = e * (2 * X + 2 * Y + dx + dx_acc) + 8 * rows + 4 * 2 * P;
    } else if (!strcmp(t, "embedding")) {
        /* a row of the token table and one of the position table per position, added; backward
         * adds dy into the token rows (read and written) and sums it into the position table
         * (written), and clears the token table's gradient first where it writes it: not where an
         * output layer tied to the table (later in the file, so first in backward) wrote it before
         */
        int tied_later = l->grad_accumulate;
        for (int q = i + 1; q < m->nlayers; q++)
            tied_later |= m->layers[q].tied >= 0 && m->layers[q].tied == l->param[0] &&
                          mgt_layer_trains_tied(m, &m->layers[q]);
        const double V = (double)m->params[l->param[0]].count;
        const double Wp = l->param[1] >= 0 ? (double)m->params[l->param[1]].count : 0;
        fwd->flops += Y;
        fwd->bytes = e * Y + 4 * 2 * Y + 4 * X;
        bwd->flops = 2 * Y;
        bwd->bytes = e * Y + 4 * 2 * Y + 4 * X + 4 * Wp + (tied_later ? 0 : 4 * V);
    } else if (!strcmp(t, "batchnorm")) {
        /* statistics and the normalisation: x read, y written; backward x and dy read, dx
         * written (its two channel sums need x and dy too: counted once) */
        fwd->flops += 6 * X;
        fwd->bytes = e * (X + Y) + 4 * 4 * (double)l->in.c;
        bwd->flops = 10 * X;
        bwd->bytes = e * (X + Y + dx + dx_acc) + 4 * 4 * (double)l->in.c;
    } else if (!strcmp(t, "add")) {
        fwd->flops += (double)(l->ninputs - 1) * Y;
        fwd->bytes = e * (xin + Y);
        /* the gradient of a sum is dy itself: shared, nothing moves (adds into an existing
         * gradient still read and write it) */
        bwd->flops = dx_acc;
        bwd->bytes = e * 2 * dx_acc;
    } else if (!strcmp(t, "concat")) {
        fwd->bytes = e * (xin + Y);
        bwd->bytes = e * (dx + dx + dx_acc);
        bwd->flops = dx_acc;
    } else if (!strcmp(t, "maxpool") || !strcmp(t, "avgpool")) {
        const int k = l->cfg.kernel;
        fwd->flops += Y * k * k;
        fwd->bytes = e * (X + Y) + (t[0] == 'm' ? 4 * Y : 0); /* maxpool: the argmax kept */
        bwd->flops = Y * k * k;
        bwd->bytes = e * (Y + dx + dx_acc) + (t[0] == 'm' ? 4 * Y : 0);
    } else if (!strcmp(t, "global_avgpool")) {
        fwd->flops += X;
        fwd->bytes = e * (X + Y);
        bwd->flops = dx;
        bwd->bytes = e * (Y + dx + dx_acc);
    } else { /* element-wise or a copy: activation, dropout, flatten, zeropad */
        fwd->flops += !strcmp(t, "activation") || !strcmp(t, "dropout") ? X : 0;
        fwd->bytes = e * (X + Y);
        bwd->flops = !strcmp(t, "activation") || !strcmp(t, "dropout") ? Y : 0;
        /* an activation layer reads its y (or x) with dy */
        bwd->bytes = e * (Y + dx + dx_acc) + (!strcmp(t, "activation") ? e * Y : 0);
    }
    if (act) { /* backward of the fused activation: y read once more with dy */
        bwd->flops += Y;
        bwd->bytes += e * Y;
    }
    if (!runs)
        memset(bwd, 0, sizeof *bwd);
    free(ng);
}

mgt_cost mgt_loss_cost(const mgt_model *m, int n) { /* a sequence model: every position's */
    const double v = (double)(n > 0 ? n : 0) * m->classes *
                     (m->labels_per_sample > 1 ? m->labels_per_sample : 1);
    return (mgt_cost){.flops = 8 * v, .mma = 0, .bytes = 4 * 2 * v};
}

/* The optimizer's state arenas with its settings (optim.h). */
static int opt_slots(const mgt_optim_cfg *opt) {
    const mgt_optimizer *o = mgt_optimizer_of(opt->optimizer);
    int slots = 0;
    if (o)
        for (int k = 0; k < MGT_OPT_MAX_SLOTS && o->slot_names[k]; k++)
            slots++;
    if (o && o->slots)
        slots = o->slots(&opt->opt);
    return slots;
}

mgt_cost mgt_update_cost(const mgt_model *m, const mgt_optim_cfg *opt) {
    const int slots = opt_slots(opt);
    const double P = (double)m->grad_count; /* the trainable tensors */
    return (mgt_cost){.flops = 4 * P * (1 + slots), .mma = 0, .bytes = 4 * P * (3 + 2 * slots)};
}

double mgt_cost_floor(const mgt_cost *c, const mgt_rates *r, int *mem_bound) {
    const double t_mem = c->bytes / r->bw;
    const double t_math = c->mma / r->mma + (c->flops - c->mma) / r->fp32;
    if (mem_bound)
        *mem_bound = t_mem >= t_math;
    return t_mem > t_math ? t_mem : t_math;
}

/* One row: GFLOP, MB, floor ms and its bound for a pass (a dash where it does not run). */
static void row_cells(const mgt_cost *c, const mgt_rates *r, FILE *f, double *sum) {
    if (c->flops == 0 && c->bytes == 0) {
        fprintf(f, " - | - | - |");
        return;
    }
    int mem;
    const double t = mgt_cost_floor(c, r, &mem);
    *sum += t;
    fprintf(f, " %.3f | %.1f | %.4f %s |", c->flops / 1e9, c->bytes / 1e6, 1e3 * t,
            mem ? "mem" : "math");
}

void mgt_floor_table(const mgt_model *m, int n, int act_bytes, const mgt_rates *r,
                     const mgt_optim_cfg *opt, FILE *f) {
    fprintf(f,
            "Floor of one training step of %s at a batch of %d on %s (%.1f TB/s, %.0f TFLOP/s "
            "matrix, %.0f TFLOP/s float32 cores), activations %d bytes a value. Each pass's floor "
            "is max(bytes / bandwidth, FLOPs / rate); \"mem\" or \"math\" says which.\n\n",
            m->name, n, r->name, r->bw / 1e12, r->mma / 1e12, r->fp32 / 1e12, act_bytes);
    fprintf(f, "| # | layer | type | output | fwd GFLOP | fwd MB | fwd floor ms | bwd GFLOP | "
               "bwd MB | bwd floor ms |\n");
    fprintf(f, "|---|---|---|---|---|---|---|---|---|---|\n");
    double tf = 0, tb = 0;
    mgt_cost sf = {0}, sb = {0};
    for (int i = 0; i < m->nlayers; i++) {
        const mgt_layer *l = &m->layers[i];
        mgt_cost cf, cb;
        mgt_layer_cost(m, i, n, act_bytes, &cf, &cb);
        char kind[320];
        mgt_layer_label(m, i, kind, sizeof kind);
        fprintf(f, "| %d | %s | %s | %dx%dx%d |", i, l->name, kind, l->out.h, l->out.w, l->out.c);
        row_cells(&cf, r, f, &tf);
        row_cells(&cb, r, f, &tb);
        fprintf(f, "\n");
        sf.flops += cf.flops, sf.mma += cf.mma, sf.bytes += cf.bytes;
        sb.flops += cb.flops, sb.mma += cb.mma, sb.bytes += cb.bytes;
    }
    const mgt_cost loss = mgt_loss_cost(m, n), up = mgt_update_cost(m, opt);
    double tl = 0, tu = 0;
    fprintf(f, "| | loss | softmax + cross-entropy | |");
    row_cells(&loss, r, f, &tl);
    fprintf(f, " | | |\n| | update | %s | |", mgt_opt_name(opt->optimizer));
    row_cells(&up, r, f, &tu);
    fprintf(f, " | | |\n");
    fprintf(f, "| | **all layers** | | | %.1f | %.0f | **%.3f** | %.1f | %.0f | **%.3f** |\n\n",
            sf.flops / 1e9, sf.bytes / 1e6, 1e3 * tf, sb.flops / 1e9, sb.bytes / 1e6, 1e3 * tb);
    const double step = tf + tb + tl + tu;
    fprintf(f,
            "Step floor: %.3f ms (forward %.3f, backward %.3f, loss %.4f, update %.3f): at most "
            "%.0f images/s. The whole step's FLOPs over the matrix rate alone: %.3f ms; its bytes "
            "over the bandwidth alone: %.3f ms.\n",
            1e3 * step, 1e3 * tf, 1e3 * tb, 1e3 * tl, 1e3 * tu, step > 0 ? n / step : 0.0,
            1e3 * (sf.mma + sb.mma) / r->mma,
            1e3 * (sf.bytes + sb.bytes + loss.bytes + up.bytes) / r->bw);
}

int mgt_memory_estimate(const mgt_model *m, int n, int bf16, int tf32, const mgt_optim_cfg *opt,
                        int accum_steps, mgt_mem_estimate *e) {
    memset(e, 0, sizeof *e);
#ifdef MGT_HAVE_CUDA
    const int math = (bf16 ? MGT_GPU_BF16 : 0) | (tf32 ? MGT_GPU_TF32 : 0);
    if (!mgt_gpu_loadable()) /* the workspace is the backend's to say */
        return -1;
    mgt_plan p;
    mgt_err err;
    mgt_model sized = *m; /* planned with the run's activation type (model.h: act_bytes) */
    sized.act_bytes = bf16 ? 2 : 4;
    if (mgt_model_plan(&sized, n, !m->no_memory_sharing, &p, &err) < 0)
        return -1;
    e->act = (double)p.arena;
    mgt_plan_free(&p);
    const int slots = opt_slots(opt);
    const double P = (double)m->grad_count, nn = n > 0 ? n : 0, k = m->classes;
    /* the weights; gradients, optimizer state and accumulation for the trainable ones */
    e->params = 4 * ((double)m->param_count + P * (1 + slots + (accum_steps > 1)) +
                     (double)m->buffer_count);
    for (int i = 0; i < m->nlayers; i++) /* batch normalisation's mean and 1/std */
        if (!strcmp(m->layers[i].type->name, "batchnorm"))
            e->params += 4 * 4 * (double)m->layers[i].in.c;
    e->batch = nn * (4 * (double)mgt_shape_elems(m->input) + 4 + 8 * k + 2 * 8);
    if (bf16) /* the input in bfloat16, the output and its gradient in float32 (model.h) */
        e->batch += nn * (2 * (double)mgt_shape_elems(m->input) + 8 * k);
    for (int i = 0; i < m->nlayers; i++) {
        const mgt_layer *l = &m->layers[i];
        const char *t = l->type->name;
        size_t w = 0;
        if (!strcmp(t, "conv2d")) {
            mgt_conv_shape s =
                mgt_conv2d_geometry(n, l->in.h, l->in.w, l->in.c, l->cfg.filters, l->cfg.kernel,
                                    l->cfg.kernel_w, l->cfg.stride, l->cfg.same);
            w = mgt_gpu_conv_workspace(&s, math);
        } else if (!strcmp(t, "depthwise_conv2d") || !strcmp(t, "separable_conv2d")) {
            const mgt_conv_shape d =
                mgt_conv2d_geometry(n, l->in.h, l->in.w, l->in.c, l->in.c, l->cfg.kernel,
                                    l->cfg.kernel_w, l->cfg.stride, l->cfg.same);
            w = mgt_gpu_dwconv_workspace(&d);
            if (t[0] == 's') {
                const mgt_conv_shape pw =
                    mgt_conv2d_geometry(n, d.oh, d.ow, d.c, l->cfg.filters, 1, 1, 1, 0);
                const size_t c = mgt_gpu_conv_workspace(&pw, math);
                w = c > w ? c : w;
            }
        }
        e->workspace = (double)w > e->workspace ? (double)w : e->workspace;
    }
    e->other = (double)(32 << 20) + 2.0 * 8 * 65536; /* cuBLAS's, and the partial sums */
    e->total = e->act + e->params + e->batch + e->workspace + e->other;
    return 0;
#else
    (void)m, (void)n, (void)bf16, (void)tf32, (void)opt, (void)accum_steps;
    return -1;
#endif
}

void mgt_memory_print(const mgt_model *m, int n, int bf16, int tf32, const mgt_optim_cfg *opt,
                      int accum_steps, FILE *f) {
    mgt_mem_estimate e;
    if (mgt_memory_estimate(m, n, bf16, tf32, opt, accum_steps, &e) < 0)
        return;
    const double mib = 1048576.0, h200 = 143771.0 * mib; /* nvidia-smi's total on one */
    fprintf(f,
            "GPU memory of one rank training a batch of %d (%s; mgtrain's own allocations): "
            "%.1f MiB = activations %.1f (the memory plan) + weights, gradients and optimizer "
            "state %.1f + batch %.1f + convolution workspace %.1f + other %.1f; %s an H200 "
            "(143,771 MiB: %.0f%% of it)\n",
            n,
            bf16   ? "bf16"
            : tf32 ? "tf32"
                   : "fp32",
            e.total / mib, e.act / mib, e.params / mib, e.batch / mib, e.workspace / mib,
            e.other / mib, e.total < 0.97 * h200 ? "fits" : "does NOT fit", 100.0 * e.total / h200);
}
