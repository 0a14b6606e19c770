/* resume.h: what a resumed run takes from its run folder, and what it may change (--resume).
 *
 * A run is its model file and the flags it was started with, and its folder keeps both: the model
 * file's copy (<model>.cfg) and, in run.json, the flags that define the run as words of a command
 * line ("--lr=0.01", "--no-validation"). A resume (--resume, or --resume auto where there is a
 * checkpoint) continues the run as it was:
 *  - the recorded flags come first and the ones given now after them (a flag given twice takes
 *    the later value), so a run started with --optimizer sgd --lr 0.01 --batch-size 128
 *    --epochs 3 resumes with all four from --resume alone, and its model file is --model's as
 *    recorded;
 *  - what the run then resolves to is compared with what it was (rank 0), and every difference is
 *    refused in one message: each [train] key, resolved as the plan resolves it from the model
 *    file and the flags (a key counts as changed when giving one side's value to the other
 *    changes it, so --lr 0.001 given again to a run that took Adam's default is no change); every
 *    other key of the model file ([input] mean and std, a layer's rate, ...); every other flag
 *    that defines the run (--data, --val-split, --input-shape, --precision, ...); and, once it is
 *    loaded, the data as described (an image set converted again at another size).
 * A flag defines the run unless named here, a flag added later included, so that no new setting
 * can change silently on a resume. Named: the ones a resume may change, which the folder then
 * records anew (--epochs, to train further, and the output settings --save-every,
 * --keep-checkpoints, --log-every, --no-tensorboard), and the ones of one start alone, never
 * recorded: where and how this start runs (--device, --gpus, the transport and its tuning,
 * --max-steps, --verbose, profiling, --resume, --out, --init-weights, ...), as the rank count is.
 * The start-up block names what a resume changes. A folder whose run.json records no flags (an
 * older mgtrain wrote it) resumes with the flags given now, as before. */
#ifndef MGT_RESUME_H
#define MGT_RESUME_H

#include "cli.h"
#include "run_plan.h"
#include "rundir.h"
#include "runtime.h"

typedef enum {
    MGT_FLAG_DEFINES = 0, /* recorded, taken on a resume, refused when given with another value */
    MGT_FLAG_MAY_CHANGE,  /* recorded, taken on a resume, may be given with another value */
    MGT_FLAG_THIS_START   /* never recorded nor taken: this start's alone */
} mgt_flag_class;

mgt_flag_class mgt_resume_flag_class(const char *name);

typedef struct mgt_resume {
    int on;             /* this start resumes a run whose folder records its flags */
    char out[600];      /* the run folder */
    mgt_run_record rec; /* what its run.json records (rank 0's reading, on every rank) */
    char *words[2 * MGT_MAX_GIVEN_FLAGS + 4];
    char buf[16384];     /* the words' text */
    mgt_cli merged, run; /* recorded flags then this start's; the recorded ones alone */
} mgt_resume;

/* Collective. The options to run: o's own, or, when o resumes a run whose folder records its
 * flags, those flags with o's after them (kept in r, which must outlive them). A record that
 * this mgtrain cannot take ends every rank alike. */
const mgt_options *mgt_resume_options(mgt_resume *r, const mgt_options *o, const mgt_runtime *rt);

/* Collective, once the plan p of the merged options is made: rank 0 compares it with the run's
 * (its model copy in the folder, its recorded flags, the flags given now in given), and a
 * difference ends every rank alike with all of them in one message. Where the checkpoint is of
 * another model than m, its own check says so first (checkpoint.h). */
void mgt_resume_check(const mgt_resume *r, const mgt_options *given, const mgt_run_plan *p,
                      const mgt_model *m, const mgt_runtime *rt);

/* Collective, once the data is loaded: its description (splits.h) against the run's. */
void mgt_resume_check_data(const mgt_resume *r, const mgt_options *given, const char *desc,
                           const mgt_runtime *rt);

/* The words run.json records for this start: the flags of o (the merged options) that define the
 * run or may change, each once with its last value, into words[max] (text in buf[n]). Returns
 * their count. */
int mgt_resume_record(const mgt_options *o, const char **words, int max, char *buf, size_t n);

/* Rank 0, for the start-up block: what this resume takes from the folder and what it changes
 * (the flags given now that may change or are this start's, the rank count). */
void mgt_resume_report(const mgt_resume *r, const mgt_options *given, const mgt_runtime *rt);

#endif
