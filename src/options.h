/* options.h: the command line as given: the command and its flags, strings as typed and flags
 * as numbers, filled by the parser (cli.h) and read by one module only, the plan (run_plan.h),
 * which resolves them with the model file into what each part of a run is handed. */
#ifndef MGT_OPTIONS_H
#define MGT_OPTIONS_H

#include <stdint.h>

enum { MGT_MAX_GIVEN_FLAGS = 96 };

typedef struct mgt_options {
    const char *command; /* train, eval, predict, summary, convert */
    const char *model;   /* NULL: the embedded default (examples/mlp.cfg) */
    const char *data;    /* folder of IDX files, "synthetic", or NULL: the default folder */
    /* [train] overrides as given on the command line (NULL: not given). */
    const char *epochs, *batch_size, *optimizer, *lr, *seed, *accum_steps;
    int64_t max_steps; /* 0: no limit */
    const char *out;   /* NULL: runs/<model> */
    const char *init_weights, *weights, *output, *split;
    const char *name_map;     /* --name-map: renames of the weights file's tensors (pretrained.h) */
    int init_partial;         /* --init-partial: what does not match keeps its initial value */
    int keep_bn;              /* export --batchnorm keep: no folding */
    double val_split;         /* < 0: validate on the test split */
    int no_validation;        /* train only: no validation, no final test evaluation */
    int64_t save_every;       /* 0: only at epoch ends */
    int resume;               /* MGT_RESUME_* */
    int overwrite;            /* train into a folder that holds another run, replacing it */
    int64_t keep_checkpoints; /* the last K checkpoints are kept (1: checkpoint.safetensors) */
    const char *run;          /* eval, predict: a run folder, for its model copy and weights */
    int profile;
    int profile_layers;     /* --profile-layers: also the per-layer device table (GPU) */
    int floor;              /* summary --floor: each layer's FLOPs, bytes and floor on an H100 */
    const char *algo_cache; /* GPU: the convolution algorithms' file (NULL: none) */
    int cuda_graph;         /* GPU: replay forward and backward as CUDA graphs (default 1) */
    int no_tensorboard;     /* no event files in OUT/tb */
    const char *timeline;
    int verbose;           /* -1: auto */
    double comm_timeout;   /* seconds */
    int64_t debug_check;   /* compare weight checksums across ranks every K steps (0: off) */
    const char *device;    /* cpu, gpu, auto */
    const char *gpus;      /* "0,2,3": local rank i uses the i-th listed device (NULL: device i) */
    int share_gpu;         /* tests only: several ranks may share a GPU */
    int tf32;              /* let cuDNN / cuBLAS use TF32 */
    int bf16;              /* --precision bf16 (GPU): bfloat16 GEMM and convolution inputs */
    const char *conv_algo; /* auto, direct, winograd for every conv2d layer (NULL: the file's) */
    const char *input_shape;   /* "H,W,C" instead of the file's [input] shape (NULL: the file's) */
    const char *transport;     /* auto, nccl, mpi, shm */
    int device_data;           /* keep a small training set in backend memory (default 1) */
    int64_t synthetic_samples; /* training samples of --data synthetic */
    /* The step's pipeline (reducer.h): bucket cap in MiB (< 0: the backend's default, 0: one
     * all-reduce after backward), ZeRO-1, and how the MPI transport's requests progress. */
    double bucket_mb;
    int zero;
    const char *comm_progress; /* test, thread (NULL: test) */
    int64_t log_every;         /* per-step metrics rows every N steps (0: none) */
    int loader_threads;        /* threads preparing an image set's batches (0: by the cores) */
    /* convert (data/convert.h): SRC and DST, and its flags. */
    const char *convert_src, *convert_dst;
    int convert_size, skip_bad, convert_square;
    int convert_text;    /* --text: SRC is text, DST gets token shards (data/text.h) */
    double val_fraction; /* --val-fraction */
    /* generate (generate.h): --prompt, --max-new-tokens, --temperature, --top-k */
    const char *prompt;
    int64_t max_new_tokens;
    double temperature;
    int top_k;
    int64_t shard_size;
    int convert_threads; /* --threads (0: every core) */
    /* [train] keys set by flags of their own (--lr-schedule, --clip-norm, ...), in the order
     * given: the flag (for messages), the key and the value. */
    struct {
        const char *flag, *key, *value;
    } train_keys[16];
    int ntrain_keys;
    /* Every flag as given, in order: its name (without --) and value (NULL: a switch). A run
     * folder records the ones that define the run, which --resume takes again (resume.h). */
    struct {
        const char *name, *value;
    } given[MGT_MAX_GIVEN_FLAGS];
    int ngiven;
} mgt_options;

/* --resume: off; "require" (plain --resume): the run's checkpoint must be there; "auto": resume
 * when there is one, else start afresh (a requeued job's command line, the same every time). */
enum { MGT_RESUME_OFF = 0, MGT_RESUME_REQUIRE, MGT_RESUME_AUTO };

#endif
