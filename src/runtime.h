/* runtime.h: the MPI world this process is part of, and how a job ends on error.
 *
 * Rank, world size and the node-local rank come from MPI itself (MPI_Comm_split_type with
 * MPI_COMM_TYPE_SHARED), never from launcher variables, so mpirun, srun and a singleton
 * ./mgtrain all work the same way. A process that no launcher started is a world of one and
 * does not start MPI at all: every collective is then a no-op, and Open MPI's singleton
 * start-up (half a second) is saved. */
#ifndef MGT_RUNTIME_H
#define MGT_RUNTIME_H

#include <mpi.h>
#include <signal.h>

/* The signals that ask a training run to stop at a step boundary with a checkpoint: SIGTERM (kill,
 * Slurm's preemption and time limit, mpirun's own Ctrl-C handling), SIGHUP (the terminal or the
 * ssh session went away), SIGPIPE (stdout is a pipe whose reader ended, as with `| head`),
 * SIGUSR1 (Slurm's --signal warning; mpirun forwards it to every rank as it is) and SIGINT
 * (Ctrl-C). */
enum { MGT_STOP_SIGNALS = 5 };
/* SIGTERM, SIGHUP, SIGPIPE, SIGUSR1, SIGINT: the most urgent first. */
extern const int mgt_stop_signals[MGT_STOP_SIGNALS];

typedef struct mgt_runtime {
    int rank, world;            /* in MPI_COMM_WORLD */
    int local_rank, local_size; /* on this node */
    int node, nodes;            /* this node's index, node count */
    int max_local_size;         /* most ranks on any node */
    char host[64];
    int launched; /* started by mpirun/srun (seen before MPI_Init) */
    int mpi;      /* MPI was initialised (launched) */
    int own_mpi;  /* by mgt_runtime_init, which then also finalises it */
    MPI_Comm node_comm;
    /* While stop signals are caught (mgt_runtime_catch_stops): the dispositions they replaced. */
    int stops_caught;
    struct sigaction stop_saved[MGT_STOP_SIGNALS];
    /* While this rank's process group holds the terminal (mgt_runtime_catch_stops): SIGTSTP's
     * disposition it replaced. */
    int tty_held;
    struct sigaction tstp_saved;
    /* SIGXFSZ's, replaced for the runtime's life (mgt_runtime_init). */
    int xfsz_ignored;
    struct sigaction xfsz_saved;
} mgt_runtime;

/* Also ignores SIGXFSZ until mgt_runtime_finalize: a write past the file-size limit (ulimit -f)
 * then fails with EFBIG, and the writer removes its temporary file and says so, instead of the
 * signal killing the process in the middle of a file. */
void mgt_runtime_init(mgt_runtime *rt, int *argc, char ***argv);
void mgt_runtime_finalize(mgt_runtime *rt);

/* Stop requests. While caught, a stop signal only records that it came: the training loop asks
 * mgt_stop_signal() at each step, the ranks agree on the stop through the step's all-reduce, save
 * a checkpoint and exit with 128 + the signal's number. A second SIGINT while a stop is pending
 * ends the process at once (exit 130, the run folder's lock removed), for a step that takes too
 * long. Training catches them from the moment it holds its run folder until it has let it go;
 * outside (start-up, evaluation, prediction) the signals keep their default effect: there is
 * nothing to save and no folder to leave clean.
 *
 * Ctrl-C under mpirun. A terminal sends SIGINT to its foreground process group, which under
 * Open MPI's mpirun holds mpirun alone: mpirun starts each rank in a process group of its own,
 * and takes SIGINT (and SIGTERM, SIGHUP) as the order to end the job: SIGCONT to every rank at
 * once, SIGTERM odls_base_sigkill_timeout (1 s) later, SIGKILL as long again, and an exit status
 * of 1 whatever the ranks' (Open MPI 4.1: orte/mca/ess/hnp's clean_abort, odls_base's
 * kill_local_procs). A step and a checkpoint rarely fit in that second. So where mpirun (this
 * rank's parent) is the terminal's foreground, catching the stops is collective over the node:
 * the node's ranks join the process group of the first of them and make it the terminal's
 * foreground, and Ctrl-C reaches them, as it reaches a run without a launcher, while mpirun
 * waits for them to end; their exit status (130) becomes mpirun's. The terminal goes back to
 * mpirun when the stops are released and on every ending mgtrain controls. Meanwhile SIGTSTP
 * (Ctrl-Z) is ignored: the ranks alone would stop, mpirun and the shell would not know, and the
 * terminal would hang. Not done where the terminal stops a background writer (stty tostop:
 * mpirun would stop when it next prints) or does not send signals at all (-isig), nor under
 * srun or a job scheduler (no terminal): there SIGINT reaches the ranks as it is (srun -X's
 * Ctrl-C) or through launch/mgtrun, which relays it.
 * mgt_runtime_release_stops restores what was there before (a program using libmgt may have
 * handlers of its own). */
void mgt_runtime_catch_stops(mgt_runtime *rt);
void mgt_runtime_release_stops(mgt_runtime *rt);
/* The first stop signal caught on this rank since mgt_runtime_catch_stops, or 0. */
int mgt_stop_signal(void);
/* "SIGTERM", "SIGHUP", "SIGPIPE", "SIGUSR1", "SIGINT" (or "a signal"), for messages. */
const char *mgt_signal_name(int sig);

/* Cores this rank may use for BLAS threads: its CPU affinity, shared with the other ranks of the
 * node when they were not bound to separate cores. */
int mgt_runtime_cores(const mgt_runtime *rt);

/* Errors come in two tiers (STYLE.md, "Errors, two tiers"):
 *
 * mgt_die: an error this rank meets alone (its own I/O, a dead peer, a device fault). Prints
 * "rank R: <message>" and ends the WHOLE job with MPI_Abort, or, in a world of one, exits 1.
 *
 * mgt_die_all: an error every rank meets in the same way at the same point (a bad flag, model
 * file, data set or output folder). Rank 0 prints "mgtrain: <message>" once; every rank then
 * leaves through MPI_Finalize and exit(2), like argparse: no MPI_Abort, so Open MPI prints no
 * abort banner and nothing races the message. MPI_Finalize waits for every rank; should one rank
 * not arrive within MGT_DIE_ALL_GRACE_S seconds (the error was not symmetric after all), the
 * waiting rank prints its message as "rank R: ..." and exits 2 without finalising, which makes
 * the launcher end the job: misuse costs the grace period, never a hang.
 *
 * Under mpirun, Open MPI itself still reports a non-zero exit status ("mpirun detected that one
 * or more processes exited with non-zero status") after the message, whatever the ranks do,
 * unless it runs quiet (mpirun -q); launch/mgtrun leaves those boxes out. Both never return. */
void mgt_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
void mgt_die_all(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
#define MGT_DIE_ALL_GRACE_S 30

/* For an error only rank 0 can see (a file it alone reads or writes, the output folder it
 * creates) that should still end the job as mgt_die_all does. Collective: every rank calls it at
 * the same point. Rank 0 passes its error message, or NULL when all is well (the other ranks'
 * argument is ignored); when rank 0 passed a message, every rank ends through mgt_die_all with
 * it, otherwise the call returns everywhere. */
void mgt_die_all_if_root(const char *root_msg);

/* The run folder's lock file this process holds (rundir.c sets it, NULL when it lets go): the
 * endings that never return to the trainer's clean-up (mgt_die, mgt_die_all, a second Ctrl-C,
 * the communication watchdog) remove it on their way out, so that no exit mgtrain controls
 * leaves it behind. */
void mgt_runtime_hold_lock(const char *path);
/* _exit(status), the held lock removed first: for a thread that must end the process at once. */
void mgt_runtime_exit_now(int status) __attribute__((noreturn));

/* Prints on rank 0 only. */
void mgt_log0(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
