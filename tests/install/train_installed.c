/* train_installed.c: training from C through the INSTALLED libmgt (tests/cli/install.sh).
 *
 *   train_installed FLAGS...                    mgt_train_argv(argc, argv): `mgtrain train FLAGS`
 *   train_installed --twice FLAGS...            the same call twice: MPI, started and ended by
 *                                               the first, cannot start again; the second call
 *                                               must say so and return 2
 *   train_installed --caller-mpi OUT2 FLAGS...  MPI initialised here: training twice works, the
 *                                               second time with --out OUT2 added (the last
 *                                               --out wins), and MPI is still up after each
 *
 * Exit status: what the (last) call returned, or 1 when a check of this program failed. */
#include <mgtrain/mgt.h>

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--twice")) {
        argv[1] = argv[0]; /* the flags after --twice, behind a program name */
        int first = mgt_train_argv(argc - 1, argv + 1);
        int second = mgt_train_argv(argc - 1, argv + 1);
        printf("first call %d, second call %d\n", first, second);
        return first == 0 ? second : 1;
    }
    if (argc > 2 && !strcmp(argv[1], "--caller-mpi")) {
        int provided;
        MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
        const char *out2 = argv[2];
        argv[2] = argv[0];
        int rc = mgt_train_argv(argc - 2, argv + 2);
        int up = 0, down = 1;
        MPI_Initialized(&up);
        MPI_Finalized(&down);
        if (rc == 0 && up && !down) {
            char **again = calloc((size_t)argc + 1, sizeof *again);
            if (!again)
                return 1;
            int n = 0;
            for (int i = 2; i < argc; i++)
                again[n++] = argv[i];
            again[n++] = "--out";
            again[n++] = (char *)out2;
            rc = mgt_train_argv(n, again);
            free(again);
            MPI_Finalized(&down);
        }
        printf("MPI %s after training\n", down ? "finalised" : "still up");
        MPI_Finalize();
        return rc ? rc : down;
    }
    return mgt_train_argv(argc, argv);
}
