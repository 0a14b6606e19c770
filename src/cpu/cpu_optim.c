/* cpu_optim.c: one optimizer step over the whole flat parameter arena: a loop per rule of
 * optim_math.h (Keras' formulas), which the GPU kernels share.
 *
 * Each loop is made from its rule by one macro, in three variants by the state slots the step
 * has (two, one, none), so that each is a single branch-free streaming pass the compiler
 * vectorises: the rules' own tests are on settings, which do not change within a step, and
 * the compiler takes them out of the loop. */
#include "cpu_internal.h"
#include "optim_math.h"

#define CPU_OPT_LOOP(id, rule)                                                                     \
    static void loop_##id(size_t count, float *restrict w, const float *restrict g,                \
                          float *restrict s0, float *restrict s1, const mgt_opt_hyper *hp) {       \
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

void mgt_cpu_optim_step(mgt_backend *be, mgt_opt_kind kind, size_t count, float *w, const float *g,
                        float *const *slots, const mgt_opt_hyper *h) {
    (void)be;
    loops[kind](count, w, g, slots[0], slots[1], h);
}
