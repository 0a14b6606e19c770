/* resample.h: resizing 8-bit images (HWC, any channel count) with the antialiased bilinear
 * (triangle) filter, in Pillow's integer arithmetic: the bytes of Image.resize(size,
 * Image.BILINEAR), which torchvision's Resize, CenterCrop and RandomResizedCrop run on PIL images.
 *
 * The filter's support grows with the scale when shrinking (an area filter in the limit), so a
 * large photograph resized to 256 pixels does not alias; when enlarging it is plain bilinear
 * interpolation. Two separable passes, horizontal then vertical, each rounding to bytes, with
 * coefficients rounded to 22 fractional bits, as Pillow does (libImaging/Resample.c); a pass whose
 * size does not change is skipped. tests/cli/images.sh compares the bytes with Pillow's: Debian's
 * (9.4) exactly, PyPI's current one up to the order of the passes (Pillow 13 runs the vertical
 * one first for some sizes; horizontal first is Pillow's order from 3.4 to 12).
 *
 * A window of the result can be computed alone: resizing to fw x fh and keeping [x0, x0 + ow) x
 * [y0, y0 + oh) gives the bytes a resize then a crop would, at the cost of the window only (a
 * centre crop of a resized image, or torchvision's Resize then CenterCrop). */
#ifndef MGT_RESAMPLE_H
#define MGT_RESAMPLE_H

#include <stddef.h>
#include <stdint.h>

/* Memory a resize works in (coefficients, the horizontal pass's rows), grown as needed: one per
 * thread, zero-initialised before its first use, released with mgt_resample_work_free. */
typedef struct mgt_resample_work {
    void *buf;
    size_t cap;
} mgt_resample_work;

/* Resizes the sw x sh image src (c channels, rows `stride` bytes apart) to fw x fh and writes
 * the window [x0, x0 + ow) x [y0, y0 + oh) of the result to dst (oh rows of ow * c bytes, no
 * gaps). The window must lie within fw x fh, and every size be at least 1. Returns 0, or -1 when
 * the work memory cannot be had. */
int mgt_resample_u8(const uint8_t *src, int sw, int sh, size_t stride, int c, int fw, int fh,
                    int x0, int y0, int ow, int oh, uint8_t *dst, mgt_resample_work *w);

/* Resizes the box [box[0], box[2]) x [box[1], box[3]) of the sw x sh image src (fractional
 * bounds, in pixels) to ow x oh into dst, as Pillow's Image.crop of the pixels the box covers
 * (floor of its start to ceil of its end) then Image.resize(size, BILINEAR, box=the box within
 * that crop) makes it: output pixel i centred at box[0] + (i + 0.5) * (box[2] - box[0]) / ow, the
 * filter's taps kept within the covered pixels. With whole-pixel bounds it is torchvision's
 * resized_crop (crop, then resize) to the byte. Returns 0, or -1 for an empty box or when the
 * work memory cannot be had. */
int mgt_resample_box(const uint8_t *src, int sw, int sh, size_t stride, int c, const double box[4],
                     int ow, int oh, uint8_t *dst, mgt_resample_work *w);

void mgt_resample_work_free(mgt_resample_work *w);

#endif
