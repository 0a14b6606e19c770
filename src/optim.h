/* optim.h: an optimizer over the whole flat parameter arena: its slots (velocity, mean square,
 * first and second moments) are arenas of the same layout, and a step is one backend call. */
#ifndef MGT_OPTIM_H
#define MGT_OPTIM_H

#include "backend.h"
#include "model.h"

enum { MGT_OPT_MAX_SLOTS = 2 };

typedef struct mgt_optim {
    mgt_train_cfg cfg;
    size_t count;
    int nslots;
    float *slot[MGT_OPT_MAX_SLOTS]; /* backend memory */
    const char *slot_name[MGT_OPT_MAX_SLOTS];
    int64_t t;              /* steps taken (Adam's bias correction) */
} mgt_optim;

int mgt_optim_init(mgt_optim *o, const mgt_train_cfg *cfg, mgt_backend *be, size_t count,
                   mgt_err *err);
/* g holds gradient sums over the global batch of `global_n` samples. */
void mgt_optim_step(mgt_optim *o, mgt_backend *be, float *w, const float *g, int64_t global_n);
void mgt_optim_free(mgt_optim *o, mgt_backend *be);

#endif
