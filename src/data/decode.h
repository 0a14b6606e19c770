/* decode.h: JPEG and PNG files into RGB bytes, through the system's libjpeg-turbo and libpng.
 *
 * The result is what Pillow's Image.open(f).convert("RGB") gives, which is what torchvision's
 * ImageFolder and Keras' flow_from_directory load: greyscale is repeated into the three
 * channels, alpha is dropped (not blended), a palette is looked up, 16-bit samples keep their
 * high byte, CMYK JPEGs are converted as Pillow converts them (Adobe's inverted values), and EXIF
 * orientation is not applied. JPEG is decoded with libjpeg's defaults (the accurate integer
 * DCT and smooth chroma upsampling), as Pillow does with the same library.
 *
 * A file is told by its first bytes, not by its name. A truncated or damaged file, a file that
 * is not an image, and an image of another format are refused with one sentence saying which. */
#ifndef MGT_DECODE_H
#define MGT_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "../util.h"

/* Images of more pixels than this are refused as damaged or hostile (Pillow's own limit, its
 * "decompression bomb" error, is 179 million). */
#define MGT_DECODE_MAX_PIXELS ((int64_t)1 << 28)

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

#endif
