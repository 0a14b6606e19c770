/* outputs.c: the checks of an output path before any work (outputs.h). */
#include "outputs.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/dataset.h"
#include "data/images.h"
#include "profile.h"
#include "rundir.h"
#include "tensor_io.h"

int mgt_timeline_is_ours(const char *path) {
    char head[sizeof MGT_TIMELINE_HEAD];
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(head, 1, sizeof head - 1, f) : 0;
    if (f)
        fclose(f);
    return n == sizeof head - 1 && !memcmp(head, MGT_TIMELINE_HEAD, n);
}

/* Both name one existing file (links followed). */
static int same_file(const char *a, const char *b) {
    struct stat x, y;
    return stat(a, &x) == 0 && stat(b, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

/* PATH as an absolute path with every link resolved: realpath of its longest part that exists,
 * then the rest, "." dropped and ".." taking off the last name (names that do not exist yet
 * cannot be links). */
void mgt_path_resolve(const char *path, char *out, size_t n) {
    char abs[2 * PATH_MAX], cwd[PATH_MAX];
    if (path[0] == '/' || !getcwd(cwd, sizeof cwd))
        snprintf(abs, sizeof abs, "%s", path);
    else
        snprintf(abs, sizeof abs, "%s/%s", cwd, path);
    const size_t total = strlen(abs);
    /* Names are cut off the end until what is left exists; they stay in abs, after NULs. */
    size_t head = total;
    char *real;
    while (!(real = realpath(abs, NULL))) {
        char *slash = strrchr(abs, '/');
        if (!slash || slash == abs) {
            real = strdup("/");
            head = 0;
            break;
        }
        *slash = 0;
        head = (size_t)(slash - abs);
    }
    snprintf(out, n, "%s", real ? real : "/");
    free(real);
    for (size_t at = head + 1; at < total; at += strlen(abs + at) + 1) {
        const char *name = abs + at;
        size_t len = strlen(out);
        if (!strcmp(name, "..")) {
            char *s = strrchr(out, '/');
            if (s)
                s[s == out] = 0; /* "/a/b" -> "/a", "/a" -> "/" */
        } else if (*name && strcmp(name, ".")) {
            snprintf(out + len, n - len, "%s%s", out[len - 1] == '/' ? "" : "/", name);
        }
    }
}

/* The folder and the name of a resolved path. */
static void split(const char *resolved, char *dir, size_t n, const char **name) {
    const char *slash = strrchr(resolved, '/');
    snprintf(dir, n, "%.*s", slash == resolved ? 1 : (int)(slash - resolved), resolved);
    *name = slash + 1;
}

static int is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* The file the command reads that out is, if any: -1 with the refusal. */
static int check_reads(const mgt_outputs_plan *p, const mgt_output *o, mgt_err *err) {
    for (int i = 0; i < p->nreads; i++)
        if (p->reads[i] && same_file(o->path, p->reads[i]))
            return mgt_errf(err,
                            "%s %s is %s%s%s: writing it would replace what this command "
                            "reads; name another file",
                            o->flag, o->path, p->read_what[i],
                            strcmp(o->path, p->reads[i]) ? ", " : "",
                            strcmp(o->path, p->reads[i]) ? p->reads[i] : "");
    char data[PATH_MAX + 64];
    for (int i = 0; p->data_dir && mgt_dataset_file(p->data_dir, i, data, sizeof data) == 0; i++)
        if (data[0] && same_file(o->path, data))
            return mgt_errf(err,
                            "%s %s is the data file %s of --data %s: writing it would replace "
                            "the data; name another file",
                            o->flag, o->path, data, p->data_dir);
    /* An image set's files are its manifest's and the shards it names: any file in the set. */
    struct stat sb;
    if (p->data_dir && mgt_images_dir(p->data_dir) && stat(o->path, &sb) == 0) {
        char set[PATH_MAX], real[PATH_MAX];
        mgt_path_resolve(p->data_dir, set, sizeof set);
        mgt_path_resolve(o->path, real, sizeof real);
        const size_t n = strlen(set);
        if (!strncmp(real, set, n) && real[n] == '/')
            return mgt_errf(err,
                            "%s %s is a file of the image set --data %s: writing it would "
                            "replace the data; name another file",
                            o->flag, o->path, p->data_dir);
    }
    return 0;
}

/* A file mgtrain keeps in a run folder (this run's, which may not exist yet, or another's): -1
 * with the refusal. dir and name: the output's resolved folder and name. */
static int check_run_folders(const mgt_outputs_plan *p, const mgt_output *o, const char *dir,
                             const char *name, mgt_err *err) {
    char run[PATH_MAX], tb[PATH_MAX + 8], up[PATH_MAX];
    const char *tail;
    if (p->run_dir) {
        mgt_path_resolve(p->run_dir, run, sizeof run);
        snprintf(tb, sizeof tb, "%s/tb", run);
        if ((!strcmp(dir, run) && mgt_rundir_keeps(run, name, p->model_copy)) || !strcmp(dir, tb))
            return mgt_errf(err,
                            "%s %s is a file this run keeps in its folder %s; name another file "
                            "(e.g. %s/%s)",
                            o->flag, o->path, p->run_dir, p->run_dir,
                            strcmp(o->flag, "--timeline") ? "output.npy" : "timeline.json");
    }
    /* Another run's folder, or its tb/. */
    split(dir, up, sizeof up, &tail);
    const char *folder = mgt_rundir_is_run(dir) && mgt_rundir_keeps(dir, name, NULL) ? dir
                         : !strcmp(tail, "tb") && mgt_rundir_is_run(up)              ? up
                                                                                     : NULL;
    if (folder)
        return mgt_errf(err,
                        "%s %s is a file mgtrain keeps in the run folder %s: writing it would "
                        "replace that run's; name another file",
                        o->flag, o->path, folder);
    return 0;
}

/* A file of an image set (mgtrain convert's: images.h), whichever set it is and whatever
 * --overwrite says: the set cannot be made whole again but by converting it anew. And a run
 * folder that is an image set's (the two would share a folder that neither can clear). */
static int check_image_sets(const mgt_outputs_plan *p, const mgt_output *o, const char *dir,
                            const char *name, mgt_err *err) {
    if (o && mgt_images_dir(dir) && mgt_images_keeps(name))
        return mgt_errf(err,
                        "%s %s is a file of the image set in %s (mgtrain convert's): writing it "
                        "would break that set; name another file",
                        o->flag, o->path, dir);
    if (!o && p->run_dir && mgt_images_dir(p->run_dir))
        return mgt_errf(err,
                        "--out %s holds an image set (mgtrain convert's); train into another "
                        "folder (e.g. runs/NAME)",
                        p->run_dir);
    return 0;
}

/* The folder can take a new file: one is made there and removed (the writer's own temporary
 * name), or it is this run's folder, which training makes. */
static int check_writable(const mgt_outputs_plan *p, const mgt_output *o, const char *dir,
                          const char *name, mgt_err *err) {
    if (!is_dir(dir)) {
        char run[PATH_MAX];
        if (p->run_dir) {
            mgt_path_resolve(p->run_dir, run, sizeof run);
            if (!strcmp(dir, run))
                return 0;
        }
        return mgt_errf(err,
                        "%s %s: the folder %s does not exist; create it, or name a file in a "
                        "folder that does",
                        o->flag, o->path, dir);
    }
    char probe[2 * PATH_MAX];
    snprintf(probe, sizeof probe, "%s/%s.tmp.%ld", dir, name, (long)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return mgt_errf(err, "%s %s: cannot write in %s (%s); name a file in a writable folder",
                        o->flag, o->path, dir, strerror(errno));
    close(fd);
    unlink(probe);
    return 0;
}

/* The run folder is an output too: training writes its files there, and --overwrite removes the
 * old run's first, so a file the command reads must not be one of them (--init-weights
 * runs/mlp/weights.safetensors with --out runs/mlp). The model file as the run's own model copy
 * is left alone: it is written back with the text it holds. */
static int check_reads_in_run(const mgt_outputs_plan *p, mgt_err *err) {
    if (!p->run_dir)
        return 0;
    char run[PATH_MAX], real[PATH_MAX], dir[PATH_MAX];
    const char *name;
    mgt_path_resolve(p->run_dir, run, sizeof run);
    for (int i = 0; i < p->nreads; i++) {
        mgt_path_resolve(p->reads[i], real, sizeof real);
        split(real, dir, sizeof dir, &name);
        if (!strcmp(dir, run) && mgt_rundir_keeps(run, name, p->model_copy) &&
            strcmp(name, p->model_copy ? p->model_copy : ""))
            return mgt_errf(err,
                            "%s %s is a file of the run folder %s, which this run writes (and "
                            "--overwrite empties first); copy it elsewhere, or train into "
                            "another --out",
                            p->read_what[i], p->reads[i], p->run_dir);
    }
    return 0;
}

int mgt_outputs_check(const mgt_outputs_plan *p, mgt_err *err) {
    if (check_reads_in_run(p, err) < 0 || check_image_sets(p, NULL, NULL, NULL, err) < 0)
        return -1;
    for (int k = 0; k < p->nout; k++) {
        const mgt_output *o = &p->out[k];
        char real[PATH_MAX], dir[PATH_MAX];
        const char *name;
        if (mgt_output_check(o->path, o->flag, err) < 0 || check_reads(p, o, err) < 0)
            return -1;
        mgt_path_resolve(o->path, real, sizeof real);
        split(real, dir, sizeof dir, &name);
        if (check_run_folders(p, o, dir, name, err) < 0 ||
            check_image_sets(p, o, dir, name, err) < 0)
            return -1;
        struct stat sb;
        if (!p->overwrite && stat(o->path, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size > 0 &&
            !(o->ours && o->ours(o->path)))
            return mgt_errf(err,
                            "%s %s already holds %lld bytes%s; pass --overwrite to replace it, "
                            "or name a new file",
                            o->flag, o->path, (long long)sb.st_size,
                            o->ours ? " that mgtrain did not write" : "");
        if (check_writable(p, o, dir, name, err) < 0)
            return -1;
    }
    return 0;
}
