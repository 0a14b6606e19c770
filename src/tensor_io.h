/* tensor_io.h: safetensors files (weights, checkpoints), .npy outputs, and files written or read
 * whole.
 *
 * safetensors: 8-byte little-endian header length, a JSON header (cJSON) mapping each tensor
 * name to {"dtype":"F32","shape":[...],"data_offsets":[begin,end]} plus "__metadata__" (string
 * values only), padded with spaces, then the raw little-endian data. The reader accepts what the
 * safetensors reference reader accepts, F32 only: no name twice, the tensors' data tiling the
 * data section exactly (no overlap, no gap, nothing after the last tensor).
 *
 * Integrity. The writer adds two metadata entries:
 *   "crc32":        8 lowercase hex digits, the zlib CRC-32 of the canonical header followed by
 *                   the data section;
 *   "crc32_covers": "header,data".
 * The canonical header is the parsed header printed by cJSON without whitespace (keys in file
 * order, numbers and strings as cJSON prints them) with the crc32 value replaced by "00000000";
 * for a file mgtrain wrote it is the header exactly as written. So every tensor name, dtype,
 * shape and offset and every metadata value (a checkpoint's step, epoch, optimizer...) is covered
 * as well as every data byte; the length prefix and the padding are checked by the parse. The
 * reader tells the cases apart by the metadata:
 *   - crc32 with crc32_covers = "header,data": the check above (files this version writes);
 *   - crc32 alone: the CRC of the data section only (checkpoints of mgtrain 0.1.0);
 *   - no crc32: accepted only if the file is not marked as mgtrain's, i.e. it has no
 *     crc32_covers and its "format" does not start with "mgtrain" (checkpoints are
 *     "mgtrain-checkpoint-N"): weights PyTorch or another tool wrote load for --init-weights and
 *     --weights, while a checkpoint whose crc32 was removed is refused.
 *
 * Every write is atomic: PATH.tmp.<pid> is written, fsync'ed, renamed onto PATH and the directory
 * fsync'ed, so a crash leaves the old file or the new one, never half of one. A failed write
 * removes its temporary file and leaves PATH as it was. Only regular files (or new names) are
 * written: a PATH that is a device, folder or pipe is refused, never replaced. */
#ifndef MGT_TENSOR_IO_H
#define MGT_TENSOR_IO_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

#define MGT_MAX_DIMS 4

typedef struct mgt_tensor_entry {
    char name[128];
    int ndim;
    int64_t shape[MGT_MAX_DIMS];
    const float *data; /* writer: host data; reader: points into the file's loaded data */
    /* reader: the tensor's dtype as the file names it ("F32"); mgt_safetensors_read_any's
     * non-float tensors have data NULL */
    char dtype[8];
} mgt_tensor_entry;

typedef struct mgt_meta_entry {
    char key[64];
    char value[256];
} mgt_meta_entry;

/* Writes tensors in the order given, with the metadata pairs, atomically. */
int mgt_safetensors_write(const char *path, const mgt_tensor_entry *t, int nt,
                          const mgt_meta_entry *meta, int nmeta, mgt_err *err);

/* A loaded file: the entries' data pointers point into `blob`. */
typedef struct mgt_safetensors {
    mgt_tensor_entry *t;
    int nt;
    mgt_meta_entry *meta;
    int nmeta;
    void *blob;
    float *converted; /* mgt_safetensors_read_any: the F16, BF16 and F64 tensors as float32 */
} mgt_safetensors;

/* Reads and validates the whole file, which must be a regular file: header length within the
 * file, JSON well-formed, every tensor F32 with offsets inside the data and matching its shape,
 * no name twice, the data tiled exactly, the CRC as above. Errors name the file and what is wrong
 * ("... is truncated", "... CRC mismatch: the file is damaged"). */
int mgt_safetensors_read(const char *path, mgt_safetensors *st, mgt_err *err);
/* The same for weights written by other tools (--init-weights): tensors of any dtype the
 * safetensors format names; F16, BF16 and F64 ones are converted to float32 (data points to the
 * copy), integer and boolean ones (PyTorch's num_batches_tracked) are listed with data NULL. */
int mgt_safetensors_read_any(const char *path, mgt_safetensors *st, mgt_err *err);
/* The same checks on a file's bytes already in memory (`name` for messages); the data is copied,
 * bytes may be freed afterwards. */
int mgt_safetensors_parse(const char *name, const void *bytes, size_t size, mgt_safetensors *st,
                          mgt_err *err);
const mgt_tensor_entry *mgt_safetensors_find(const mgt_safetensors *st, const char *name);
const char *mgt_safetensors_meta(const mgt_safetensors *st, const char *key); /* NULL if absent */
void mgt_safetensors_free(mgt_safetensors *st);

/* Writes a float32 .npy (format 1.0, little-endian, C order) of shape [rows][cols], atomically. */
int mgt_npy_write(const char *path, const float *data, int64_t rows, int64_t cols, mgt_err *err);
/* Writes a .npy of dtype descr ("|u1", "<i4", ...) and shape[ndim] (at most 8 dimensions)
 * whose data is the nparts byte ranges parts[i] of lens[i] bytes in order (their total must be
 * the shape's), atomically. */
int mgt_npy_write_parts(const char *path, const char *descr, const int64_t *shape, int ndim,
                        int nparts, const void *const *parts, const size_t *lens, mgt_err *err);

/* A text file read whole: regular files only (a pipe would block, a device never end), at most
 * max_bytes. *text is NUL-terminated; free it. `what` names the file in messages. */
int mgt_read_text_file(const char *path, const char *what, size_t max_bytes, char **text,
                       size_t *len, mgt_err *err);

/* Writes `len` bytes to path atomically (temporary file, fsync, rename, directory fsync). */
int mgt_atomic_write(const char *path, const void *data, size_t len, mgt_err *err);

/* Whether the writers above may write `path`: it must be a new name, or a regular file (or a
 * symbolic link to one: the link is kept and its target replaced). Anything
 * else, a device such as /dev/null, a folder, a pipe or a socket, is refused: the rename would
 * replace it with a regular file. Every writer checks this itself; callers use it to refuse a
 * bad path before any work. `what` (e.g. "--timeline", may be NULL) starts the message. */
int mgt_output_check(const char *path, const char *what, mgt_err *err);

#endif
