/* npy.h: reading NumPy .npy files (numpy.save's format, versions 1.0, 2.0 and 3.0) as read-only
 * memory maps, and datasets made of them.
 *
 * A .npy file is the magic "\x93NUMPY", a version (major, minor), the header's length (2 bytes
 * little-endian in 1.0, 4 bytes in 2.0 and 3.0), the header (a Python dict literal with exactly
 * the keys 'descr', 'fortran_order' and 'shape'), then the array's raw bytes. Nothing in the file
 * is trusted: the header must lie within the file, and the shape times the item size must be
 * exactly the bytes that follow it, before anything is mapped or allocated. */
#ifndef MGT_NPY_H
#define MGT_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "../util.h"

/* Arrays of more dimensions than this are refused (a dataset needs at most 4). */
#define MGT_NPY_MAX_DIMS 32

typedef struct mgt_npy {
    char descr[32]; /* the dtype as written, e.g. "<f4", "|u1" */
    char kind;      /* NumPy's kind letter: 'u', 'i', 'f', 'b', 'c', 'S', 'U', 'O', ... */
    int itemsize;   /* bytes per value */
    int big_endian; /* '>' byte order (values need swapping on this little-endian host) */
    int version;    /* major format version: 1, 2 or 3 */
    int ndim;
    int64_t shape[MGT_NPY_MAX_DIMS];
    int64_t count;       /* values: the product of the shape */
    int64_t offset;      /* where the data starts in the file */
    const uint8_t *data; /* count * itemsize bytes, read-only (they are the file's pages) */
    void *map;           /* the whole file's mapping (NULL for a file with no data) */
    size_t map_len;
} mgt_npy;

/* Opens PATH, validates it as above and maps it read-only (no page is read until it is used).
 * Only regular files: a FIFO or a device is refused without blocking. Errors name the file. */
int mgt_npy_open(mgt_npy *a, const char *path, mgt_err *err);
void mgt_npy_close(mgt_npy *a);

/* DIR/<split>_x.npy (xy = 'x') or DIR/<split>_y.npy (xy = 'y') into out; -1 if too long. */
int mgt_npy_split_path(char *out, size_t cap, const char *dir, const char *split, char xy);

/* NumPy's name of a dtype ("float64", "int32", "uint8", "bool", ...) for messages: the name when
 * it has one, else descr itself. */
const char *mgt_npy_dtype_name(const mgt_npy *a, char *buf, size_t cap);

#endif
