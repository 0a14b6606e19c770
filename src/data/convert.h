/* convert.h: `mgtrain convert SRC DST`: a folder of images, one sub-folder per class (Keras'
 * flow_from_directory, torchvision's ImageFolder), into an image set that training reads
 * (images.h).
 *
 * Classes are SRC's sub-folders in sorted order, numbered from 0; a class's images are every file
 * below its folder, recursively (symbolic links followed), in torchvision's order (folders by
 * path, files by name within each); names starting with '.' are left out. Names are ordered as
 * Python's sorted() orders the str that os.scandir gives: by code point, bytes that are not UTF-8
 * taken as U+DC80..U+DCFF (surrogateescape), so that ImageFolder's class numbers and order hold
 * for any name.
 *
 * DST must be absent, empty, or an image set whose split (if it has this one) was converted from
 * this SRC: anything else is refused before a byte is written, and nothing but the set's own
 * files (images.h: mgt_images_keeps) is ever removed. The manifest marks the split unfinished
 * before its first shard is written and finished after its last, so that a set whose conversion
 * was stopped is known as such. Each image is decoded (decode.h) and stored as RGB bytes, in
 * Pillow's arithmetic (resample.h): whole (the default), its short side resized to SIZE where it
 * is longer (torchvision's Resize(SIZE)), else as it is; or square (--square), its short side
 * resized to SIZE and its centre SIZE x SIZE kept (Resize(SIZE) then CenterCrop(SIZE)).
 *
 * DST then holds, for the split (train or test):
 *   classes.txt             the class names, one a line, line i being label i;
 *   <split>-NNNNN_x.npy     one shard of consecutive images: whole, uint8 (bytes,), the pictures
 *                           one after another; square, uint8 (n, SIZE, SIZE, 3);
 *   <split>-NNNNN_i.npy     whole only: int64 (n, 5), each picture's offset in _x, its stored
 *                           height and width, and the original's (images.h);
 *   <split>-NNNNN_y.npy     int32 (n,), their labels;
 *   <split>-NNNNN.json      the shard's record: its source files' signature, its images, and the
 *                           files it left out (--skip-bad);
 *   images.json             the manifest: stored size and layout, classes, and each split's
 *                           source, shards and whether it is complete;
 *   <split>_skipped.txt     with --skip-bad, the files left out and why.
 * A second split (the test or validation tree) goes into the same DST with --split test; its
 * classes must be among those of classes.txt and keep their numbers.
 *
 * Deterministic: the same files give the same bytes, whatever the thread count. Resumable: a
 * shard's files are written whole (temporary file, fsync, rename) and its record last, so a run
 * that was stopped is finished by running the same command again: the shards whose source files
 * are unchanged (path, size and modification time) are kept, the rest redone. */
#ifndef MGT_CONVERT_H
#define MGT_CONVERT_H

#include <stdint.h>

#include "../util.h"

typedef struct mgt_convert_opts {
    const char *src, *dst;
    const char *split;  /* "train" (default) or "test" */
    int size;           /* stored side in pixels (default 256) */
    int threads;        /* decoding threads (<= 0: the cores this process may use) */
    int64_t shard_size; /* images per shard (<= 0: about 256 MiB of them) */
    int skip_bad;       /* leave out (and list) unreadable files instead of stopping */
    int square;         /* store the centre square (today's layout) instead of the whole picture */
    int verbose;        /* 0 quiet, 1 progress bar, 2 lines (-1: bar on a terminal) */
    const char *host;   /* this machine's name, for DST's lock file */
} mgt_convert_opts;

/* Converts (see the top). Prints its progress and summary on stdout. Returns 0, or -1 with one
 * sentence in err naming what is wrong (a file with its path) and what to do. */
int mgt_convert(const mgt_convert_opts *o, mgt_err *err);

#endif
