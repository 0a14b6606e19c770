/* decode.c: JPEG (libjpeg-turbo) and PNG (libpng) into RGB bytes (see decode.h).
 *
 * Both libraries report a fatal error by calling a handler that must not return: each decoder
 * here longjmps back out of it, with the library's own message kept for the sentence. libjpeg
 * reports a file that ends early only as a warning (JWRN_JPEG_EOF) and fills the missing rows with
 * grey; Pillow refuses such a file ("image file is truncated"), and so does this decoder. Its
 * other warnings (extraneous bytes between markers, common in old cameras' files) are ignored,
 * as Pillow ignores them. */
#include "decode.h"

#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jerror.h>  /* JWRN_JPEG_EOF */
#include <jpeglib.h> /* after stdio.h: it uses FILE */

static const uint8_t PNG_MAGIC[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

/* Room for h rows of w RGB pixels in img; -1 (with err) when the image is too large. */
static int reserve(mgt_rgb *img, int64_t w, int64_t h, mgt_err *err) {
    if (w < 1 || h < 1)
        return mgt_errf(err, "the image has no pixels (%lld x %lld)", (long long)w, (long long)h);
    if (w * h > MGT_DECODE_MAX_PIXELS)
        return mgt_errf(err,
                        "%lld x %lld pixels, more than the %lld an image may have here; shrink it "
                        "first (e.g. ImageMagick's mogrify -resize 4096x4096)",
                        (long long)w, (long long)h, (long long)MGT_DECODE_MAX_PIXELS);
    const size_t need = (size_t)w * (size_t)h * 3;
    if (need > img->cap) {
        uint8_t *p = realloc(img->px, need);
        if (!p)
            return mgt_errf(err, "out of memory for a %lld x %lld image", (long long)w,
                            (long long)h);
        img->px = p;
        img->cap = need;
    }
    img->w = (int)w;
    img->h = (int)h;
    return 0;
}

/* ---- JPEG ---------------------------------------------------------------------------------- */

typedef struct jpeg_fail {
    struct jpeg_error_mgr mgr; /* first: libjpeg hands back a pointer to it */
    jmp_buf jump;
    char msg[JMSG_LENGTH_MAX];
    int code, parm; /* libjpeg's message code and first parameter */
    int truncated;
} jpeg_fail;

static void jpeg_on_error(j_common_ptr ci) {
    jpeg_fail *f = (jpeg_fail *)(void *)ci->err;
    (*ci->err->format_message)(ci, f->msg);
    f->code = ci->err->msg_code;
    f->parm = ci->err->msg_parm.i[0];
    longjmp(f->jump, 1);
}

/* The sentence for a JPEG libjpeg gave up on: a kind of JPEG it does not decode (valid files
 * that Pillow, on the same library, does not read either), or a damaged one. */
static int jpeg_failed(const jpeg_fail *f, mgt_err *err) {
    const char *what = NULL;
    char buf[80];
    if (f->code == JERR_BAD_PRECISION) {
        snprintf(buf, sizeof buf, "a %d-bit JPEG", f->parm);
        what = buf;
    } else if (f->code == JERR_SOF_UNSUPPORTED) {
        const int sof = f->parm & 0x0f; /* SOF3, 7, 11, 15: lossless; 5-7, 13-15: hierarchical */
        what = sof == 3 || sof == 7 || sof == 11 || sof == 15 ? "a lossless JPEG"
                                                               : "a hierarchical JPEG";
    } else if (f->code == JERR_NO_BACKING_STORE || f->code == JERR_OUT_OF_MEMORY) {
        return mgt_errf(err,
                        "a JPEG whose decoding needs more than the %.1f GiB allowed here "
                        "(libjpeg: %s); shrink it first (e.g. ImageMagick's mogrify -resize "
                        "4096x4096)",
                        (double)MGT_DECODE_MAX_MEMORY / 1073741824.0, f->msg);
    }
    if (what)
        return mgt_errf(err,
                        "%s: not supported (mgtrain decodes 8-bit JPEGs of the baseline, "
                        "extended and progressive kinds, as Pillow does with the same libjpeg; "
                        "libjpeg: %s); convert it to PNG or to an 8-bit JPEG first",
                        what, f->msg);
    return mgt_errf(err, "damaged JPEG (libjpeg: %s)", f->msg);
}

static void jpeg_on_message(j_common_ptr ci, int level) {
    if (level == -1 && ci->err->msg_code == JWRN_JPEG_EOF)
        ((jpeg_fail *)(void *)ci->err)->truncated = 1;
}

/* Pillow's CMYK to RGB (Convert.c, cmyk2rgb) on its "CMYK;I" reading of Adobe JPEGs: the stored
 * values inverted, then each channel nk - nk * c / 255 (nk = 255 - k, the division rounded). */
static void cmyk_row(const uint8_t *in, int w, uint8_t *out) {
    for (int x = 0; x < w; x++, in += 4, out += 3) {
        const int nk = in[3]; /* 255 - (255 - stored k) */
        for (int ch = 0; ch < 3; ch++) {
            const int c = 255 - in[ch], t = c * nk + 128;
            const int v = nk - (((t >> 8) + t) >> 8);
            out[ch] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
        }
    }
}

static int decode_jpeg(const uint8_t *data, size_t len, mgt_rgb *img, mgt_err *err) {
    struct jpeg_decompress_struct ci;
    jpeg_fail fail;
    memset(&fail, 0, sizeof fail);
    ci.err = jpeg_std_error(&fail.mgr);
    fail.mgr.error_exit = jpeg_on_error;
    fail.mgr.emit_message = jpeg_on_message;
    uint8_t *volatile cmyk = NULL;
    if (setjmp(fail.jump)) {
        jpeg_destroy_decompress(&ci);
        free(cmyk);
        return jpeg_failed(&fail, err);
    }
    jpeg_create_decompress(&ci);
    /* libjpeg's own allocations (a progressive file's whole-image coefficients are taken in
     * jpeg_start_decompress) within a bound: past it, it fails instead of taking the memory. */
    ci.mem->max_memory_to_use = (long)MGT_DECODE_MAX_MEMORY;
    jpeg_mem_src(&ci, data, (unsigned long)len);
    jpeg_read_header(&ci, TRUE);
    const int four = ci.jpeg_color_space == JCS_CMYK || ci.jpeg_color_space == JCS_YCCK;
    ci.out_color_space = four ? JCS_CMYK : JCS_RGB;
    /* The header's dimensions are checked, and the pixels' memory taken, before decompression
     * starts: a small file claiming 65000 x 65000 pixels is refused here at once. */
    jpeg_calc_output_dimensions(&ci);
    if (reserve(img, ci.output_width, ci.output_height, err) < 0) {
        jpeg_destroy_decompress(&ci);
        return -1;
    }
    jpeg_start_decompress(&ci);
    const size_t row = (size_t)img->w * 3;
    if (four && !(cmyk = malloc((size_t)img->w * 4))) {
        jpeg_destroy_decompress(&ci);
        return mgt_errf(err, "out of memory for a %d x %d image", img->w, img->h);
    }
    while (ci.output_scanline < ci.output_height) {
        uint8_t *dst = img->px + (size_t)ci.output_scanline * row;
        JSAMPROW rows[1] = {four ? cmyk : dst};
        jpeg_read_scanlines(&ci, rows, 1);
        if (four)
            cmyk_row(cmyk, img->w, dst);
    }
    jpeg_finish_decompress(&ci);
    jpeg_destroy_decompress(&ci);
    free(cmyk);
    if (fail.truncated)
        return mgt_errf(err, "truncated JPEG (the data ends before the image does)");
    return 0;
}

/* ---- PNG ----------------------------------------------------------------------------------- */

typedef struct png_src {
    const uint8_t *data;
    size_t len, at;
    char msg[200];
} png_src;

static void png_read_mem(png_structp p, png_bytep out, size_t n) {
    png_src *s = png_get_io_ptr(p);
    if (n > s->len - s->at)
        png_error(p, "the data ends before the image does");
    memcpy(out, s->data + s->at, n);
    s->at += n;
}

static void png_on_error(png_structp p, png_const_charp msg) {
    png_src *s = png_get_error_ptr(p);
    snprintf(s->msg, sizeof s->msg, "%s", msg);
    png_longjmp(p, 1);
}

static void png_on_warning(png_structp p, png_const_charp msg) {
    (void)p;
    (void)msg; /* ancillary chunks it skips, as Pillow does */
}

/* A 16-bit greyscale PNG whose header is read: its big-endian values into a buffer of their
 * own, then each value v as min(v, 255) in the three channels, as Pillow's I -> RGB conversion
 * gives it. Ends the reader (libpng's errors longjmp to the caller's handler, which frees the
 * buffers it is handed). */
static int decode_grey16(png_structp p, png_infop info, mgt_rgb *img, uint8_t *volatile *buf,
                         png_bytep *volatile *rows, mgt_err *err) {
    const size_t w = (size_t)img->w, h = (size_t)img->h;
    png_set_interlace_handling(p);
    png_read_update_info(p, info);
    if (png_get_rowbytes(p, info) != w * 2 || !(*buf = malloc(w * h * 2)) ||
        !(*rows = malloc(sizeof(png_bytep) * h))) {
        png_destroy_read_struct(&p, &info, NULL);
        free(*buf);
        free(*rows);
        return mgt_errf(err, "out of memory for a %zu x %zu 16-bit image", w, h);
    }
    for (size_t y = 0; y < h; y++)
        (*rows)[y] = *buf + y * w * 2;
    png_read_image(p, *rows);
    png_read_end(p, NULL);
    png_destroy_read_struct(&p, &info, NULL);
    for (size_t i = 0; i < w * h; i++) {
        const uint8_t *v = *buf + 2 * i;
        const uint8_t g = v[0] ? 255 : v[1];
        img->px[3 * i] = img->px[3 * i + 1] = img->px[3 * i + 2] = g;
    }
    free(*buf);
    free(*rows);
    return 0;
}

static int decode_png(const uint8_t *data, size_t len, mgt_rgb *img, mgt_err *err) {
    png_src src = {data, len, 0, ""};
    png_structp p =
        png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, png_on_error, png_on_warning);
    png_infop info = p ? png_create_info_struct(p) : NULL;
    if (!info) {
        png_destroy_read_struct(&p, NULL, NULL);
        return mgt_errf(err, "out of memory for a PNG decoder");
    }
    png_bytep *volatile rows = NULL;
    uint8_t *volatile grey16 = NULL;
    if (setjmp(png_jmpbuf(p))) {
        png_destroy_read_struct(&p, &info, NULL);
        free(rows);
        free(grey16);
        return mgt_errf(err, "damaged PNG (libpng: %s)", src.msg);
    }
    png_set_read_fn(p, &src, png_read_mem);
    png_read_info(p, info);
    const int type = png_get_color_type(p, info), depth = png_get_bit_depth(p, info);
    const png_uint_32 w = png_get_image_width(p, info), h = png_get_image_height(p, info);
    if (reserve(img, w, h, err) < 0) {
        png_destroy_read_struct(&p, &info, NULL);
        return -1;
    }
    /* 16-bit grey: Pillow's "I" image clipped to 0..255 (decode.h), from the 16-bit values. */
    if (depth == 16 && type == PNG_COLOR_TYPE_GRAY)
        return decode_grey16(p, info, img, &grey16, &rows, err);
    if (depth == 16)
        png_set_strip_16(p); /* the high byte, as Pillow keeps it */
    if (type == PNG_COLOR_TYPE_PALETTE)
        png_set_palette_to_rgb(p);
    if (type == PNG_COLOR_TYPE_GRAY && depth < 8)
        png_set_expand_gray_1_2_4_to_8(p);
    if (type == PNG_COLOR_TYPE_GRAY || type == PNG_COLOR_TYPE_GRAY_ALPHA)
        png_set_gray_to_rgb(p);
    png_set_strip_alpha(p);
    png_set_interlace_handling(p);
    png_read_update_info(p, info);
    if (png_get_channels(p, info) != 3 || png_get_rowbytes(p, info) != (size_t)w * 3) {
        png_destroy_read_struct(&p, &info, NULL);
        return mgt_errf(err,
                        "a PNG of an unusual layout (colour type %d, %d bits) that does not "
                        "read as RGB; save it again as an 8-bit RGB PNG",
                        type, depth);
    }
    if (!(rows = malloc(sizeof(png_bytep) * h))) {
        png_destroy_read_struct(&p, &info, NULL);
        return mgt_errf(err, "out of memory for a %u x %u image", (unsigned)w, (unsigned)h);
    }
    for (png_uint_32 y = 0; y < h; y++)
        rows[y] = img->px + (size_t)y * (size_t)w * 3;
    png_read_image(p, rows);
    png_read_end(p, NULL);
    png_destroy_read_struct(&p, &info, NULL);
    free(rows);
    return 0;
}

/* ---- which format ------------------------------------------------------------------------- */

/* The name of a format mgtrain does not read, from the file's first bytes, or NULL. */
static const char *other_format(const uint8_t *d, size_t n) {
    if (n >= 6 && (!memcmp(d, "GIF87a", 6) || !memcmp(d, "GIF89a", 6)))
        return "GIF";
    if (n >= 2 && !memcmp(d, "BM", 2))
        return "BMP";
    if (n >= 12 && !memcmp(d, "RIFF", 4) && !memcmp(d + 8, "WEBP", 4))
        return "WebP";
    if (n >= 4 && (!memcmp(d, "II*\0", 4) || !memcmp(d, "MM\0*", 4)))
        return "TIFF";
    if (n >= 12 && !memcmp(d + 4, "ftyp", 4))
        return "HEIF/AVIF";
    return NULL;
}

static int is_jpeg(const uint8_t *d, size_t n) {
    return n >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF;
}

static int is_png(const uint8_t *d, size_t n) {
    return n >= 8 && !memcmp(d, PNG_MAGIC, 8);
}

/* Why data[0, len) is not an image mgt_decode reads (it is neither JPEG nor PNG). */
static int not_ours(const uint8_t *data, size_t len, mgt_err *err);

int mgt_decode_sniff(const uint8_t *head, size_t n, int64_t size, mgt_err *err) {
    if (!is_jpeg(head, n) && !is_png(head, n))
        return not_ours(head, n, err);
    if (size > MGT_DECODE_MAX_FILE)
        return mgt_errf(err,
                        "a %s file of %.1f GiB, more than the %.0f GiB an image file may have "
                        "here; shrink it first (e.g. ImageMagick's mogrify -resize 4096x4096)",
                        is_jpeg(head, n) ? "JPEG" : "PNG", (double)size / 1073741824.0,
                        (double)MGT_DECODE_MAX_FILE / 1073741824.0);
    return 0;
}

int mgt_decode(const uint8_t *data, size_t len, mgt_rgb *img, mgt_err *err) {
    if (is_jpeg(data, len))
        return decode_jpeg(data, len, img, err);
    if (is_png(data, len))
        return decode_png(data, len, img, err);
    return not_ours(data, len, err);
}

static int not_ours(const uint8_t *data, size_t len, mgt_err *err) {
    const char *other = other_format(data, len);
    if (other)
        return mgt_errf(err,
                        "a %s image: mgtrain reads JPEG and PNG; convert it first (e.g. "
                        "ImageMagick's mogrify -format png FILE)",
                        other);
    if (len == 0)
        return mgt_errf(err, "an empty file, not an image");
    char head[17];
    size_t k = 0;
    for (; k < len && k < 16; k++)
        head[k] = data[k] >= 32 && data[k] < 127 ? (char)data[k] : '.';
    head[k] = 0;
    return mgt_errf(err, "not a JPEG or PNG image (it starts with '%s')", head);
}
