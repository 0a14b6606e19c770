/* pretrained.h: weights from elsewhere into a model: --init-weights (fine-tuning from another
 * run, or from PyTorch, torchvision or timm), and eval/predict --weights with a name map.
 *
 * Every tensor of the model whose name (the file's name passed through the name map) and shape
 * are those of a tensor of the file is loaded; the others keep the values they hold (the seed's
 * initialisation). What was loaded, what was left at its initial value and what the file holds
 * that no tensor took is one table (mgt_pretrained_load's report). By default anything left or
 * unused is an error (PyTorch's load_state_dict(strict=True)); `partial` allows both, as a new
 * head or a model grown from a smaller one needs (timm's and Keras' by_name loading).
 *
 * A name map (--name-map FILE) is a text file of renames, one per line, `FROM TO`: a file's
 * tensor whose whole name matches FROM takes the name TO, where each `*` of FROM matches any run
 * of characters and each `*` of TO is what the matching `*` of FROM took, in order; TO `-` drops
 * the tensor (it is neither loaded nor unused). The first line that matches wins; a name no line
 * matches stays as it is. `#` starts a comment (examples/resnet50_torchvision.map and
 * examples/xception_timm.map). PyTorch's
 * batchnorm step counters (*.num_batches_tracked, integers) are not weights: they are counted apart
 * and never unused. Files of any float dtype load (F16, BF16 and F64 converted to float32:
 * tensor_io.h). */
#ifndef MGT_PRETRAINED_H
#define MGT_PRETRAINED_H

#include "model.h"
#include "util.h"

typedef struct mgt_pretrained_opts {
    const char *path; /* the weights file (safetensors) */
    const char *map;  /* the name map (NULL: the file's names as they are) */
    int partial;      /* tensors left at their initial values, and unused ones, are allowed */
    const char *flag; /* what names the file in messages: "--init-weights", "--weights" */
} mgt_pretrained_opts;

/* Loads the file's matching tensors into the host arenas w[param_count] and buf[buffer_count],
 * which hold the initial values. *report gets the table (malloc'd: free it; also on failure,
 * where it says what did not match, NULL when nothing was read). -1 with err when the file or
 * the map cannot be read, a tensor is not finite, nothing matches, or (without partial) a tensor
 * is left or unused. */
int mgt_pretrained_load(const mgt_model *m, const mgt_pretrained_opts *o, float *w, float *buf,
                        char **report, mgt_err *err);

#endif
