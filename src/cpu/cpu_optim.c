/* cpu_optim.c: one optimizer step over the whole flat parameter arena: a loop per rule of
 * optim_math.h (Keras' formulas), which the GPU kernels share.
 *
 * Each loop is made from its rule by one macro, in three variants by the state slots the step
 * has (two, one, none), so that each is a single branch-free streaming pass the compiler
 * vectorises: the rules' own tests are on settings, which do not change within a step, and
 * the compiler takes them out of the loop. The loops are MGT_SIMD (8 floats a vector where the
 * CPU has AVX2: Adam's square root and division are most of its time once the arena is in
 * cache), and a large range is cut into parts for the lanes. Every element is updated alone, by
 * the same roundings wherever the cuts fall (the file is built without FMA contraction, which
 * could differ between a loop's vector body and its scalar tail: CMakeLists.txt), so the split
 * changes no bit. tests/cli/vectorized.sh checks in the binary that every clone is vectorised:
 * Adam's scalar loop once took 1.4 ms of a 4.7 ms MLP step on an AVX2 CPU, 0.19 vectorised. */
#include "cpu_internal.h"
#include "optim_math.h"

#define CPU_OPT_LOOP(id, rule)                                                                     \
    MGT_SIMD static void loop_##id(size_t count, float *restrict w, const float *restrict g,       \
                                   float *restrict s0, float *restrict s1,                         \
                                   const mgt_opt_hyper *hp) {                                      \
        const mgt_opt_hyper h = *hp;                                                               \
        if (s0 && s1)                                                                              \
            for (size_t i = 0; i < count; i++)                                                     \
                rule(&w[i], &s0[i], &s1[i], g[i], &h);                                             \
        else if (s0)                                                                               \
            for (size_t i = 0; i < count; i++)                                                     \
                rule(&w[i], &s0[i], NULL, g[i], &h);                                               \
        else                                                                                       \
            for (size_t i = 0; i < count; i++)                                                     \
                rule(&w[i], NULL, NULL, g[i], &h);                                                 \
    }
MGT_OPTIMIZERS(CPU_OPT_LOOP)
#undef CPU_OPT_LOOP

typedef void (*opt_loop)(size_t count, float *restrict w, const float *restrict g,
                         float *restrict s0, float *restrict s1, const mgt_opt_hyper *h);

#define CPU_OPT_ENTRY(id, rule) [MGT_OPT_##id] = loop_##id,
static const opt_loop loops[] = {MGT_OPTIMIZERS(CPU_OPT_ENTRY)};
#undef CPU_OPT_ENTRY
_Static_assert(sizeof loops / sizeof loops[0] == MGT_OPT_COUNT, "one CPU loop per optimizer");

/* Elements below which an update stays on one lane: 16K floats are 7 x 64 KB of Adam's
 * streams, tens of microseconds, against a few for handing a part to a worker. */
#define OPT_PART ((size_t)1 << 14)

typedef struct {
    opt_loop loop;
    float *w, *s0, *s1;
    const float *g;
    const mgt_opt_hyper *h;
} opt_job;

static void opt_part(void *p, size_t lo, size_t hi) {
    const opt_job *j = p;
    j->loop(hi - lo, j->w + lo, j->g + lo, j->s0 ? j->s0 + lo : NULL, j->s1 ? j->s1 + lo : NULL,
            j->h);
}

void mgt_cpu_optim_step(mgt_backend *be, mgt_opt_kind kind, size_t count, float *w, const float *g,
                        float *const *slots, const mgt_opt_hyper *h) {
    opt_job j = {.loop = loops[kind], .w = w, .s0 = slots[0], .s1 = slots[1], .g = g, .h = h};
    mgt_cpu_lanes_for(mgt_cpu_impl_of(be)->lanes, count, OPT_PART, opt_part, &j);
}
