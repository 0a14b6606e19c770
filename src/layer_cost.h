/* layer_cost.h: what each layer of a model must compute and move, and the least time that takes
 * on a device of given rates: the one account of a layer's FLOPs and bytes, used by `mgtrain
 * summary --floor` (the prediction table) and by --profile-layers (each layer's achieved GB/s and
 * TFLOP/s).
 *
 * A layer's bytes are the fewest its pass can move through device memory, the layer taken alone:
 * each input read once, each output written once, its parameters read once and their gradients
 * written once (its activation, `activation = relu` and the like, fused: no pass of its own).
 * Activations and their gradients count `act_bytes` bytes a value (4 for float32, 2 where they
 * are kept in bfloat16), parameters and their gradients 4. Where backward need not produce an
 * input's gradient (the model's input, or no parameters below) it is not counted, as mgtrain
 * skips it; the gradient of a sum is its output gradient itself (add: nothing to move), a
 * concatenation's is its slices (read and written once). A tensor with several consumers gets
 * its gradient summed: the consumer that adds reads the sum so far once more. A fusion group
 * (fuse.c: a batchnorm with the ReLU and residual sum after it) is one pass each way, counted at
 * its last layer, where it runs; its other layers count nothing. A convolution's bias that a
 * batchnorm cancels (on a backend that leaves it out) costs no FLOPs.
 * FLOPs count a multiply-add as 2. `mma` is the part a matrix unit can do (the products of
 * convolutions and dense layers); the rest (depthwise convolutions, normalisation, pooling,
 * element-wise work) runs on the ordinary cores.
 *
 * The floor of a pass is the larger of its bytes over the memory bandwidth and its FLOPs over
 * the rates of the units doing them: no implementation runs it faster. */
#ifndef MGT_LAYER_COST_H
#define MGT_LAYER_COST_H

#include "model.h"
#include "optim.h"

typedef struct mgt_cost {
    double flops; /* all of them, mma included */
    double mma;   /* the matrix unit's share */
    double bytes;
} mgt_cost;

/* A device's rates: bytes/s of device memory, FLOP/s of the matrix unit in the run's precision
 * and of the ordinary float32 cores. */
typedef struct mgt_rates {
    char name[200]; /* "NVIDIA H200, BF16 tensor cores (...)", for the table's header */
    double bw, mma, fp32;
} mgt_rates;

/* The rates of GPU `gpu` (its name as CUDA gives it, "NVIDIA H200"; NULL or "": the H200, the
 * GPU the predictions are written for) in `precision`: "fp32" (no TF32: products on the float32
 * cores), "tf32" or "bf16" (the tensor cores). Each is what a large operation reached on such a
 * GPU, not its datasheet's figure (layer_cost.c lists both): the floor is then the least time
 * the libraries and kernels can be expected to take. copy_bps > 0 is the device-to-device copy
 * rate measured on this GPU now (bytes read and written per second: mgt_gpu_copy_rate), which
 * replaces the table's. A GPU the table does not know takes the H200's arithmetic rates, and
 * says so in the name. -1 for an unknown precision. */
int mgt_rates_for(const char *gpu, const char *precision, double copy_bps, mgt_rates *r);

/* Layer i's forward and backward at a local batch of n, activations act_bytes a value. */
void mgt_layer_cost(const mgt_model *m, int i, int n, int act_bytes, mgt_cost *fwd, mgt_cost *bwd);
/* The fusion group layer i runs in (the model's, or as the model will find them), into *g;
 * returns its index, or -1 when the layer runs alone. */
int mgt_layer_group(const mgt_model *m, int i, mgt_group *g);
/* The type cell of layer i's row in the tables: its type, with "(runs in TAIL)" for a layer
 * inside a fusion group and "(group: BN + ADD + ACT)" at the group's last layer. */
void mgt_layer_label(const mgt_model *m, int i, char *buf, size_t n);
/* The loss (softmax + cross-entropy and its gradient) and the optimizer opt's update of every
 * parameter (read w, g and each state slot, write w and the slots). */
mgt_cost mgt_loss_cost(const mgt_model *m, int n);
mgt_cost mgt_update_cost(const mgt_model *m, const mgt_optim_cfg *opt);

/* The floor of a pass in seconds; *mem_bound says which term set it. */
double mgt_cost_floor(const mgt_cost *c, const mgt_rates *r, int *mem_bound);

/* The prediction table: per layer and direction its GFLOP, MB and floor at rates r, then the
 * loss, opt's update and the whole step (the sum of the floors), and the images/s that step
 * allows. Markdown. */
void mgt_floor_table(const mgt_model *m, int n, int act_bytes, const mgt_rates *r,
                     const mgt_optim_cfg *opt, FILE *f);

/* The device memory one rank holds while training local batches of n on a GPU (mgtrain's own
 * allocations, the CUDA context and the libraries' code excluded, as --profile's peak and
 * PyTorch's max_memory_allocated count), by part: the activation arena (the memory plan:
 * outputs kept for backward, their gradients, the layers' temporaries), the weights with their
 * gradients, optimizer state and batch-norm statistics, the batch (inputs, labels, one-hot
 * targets, probabilities, sample ids; one input set, as device-made batches use), the
 * convolution workspace (the largest layer's, with bf16 or not) and the rest (cuBLAS's
 * workspace, the reductions' partial sums), with the optimizer opt's state and, when
 * accum_steps > 1, the accumulated gradients. Bytes. 0 on success; -1 without a GPU backend in
 * this build (workspace unknown) or out of host memory. */
typedef struct mgt_mem_estimate {
    double act, params, batch, workspace, other, total;
} mgt_mem_estimate;
int mgt_memory_estimate(const mgt_model *m, int n, int bf16, int tf32, const mgt_optim_cfg *opt,
                        int accum_steps, mgt_mem_estimate *e);
/* The estimate as lines for `mgtrain summary`, against an H200's memory (143,771 MiB). */
void mgt_memory_print(const mgt_model *m, int n, int bf16, int tf32, const mgt_optim_cfg *opt,
                      int accum_steps, FILE *f);

#endif
