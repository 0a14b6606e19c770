/* tb.h: TensorBoard event files, written by rank 0 into OUT/tb/.
 *
 * The format is TensorFlow's: a file named events.out.tfevents.<unix time>.<host> holding
 * TFRecords, each one Event message (proto/event.proto, encoded by protobuf-c):
 *
 *   uint64 length (little-endian) | uint32 masked CRC-32C of those 8 bytes |
 *   length bytes of data          | uint32 masked CRC-32C of the data
 *
 * where masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8 (TFRecord's rule, so that a CRC
 * over data that itself holds CRCs does not degenerate). CRC-32C comes from ISA-L.
 *
 * A file starts with the file_version event "brain.Event:2", then a SessionLog START at the first
 * step this run (re)starting training will log, then one event per call of mgt_tb_scalars. Each
 * record is one write(2) to the file, so a TensorBoard that watches the folder sees it at once, and
 * never half of it unless the process dies inside the call (TensorBoard skips a truncated last
 * record).
 *
 * Every run opens a NEW file, never rewriting an older one: a resumed run (or a new run into the
 * same OUT) adds its own file next to the earlier ones, and TensorBoard shows the folder as one
 * run. The START event tells it to drop what earlier files logged from that step on (the part of
 * an interrupted run that was redone). */
#ifndef MGT_TB_H
#define MGT_TB_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

typedef struct mgt_tb {
    int fd;
    char path[1024];
} mgt_tb;

/* Creates the folder `dir` if needed and a new event file in it whose name sorts after every
 * event file already there (the time in its name is made later than theirs if the clock says
 * otherwise), opened exclusively so no file is ever overwritten. Writes the file_version event
 * and a SessionLog START at first_step, the first step this run will log. */
int mgt_tb_open(mgt_tb *tb, const char *dir, int64_t first_step, mgt_err *err);

/* One event at `step` with n scalars (tags[i], values[i]); values are stored as float32. */
int mgt_tb_scalars(mgt_tb *tb, int64_t step, int n, const char *const *tags, const double *values,
                   mgt_err *err);

/* Closes the file (after an fsync). Safe after a failed open and on a closed writer. */
void mgt_tb_close(mgt_tb *tb);

/* The pieces of the format, for tests. */
uint32_t mgt_tb_crc32c(const void *data, size_t len); /* standard CRC-32C (Castagnoli) */
uint32_t mgt_tb_masked_crc(const void *data, size_t len);
/* The TFRecord framing of len bytes of data into out (len + 16 bytes). */
void mgt_tb_frame(const void *data, size_t len, uint8_t *out);

#endif
