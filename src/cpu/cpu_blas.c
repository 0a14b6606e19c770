/* cpu_blas.c: which OpenBLAS kernel runs, and the right one where OpenBLAS does not know the CPU.
 *
 * OpenBLAS's DYNAMIC_ARCH build picks its kernels by CPU model, and a model newer than the
 * library is not in its tables: Debian 12's 0.3.21 runs the SSE3 Prescott kernel on Intel's
 * family 6 model 207 Xeons (Emerald Rapids: AVX-512, AMX), where its SkylakeX kernel is 5 times
 * faster (SGEMM 2048^3 on 2 cores: 58 against 290 GFLOP/s; the seed ConvNet with direct
 * convolutions 40 against 108 samples/s). The kernel is chosen in OpenBLAS's constructor, when
 * the library loads, before any of mgtrain runs, and the only way to choose another is the
 * environment variable OPENBLAS_CORETYPE, read there. So the program, at the very start of main
 * (before MPI starts and before it starts any thread), sets the variable to the kernel the CPU's
 * instruction sets call for and executes itself again, once: the new image loads OpenBLAS anew
 * and reads it. exec keeps the process id, its open files and its environment, so a launcher
 * (mpirun, srun with PMIx) sees the same process it started; nothing has connected to it yet.
 * The file executed is the program's own, by its path: the kernel names the process after the
 * path's last part (ps, top, pgrep), which through /proc/self/exe would be "exe".
 * The variable itself guards against a second round: it is set in the new image, and an
 * explicit OPENBLAS_CORETYPE (a user's choice, the test suite's kernel matrix) is never touched.
 * A library must not replace its host process, so libmgt never does this: its start-up block
 * (mgt_train_argv) says which variable to set instead, as mgtrain does where the exec fails.
 *
 * The kernels named are those whose instructions the CPU is checked for (and the OS enables):
 * AVX-512 F, BW, DQ and VL for SkylakeX, AVX2 and FMA for Haswell. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cpu_internal.h"

/* Set with OPENBLAS_CORETYPE before the exec: the kernel OpenBLAS had taken by itself, for the
 * start-up block's "why". */
#define BLAS_FROM_ENV "MGT_OPENBLAS_FALLBACK"

/* The kernel OpenBLAS runs in this process (its own name for it; "" if it does not say). */
static const char *blas_core(void) {
    const char *core = openblas_get_corename();
    return core ? core : "";
}

/* 1 when `core` is one of the kernels OpenBLAS falls back to on a CPU it does not know, or one
 * older than any CPU that has AVX2. */
static int blas_is_old(const char *core) {
    static const char *const old[] = {"Prescott",  "Core2",  "Penryn",      "Dunnington",
                                      "Nehalem",   "Atom",   "Katmai",      "Coppermine",
                                      "Northwood", "Banias", "Sandybridge", NULL};
    for (int i = 0; old[i]; i++)
        if (!strcmp(core, old[i]))
            return 1;
    return 0;
}

/* The instruction sets that OpenBLAS's newer x86 kernels need, by level: 2 AVX-512 F, BW, DQ
 * and VL; 1 AVX2 and FMA; 0 neither. The level this CPU has (0 where the check cannot be made),
 * the kernel it calls for, and what a level needs, in words. */
static int cpu_level(void) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return 2;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return 1;
#endif
    return 0;
}
static const char *const level_kernel[] = {NULL, "Haswell", "SkylakeX"};
static const char *const level_needs[] = {NULL, "AVX2 and FMA", "AVX-512 (F, BW, DQ and VL)"};

/* The level a kernel's code needs (0 for the kernels not listed). */
static int kernel_level(const char *core) {
    static const struct {
        const char *name;
        int level;
    } kernels[] = {{"SkylakeX", 2}, {"Cooperlake", 2}, {"SapphireRapids", 2},
                   {"Haswell", 1},  {"Zen", 1}};
    for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++)
        if (!strcmp(core, kernels[i].name))
            return kernels[i].level;
    return 0;
}

/* The kernel this CPU's instruction sets call for, or NULL where none of the two applies (or
 * the check cannot be made). */
static const char *blas_fits(void) {
    return level_kernel[cpu_level()];
}

/* Where OPENBLAS_CORETYPE has made OpenBLAS take a kernel whose instructions this CPU lacks
 * (OpenBLAS takes any name it knows: its SkylakeX kernel on a CPU without AVX-512), the refusal,
 * in one line, into buf (n bytes); 1 then, else 0. Its first matrix product would stop the
 * process with an illegal instruction. */
int mgt_cpu_blas_unfit(char *buf, size_t n) {
    const char *set = getenv("OPENBLAS_CORETYPE"), *core = blas_core();
    if (!set || strcasecmp(core, set))
        return 0;
    const int need = kernel_level(core), have = cpu_level();
    if (need <= have)
        return 0;
    const char *fits = level_kernel[have];
    snprintf(buf, n,
             "OPENBLAS_CORETYPE=%s: OpenBLAS's %s kernel needs %s, which this CPU does not "
             "have, and would stop at its first matrix product (illegal instruction); unset "
             "OPENBLAS_CORETYPE%s%s",
             set, core, level_needs[need], fits ? " or set it to " : "", fits ? fits : "");
    return 1;
}

int mgt_cpu_blas_choose(char **argv) {
    char unfit[320];
    if (mgt_cpu_blas_unfit(unfit, sizeof unfit)) { /* (the program's name: mgtrain, a bench) */
        const char *prog = argv && argv[0] ? argv[0] : "mgtrain", *slash = strrchr(prog, '/');
        fprintf(stderr, "%s: %s\n", slash ? slash + 1 : prog, unfit);
        exit(2);
    }
    if (getenv("OPENBLAS_CORETYPE")) /* the user's choice, or ours on the second round */
        return 0;
    const char *core = blas_core(), *fits = blas_fits();
    if (!fits || !blas_is_old(core))
        return 0;
    if (setenv(BLAS_FROM_ENV, core, 1) == 0 && setenv("OPENBLAS_CORETYPE", fits, 1) == 0) {
        fflush(NULL);
        char path[4096];
        ssize_t len = readlink("/proc/self/exe", path, sizeof path - 1);
        struct stat named, running;
        if (len > 0) {
            path[len] = 0;
            /* the same file, not one put in its place since (or a "(deleted)" path) */
            if (stat(path, &named) == 0 && stat("/proc/self/exe", &running) == 0 &&
                named.st_dev == running.st_dev && named.st_ino == running.st_ino)
                execv(path, argv);
        }
        execv("/proc/self/exe", argv);
    }
    /* No exec (no /proc, say): carry on with OpenBLAS's choice; the start-up block says which
     * variable would do better. */
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv(BLAS_FROM_ENV);
    return -1;
}

int mgt_cpu_blas_notice(char *buf, size_t n) {
    const char *core = blas_core(), *fits = blas_fits(), *set = getenv("OPENBLAS_CORETYPE");
    const char *from = getenv(BLAS_FROM_ENV);
    if (set && from && fits && !strcmp(set, fits)) { /* the exec above */
        if (!strcmp(core, set)) {
            snprintf(buf, n, "OpenBLAS %s kernel (mgtrain's choice: OpenBLAS took %s on this CPU)",
                     core, from);
            return 0;
        }
        snprintf(buf, n, "OpenBLAS %s kernel: OpenBLAS ignored OPENBLAS_CORETYPE=%s", core, set);
        return 1;
    }
    if (set) {
        if (!strcasecmp(core, set))
            snprintf(buf, n, "OpenBLAS %s kernel (OPENBLAS_CORETYPE)", core);
        else
            snprintf(buf, n, "OpenBLAS %s kernel (OPENBLAS_CORETYPE=%s not taken)", core, set);
        return 0;
    }
    if (fits && blas_is_old(core)) {
        snprintf(buf, n, "OpenBLAS runs its %s kernel, not its %s one: set OPENBLAS_CORETYPE=%s",
                 core, fits, fits);
        return 1;
    }
    snprintf(buf, n, "OpenBLAS %s kernel", core);
    return 0;
}
