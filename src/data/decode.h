/* decode.h: JPEG and PNG files into RGB bytes, through the system's libjpeg-turbo and libpng.
 *
 * The result is what Pillow's Image.open(f).convert("RGB") gives, which is what torchvision's
 * ImageFolder and Keras' flow_from_directory load: greyscale is repeated into the three
 * channels, alpha is dropped (not blended), a palette is looked up, 16-bit samples keep their
 * high byte, CMYK JPEGs are converted as Pillow converts them (Adobe's inverted values), and EXIF
 * orientation is not applied. 16-bit greyscale PNGs are the exception to "high byte": Pillow
 * opens them as 32-bit integers ("I"), and its conversion to RGB clips each value to 0..255, so
 * every value above 255 becomes white; mgtrain gives those bytes too (save such files as 8-bit
 * to keep their contrast). JPEG is decoded with libjpeg's defaults (the accurate integer
 * DCT and smooth chroma upsampling), as Pillow does with the same library.
 *
 * A file is told by its first bytes, not by its name. A truncated or damaged file, a file that
 * is not an image, and an image of another format are refused with one sentence saying which;
 * JPEGs the system's libjpeg-turbo cannot decode (12-bit, lossless, hierarchical) are refused as
 * not supported, not as damaged. */
#ifndef MGT_DECODE_H
#define MGT_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "../util.h"

/* Images of more pixels than this are refused as damaged or hostile: Pillow's own limit, its
 * "decompression bomb" error (2 x Image.MAX_IMAGE_PIXELS), so that what mgtrain refuses torchvision
 * and Keras could not load either. The check is made on the header, before any pixel memory is
 * taken; libjpeg's own memory (a progressive JPEG's coefficients) is capped as well, at
 * MGT_DECODE_MAX_MEMORY. */
#define MGT_DECODE_MAX_PIXELS ((int64_t)178956970)
#define MGT_DECODE_MAX_MEMORY ((int64_t)8 * MGT_DECODE_MAX_PIXELS + ((int64_t)16 << 20))
/* Files larger than this are refused before they are read (no image within the pixel limit
 * needs more, compressed). */
#define MGT_DECODE_MAX_FILE ((int64_t)1 << 30)
/* Bytes of a file's start that tell its format (mgt_decode_sniff). */
#define MGT_DECODE_HEAD 16

/* A decoded image: h rows of w RGB pixels. px is grown as needed and reused from one call to
 * the next: zero-initialise it, free px when done. */
typedef struct mgt_rgb {
    uint8_t *px;
    int w, h;
    size_t cap;
} mgt_rgb;

/* Decodes the file's bytes data[0, len) into img. Returns 0, or -1 with what is wrong in err
 * (without the file's name, which the caller adds), e.g. "truncated JPEG (the data ends before
 * the image does)" or "not a JPEG or PNG image (it starts with 'hello')". */
int mgt_decode(const uint8_t *data, size_t len, mgt_rgb *img, mgt_err *err);

/* Whether a file of `size` bytes starting with head[0, n) (n >= MGT_DECODE_HEAD unless the file is
 * shorter) can be an image mgt_decode reads: 0, or -1 with why in err (another format, not an
 * image, too large), so that a file is not read whole to be refused. */
int mgt_decode_sniff(const uint8_t *head, size_t n, int64_t size, mgt_err *err);

#endif
