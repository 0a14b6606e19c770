/* runtime.c: MPI start-up, node-local ranks, core counts, stop signals, and ending the job
 * on error (the two tiers runtime.h describes: MPI_Abort for one rank's failure,
 * MPI_Finalize and exit(2) on every rank for an error they all meet). */
#define _GNU_SOURCE
#include "runtime.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

/* torchrun's (and torch.distributed's) variables, set for a process no MPI launcher started: the
 * user meant a multi-rank run, but every such process is a world of one here, and they would all
 * train the same model alone into the same folder. Said once, with the launcher to use. */
static void warn_foreign_launcher(void) {
    const char *ws = getenv("WORLD_SIZE"), *rank = getenv("RANK");
    long n = ws ? strtol(ws, NULL, 10) : 0;
    if (n <= 1)
        return;
    fprintf(stderr,
            "mgtrain: warning: WORLD_SIZE=%s%s%s is set (as torchrun sets it), but mgtrain takes "
            "its ranks from MPI and no MPI launcher started this process, so it trains alone, as "
            "a world of one; start the %ld ranks with mpirun -np %ld mgtrain ... (or srun "
            "--mpi=pmix, or launch/mgtrun -np %ld)\n",
            ws, rank ? " RANK=" : "", rank ? rank : "", n, n, n);
    fflush(stderr);
}

void mgt_runtime_init(mgt_runtime *rt, int *argc, char ***argv) {
    memset(rt, 0, sizeof *rt);
    struct sigaction ign;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    rt->xfsz_ignored = sigaction(SIGXFSZ, &ign, &rt->xfsz_saved) == 0;
    /* Before MPI_Init: a singleton's MPI_Init sets these variables itself. A program using
     * libmgt may have started MPI already: then it is used, and left to that program to end. */
    int started = 0;
    MPI_Initialized(&started);
    rt->own_mpi = !started;
    rt->launched = started || getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") ||
                   getenv("PMI_RANK") || getenv("SLURM_STEP_ID");
    if (gethostname(rt->host, sizeof rt->host - 1) != 0)
        snprintf(rt->host, sizeof rt->host, "unknown");
    rt->world = rt->local_size = rt->nodes = rt->max_local_size = 1;
    if (!rt->launched) {
        warn_foreign_launcher();
        return;
    }
    rt->mpi = 1;
    int provided = 0;
    /* SERIALIZED: the main thread calls MPI, and so may comm.c's progress thread
     * (--comm-progress thread), never at the same time as another (comm.c's lock); the watchdog
     * and loader threads never do. */
    if (rt->own_mpi)
        MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rt->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &rt->world);
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rt->rank, MPI_INFO_NULL,
                        &rt->node_comm);
    MPI_Comm_rank(rt->node_comm, &rt->local_rank);
    MPI_Comm_size(rt->node_comm, &rt->local_size);
    /* Node index: the leaders (local rank 0) number themselves in world-rank order. */
    int leader = rt->local_rank == 0, before = 0;
    MPI_Exscan(&leader, &before, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rt->rank == 0)
        before = 0;
    int node = before;
    MPI_Bcast(&node, 1, MPI_INT, 0, rt->node_comm);
    rt->node = node;
    MPI_Allreduce(&leader, &rt->nodes, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&rt->local_size, &rt->max_local_size, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
}

void mgt_runtime_finalize(mgt_runtime *rt) {
    if (rt->xfsz_ignored)
        sigaction(SIGXFSZ, &rt->xfsz_saved, NULL);
    rt->xfsz_ignored = 0;
    if (!rt->mpi)
        return;
    MPI_Comm_free(&rt->node_comm);
    if (rt->own_mpi)
        MPI_Finalize();
}

int mgt_runtime_cores(const mgt_runtime *rt) {
    cpu_set_t set;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int mine = (int)online;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        mine = CPU_COUNT(&set);
    /* Unbound ranks all see every core: share them out. Bound ranks see their own. */
    if (mine >= online && rt->local_size > 1)
        mine = (int)online / rt->local_size;
    return mine < 1 ? 1 : mine;
}

const int mgt_stop_signals[MGT_STOP_SIGNALS] = {SIGTERM, SIGHUP, SIGPIPE, SIGUSR1, SIGINT};

/* The process-wide mutable state of mgtrain, all here: a signal handler can reach nothing else
 * (POSIX lets it store to a volatile sig_atomic_t and call a few functions such as write, unlink
 * and _exit), and neither can mgt_die, which any module calls without a context.
 *
 * caught_stop: set by the handler, read through mgt_stop_signal, cleared when stops are caught
 * anew. held_lock: the path of the run folder's lock this process holds, valid while lock_held
 * is set (mgt_runtime_hold_lock). */
static volatile sig_atomic_t caught_stop;
static char held_lock[1024];
static volatile sig_atomic_t lock_held;
/* The controlling terminal while this rank's process group holds its foreground (take_terminal),
 * and the process group to give it back to (the launcher's); tty_fd -1: not held. */
static volatile sig_atomic_t tty_fd = -1;
static volatile sig_atomic_t tty_owner = -1;

void mgt_runtime_hold_lock(const char *path) {
    lock_held = 0;
    if (path && strlen(path) < sizeof held_lock) {
        memcpy(held_lock, path, strlen(path) + 1);
        lock_held = 1;
    }
}

/* Async-signal-safe: unlink only. */
static void drop_held_lock(void) {
    if (lock_held) {
        lock_held = 0;
        unlink(held_lock);
    }
}

/* Async-signal-safe (tcgetpgrp, tcsetpgrp, pthread_sigmask, close): the terminal back to the
 * launcher, if this process's group still holds it. SIGTTOU is blocked in case another process
 * took the terminal meanwhile: from the background the call fails instead of stopping us. */
static void give_back_terminal(void) {
    const int fd = tty_fd;
    if (fd < 0)
        return;
    tty_fd = -1;
    sigset_t ttou, old;
    sigemptyset(&ttou);
    sigaddset(&ttou, SIGTTOU);
    pthread_sigmask(SIG_BLOCK, &ttou, &old);
    if (tcgetpgrp(fd) == getpgrp())
        (void)tcsetpgrp(fd, (pid_t)tty_owner);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    close(fd);
}

void mgt_runtime_exit_now(int status) {
    drop_held_lock();
    give_back_terminal();
    _exit(status);
}

/* runtime.h, "Ctrl-C under mpirun": collective over the node's ranks. */
static void take_terminal(mgt_runtime *rt) {
    if (!rt->mpi)
        return;
    /* mine: whether this rank may take the terminal, and its process group. */
    int mine[2] = {0, (int)getpgrp()};
    const pid_t launcher = getpgid(getppid());
    const int fd = open("/dev/tty", O_RDWR | O_NOCTTY | O_CLOEXEC);
    struct termios t;
    if (fd >= 0 && launcher > 0 && tcgetpgrp(fd) == launcher && launcher != getpgrp() &&
        tcgetattr(fd, &t) == 0)
        mine[0] = (t.c_lflag & ISIG) && !(t.c_lflag & TOSTOP);
    int *all = malloc(sizeof(int) * 2 * (size_t)rt->local_size);
    if (!all)
        mgt_die("out of memory for %d local ranks", rt->local_size);
    MPI_Allgather(mine, 2, MPI_INT, all, 2, MPI_INT, rt->node_comm);
    int lead = -1;
    for (int i = 0; i < rt->local_size && lead < 0; i++)
        if (all[2 * i])
            lead = i;
    const pid_t group = lead >= 0 ? (pid_t)all[2 * lead + 1] : -1;
    free(all);
    if (lead < 0) {
        if (fd >= 0)
            close(fd);
        return;
    }
    /* The node's ranks that may join the first one's group (one session: mpirun's); then that
     * one, from the background, makes its group the terminal's foreground. */
    int joined = mine[0] && (group == getpgrp() || setpgid(0, group) == 0);
    int held = 0;
    if (rt->local_rank == lead) {
        sigset_t ttou, old;
        sigemptyset(&ttou);
        sigaddset(&ttou, SIGTTOU);
        pthread_sigmask(SIG_BLOCK, &ttou, &old);
        held = tcsetpgrp(fd, group) == 0;
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    MPI_Bcast(&held, 1, MPI_INT, lead, rt->node_comm);
    if (!held || !joined) {
        if (fd >= 0)
            close(fd);
        return;
    }
    tty_owner = launcher;
    tty_fd = fd;
    struct sigaction ign;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGTSTP, &ign, &rt->tstp_saved);
    rt->tty_held = 1;
}

static void on_stop(int sig) {
    if (caught_stop && sig == SIGINT) {
        static const char msg[] = "\nmgtrain: second Ctrl-C: stopping at once, without saving\n";
        ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
        (void)w;
        mgt_runtime_exit_now(128 + SIGINT);
    }
    if (!caught_stop)
        caught_stop = sig;
}

void mgt_runtime_catch_stops(mgt_runtime *rt) {
    if (rt->stops_caught)
        return;
    caught_stop = 0;
    /* SA_RESTART: a system call the signal lands in (a read, a write of the checkpoint) goes on
     * instead of failing with EINTR; whichever thread receives it (MPI's, OpenBLAS's, the
     * loader's) only runs the handler. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < MGT_STOP_SIGNALS; i++)
        sigaddset(&sa.sa_mask, mgt_stop_signals[i]);
    for (int i = 0; i < MGT_STOP_SIGNALS; i++)
        if (sigaction(mgt_stop_signals[i], &sa, &rt->stop_saved[i]) != 0)
            mgt_die("cannot catch %s: %s", mgt_signal_name(mgt_stop_signals[i]), strerror(errno));
    rt->stops_caught = 1;
    take_terminal(rt);
}

void mgt_runtime_release_stops(mgt_runtime *rt) {
    if (!rt->stops_caught)
        return;
    if (rt->tty_held) {
        give_back_terminal();
        sigaction(SIGTSTP, &rt->tstp_saved, NULL);
        rt->tty_held = 0;
    }
    for (int i = 0; i < MGT_STOP_SIGNALS; i++)
        sigaction(mgt_stop_signals[i], &rt->stop_saved[i], NULL);
    rt->stops_caught = 0;
}

int mgt_stop_signal(void) {
    return caught_stop;
}

const char *mgt_signal_name(int sig) {
    switch (sig) {
    case SIGTERM:
        return "SIGTERM";
    case SIGHUP:
        return "SIGHUP";
    case SIGPIPE:
        return "SIGPIPE";
    case SIGUSR1:
        return "SIGUSR1";
    case SIGINT:
        return "SIGINT";
    default:
        return "a signal";
    }
}

/* MPI is initialised and not yet finalised. */
static int mpi_live(void) {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    return init && !fin;
}

static int world_info(int *rank) {
    int world = 1;
    *rank = 0;
    if (mpi_live()) {
        MPI_Comm_rank(MPI_COMM_WORLD, rank);
        MPI_Comm_size(MPI_COMM_WORLD, &world);
    }
    return world;
}

static void vreport(const char *prefix, int rank, const char *msg) {
    fflush(stdout);
    if (prefix)
        fprintf(stderr, "%s: %s\n", prefix, msg);
    else
        fprintf(stderr, "rank %d: %s\n", rank, msg);
    fflush(stderr);
}

/* Who failed and why: the rank, the world and the formatted message. */
typedef struct failure {
    int rank, world;
    char msg[2048];
} failure;

static void describe(failure *f, const char *fmt, va_list ap) {
    f->world = world_info(&f->rank);
    vsnprintf(f->msg, sizeof f->msg, fmt, ap);
}

void mgt_die(const char *fmt, ...) {
    failure f;
    va_list ap;
    va_start(ap, fmt);
    describe(&f, fmt, ap);
    va_end(ap);
    vreport(NULL, f.rank, f.msg);
    drop_held_lock();
    give_back_terminal();
    if (f.world > 1)
        MPI_Abort(MPI_COMM_WORLD, 1);
    if (mpi_live())
        MPI_Finalize();
    exit(1);
}

/* Runs only if MPI_Finalize has not returned after the grace period: some rank is not on its way
 * to mgt_die_all. The message must not be lost (rank 0 printed it; the others did not), and the
 * job must end: exiting without finalising makes the launcher take the whole job down. */
static void *grace_expired(void *arg) {
    const failure *g = arg; /* in mgt_die_all's frame, which never ends */
    struct timespec ts = {MGT_DIE_ALL_GRACE_S, 0};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    if (g->rank != 0)
        vreport(NULL, g->rank, g->msg);
    mgt_runtime_exit_now(2);
}

void mgt_die_all(const char *fmt, ...) {
    failure f;
    va_list ap;
    va_start(ap, fmt);
    describe(&f, fmt, ap);
    va_end(ap);
    if (f.rank == 0)
        vreport("mgtrain", f.rank, f.msg);
    fflush(stdout);
    drop_held_lock();
    give_back_terminal();
    if (mpi_live()) {
        pthread_t t;
        /* Without the thread a missing rank would hang the job: fall back to ending it now. */
        if (f.world > 1 && pthread_create(&t, NULL, grace_expired, &f) != 0) {
            if (f.rank != 0)
                vreport(NULL, f.rank, f.msg);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        MPI_Finalize();
    }
    exit(2);
}

void mgt_die_all_if_root(const char *root_msg) {
    int rank;
    int world = world_info(&rank);
    char msg[1024] = "";
    int failed = rank == 0 && root_msg != NULL;
    if (failed)
        snprintf(msg, sizeof msg, "%s", root_msg);
    if (world > 1) {
        MPI_Bcast(&failed, 1, MPI_INT, 0, MPI_COMM_WORLD);
        if (failed)
            MPI_Bcast(msg, (int)sizeof msg, MPI_CHAR, 0, MPI_COMM_WORLD);
    }
    if (failed)
        mgt_die_all("%s", msg);
}

void mgt_log0(const char *fmt, ...) {
    int rank;
    world_info(&rank);
    if (rank != 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}
