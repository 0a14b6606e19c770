/* metrics.h: what rank 0 shows and writes about training: the Keras-style progress bar (TTY)
 * and epoch lines, OUT/metrics.jsonl + OUT/metrics.csv, rewritten whole (atomically) after
 * every epoch so a reader never sees half a line, and the same figures as TensorBoard scalars in
 * OUT/tb/ (tb.h), per-step rows with --log-every. Every figure passed in is already global (reduced
 * over all ranks). A resumed
 * run keeps the history its checkpoint had (mgt_metrics_resume).
 *
 * metrics.jsonl holds each figure with as many digits as it takes to read back the very double
 * (as Python's repr does): a reader gets the numbers the run computed, and TensorBoard's float32
 * copies are those numbers rounded to float32. metrics.csv, for plots and people, keeps 6. */
#ifndef MGT_METRICS_H
#define MGT_METRICS_H

#include <stdint.h>

#include "model.h"
#include "profile.h"
#include "tb.h"
#include "util.h"

/* What a model's figures are besides its loss (mgt_task_of): a classification's accuracy (and
 * top-5 with more than 5 classes); binary cross-entropy's binary accuracy (the outputs right)
 * with precision, recall and F1 over all outputs (micro) and each label's F1; a regression's
 * mean absolute error and root mean squared error, over all outputs, and no accuracy. */
typedef enum { MGT_TASK_CLASSES = 0, MGT_TASK_BINARY, MGT_TASK_REGRESSION } mgt_task;
mgt_task mgt_task_of(const mgt_model *m);

/* A task's own figures, from its sums (model.h: MGT_SUM_TASK on): n of v (binary: precision,
 * recall, F1; regression: MAE, RMSE; 0: none), and each label's F1 (labels of them: binary with
 * 2 to MGT_LABEL_SUMS_MAX labels, else 0). A ratio of nothing (no positive predicted, say) is
 * 0, as scikit-learn's zero_division default gives. */
typedef struct mgt_figs {
    int n;
    double v[3];
    int labels;
    double f1[MGT_LABEL_SUMS_MAX];
} mgt_figs;
/* The figures of `task` over `samples` samples of `outputs` outputs from its sums. */
void mgt_figs_of(mgt_task task, int outputs, const double *sums, double samples, mgt_figs *f);
/* Their names (" - precision: 0.9000 - recall: ..."), each after prefix ("" or "val_"), for
 * the console lines, appended to buf. */
void mgt_figs_line(mgt_task task, const mgt_figs *f, const char *prefix, char *buf, size_t n);
/* One label's precision, recall and F1 from the task's sums (binary, per-label sums kept). */
void mgt_figs_label(const double *sums, int label, double *precision, double *recall, double *f1);

typedef struct mgt_epoch_row {
    int epoch;
    int64_t step;
    double loss, acc, val_loss, val_acc; /* val_* < 0: none */
    double samples_per_s, seconds;
    double lr; /* the learning rate the epoch ended with */
    /* Top-5 accuracy, training and validation (< 0: none; shown only where mt->top5). */
    double top5, val_top5;
    /* The task's own figures (mgt_figs), training and validation (val_task.n 0: none). */
    mgt_figs task, val_task;
} mgt_epoch_row;

/* One per-step row (--log-every N), at every N-th global step. */
typedef struct mgt_step_row {
    int64_t step;         /* optimizer steps done */
    double epoch;         /* epochs done, with the fraction of the current one (0.5: half of the
                             first), so per-step and per-epoch rows share an axis */
    double loss, acc;     /* means over the samples of the steps since the previous row (or since
                             this run started), over all ranks */
    double lr;            /* the learning rate of the row's last step */
    double samples_per_s; /* over those steps' wall time, all ranks */
    double top5;          /* top-5 accuracy over the same samples (written where mt->top5) */
    mgt_figs task;        /* the task's own figures over the same samples */
} mgt_step_row;

/* The progress bar as last drawn, for a redraw with a status ("validating"). */
typedef struct mgt_bar {
    int epoch;
    int64_t step, steps;
    double eta_s, loss, acc;
    int has_top5; /* show top5 (the top-5 accuracy) after acc */
    double top5;
    int mae;      /* acc is a regression's mean absolute error (shown as mae) */
} mgt_bar;

typedef struct mgt_metrics {
    int verbose;          /* 0 silent, 1 bar, 2 epoch lines */
    int epochs;
    char dir[512];        /* OUT */
    mgt_epoch_row *rows;
    int nrows, cap;
    double last_draw;
    int bar_open;
    mgt_bar bar;          /* the last bar drawn */
    int launched;         /* started by mpirun/srun: the terminal may be the launcher's */
    mgt_tb tb;            /* TensorBoard event file; tb.fd < 0: none */
    int steps_fd[2];      /* per-step rows: metrics_steps.jsonl, .csv (-1: none) */
    int top5;             /* top-5 accuracy is shown and written (more than 5 classes) */
    /* A language model's losses are also shown as perplexity (e^loss) and bits per token
     * (loss / ln 2; bits per byte for a byte-level model): MGT_LM_* (0: an image model). */
    int lm;
    mgt_task task;        /* which figures besides the loss (mgt_metrics_set_task) */
} mgt_metrics;

enum { MGT_LM_NONE = 0, MGT_LM_TOKENS, MGT_LM_BYTES };

/* verbose < 0: 1 on a terminal, 2 otherwise; launched: started by mpirun/srun, whose ranks'
 * stdout may be a pseudo-terminal even when the launcher's own output is not a terminal.
 * classes: the model's; with more than 5, top-5 accuracy joins accuracy in the bar, the epoch
 * lines, the metrics files (top5_acc, val_top5_acc) and TensorBoard (.../top5_accuracy). */
void mgt_metrics_init(mgt_metrics *mt, int verbose, int epochs, const char *dir, int launched,
                      int classes);
/* The model's task (mgt_task_of): its figures join the lines, files and TensorBoard scalars
 * (precision, recall, f1 and f1_per_label; mae and rmse, where acc is then null), each also as
 * val_*. Call after mgt_metrics_init, before anything is written. */
void mgt_metrics_set_task(mgt_metrics *mt, mgt_task task);
/* Progress within an epoch (verbose 1 only; at most 10 redraws a second unless force): step of
 * steps, the steps this epoch will run (fewer where --max-steps ends it). The line is fitted to
 * the terminal's width (COLUMNS, else the terminal's own, else 80), dropping the least needed
 * parts first, so it never wraps: a wrapped line would scroll at every redraw. */
void mgt_metrics_progress(mgt_metrics *mt, int epoch, int64_t step, int64_t steps, double eta_s,
                          double loss, double acc, double top5, int force);
/* The last bar drawn again, saying that validation runs (verbose 1, a bar open). */
void mgt_metrics_validating(mgt_metrics *mt);
/* The bar's line for a terminal of `width` columns, at most width - 1 characters (the last
 * column left free: writing it makes some terminals wrap). status: replaces the ETA, or NULL. */
/* The cells of a bar of `width` cells (at most 30) for done of total, as Keras draws them:
 * '=' for each whole part done, '>' at the front, '.' for the rest; cells gets width + 1 bytes. */
void mgt_bar_cells(char *cells, int width, int64_t done, int64_t total);
void mgt_metrics_bar_line(char *out, size_t n, int width, const mgt_bar *b, const char *status);
/* Rank 0: also writes every epoch's figures to a new event file in OUT/tb/ (tb.h), training
 * having started (or resumed) at start_step, as TensorBoard scalars at the global step:
 * epoch/loss, epoch/accuracy, epoch/val_loss, epoch/val_accuracy (when validated),
 * epoch/samples_per_s and epoch/learning_rate, and with top-5 epoch/top5_accuracy and
 * epoch/val_top5_accuracy. The profile (when on) writes its phase means
 * there too, at its report. Per-step scalars may go into mt->tb with mgt_tb_scalars. Returns
 * -1 if the file cannot be created. */
int mgt_metrics_tb(mgt_metrics *mt, mgt_profile *prof, int64_t start_step, mgt_err *err);
/* Rank 0 of a resumed run, before its first epoch: the rows metrics.jsonl holds up to the
 * checkpoint's step become the first rows (Keras' CSVLogger(append=True)), and both files are
 * rewritten with them at once; rows after it (work a stopped run did that is now done again, as
 * TensorBoard drops it) are left out. A missing or unreadable file, or a line that is not a row,
 * leaves a sentence in notice (else notice[0] = 0). Returns -1 if the files cannot be
 * rewritten. */
int mgt_metrics_resume(mgt_metrics *mt, int64_t step, char *notice, size_t notice_size,
                       mgt_err *err);
/* The epoch line, plus the metrics files. Returns -1 if the files cannot be written. */
int mgt_metrics_epoch(mgt_metrics *mt, const mgt_epoch_row *row, mgt_err *err);

/* Per-step rows (rank 0, --log-every): OUT/metrics_steps.jsonl and OUT/metrics_steps.csv (step,
 * epoch, loss, acc, lr, samples_per_s, and top5_acc with top-5; the JSON lines with every digit,
 * the CSV with 6), beside
 * the per-epoch files, whose readers they leave alone. Rows are appended, one write each, so a
 * long run does not rewrite its history at every row; a crash can leave at most a part of the
 * last line. A run that starts at step 0 starts the files afresh; one resumed at start_step
 * keeps the rows up to that step (the files are rewritten atomically without the later ones,
 * which the resumed run redoes, and without a damaged last line). Also TensorBoard scalars
 * step/loss, step/accuracy, step/learning_rate and step/samples_per_s (and step/top5_accuracy). */
int mgt_metrics_steps_open(mgt_metrics *mt, int64_t start_step, mgt_err *err);
int mgt_metrics_step(mgt_metrics *mt, const mgt_step_row *row, mgt_err *err);
void mgt_metrics_free(mgt_metrics *mt);

#endif
