/* synthetic_def.h: what a synthetic sample is, compiled for the host (synthetic.c) and for the
 * device (cuda/gpu_data.cu) from this one source, so both make the same bits.
 *
 * Generated sample i of a split (keys from mgt_dataset_synthetic_keys) is:
 *   - its label L: a uniform draw in [0, classes) from the label stream, a function of i alone;
 *   - its values: class L's template plus noise. Value j mixes byte j % 8 of the template draw
 *     mgt_rand64(template_key, L * words + j / 8) (the class's fixed pattern, keyed by the seed
 *     alone, so the train and test splits share it) with the same byte of the noise draw
 *     mgt_rand64(pixel_key, i * words + j / 8) (words = ceil(elems / 8)):
 *       x = (t + MGT_SYN_NOISE * u + 8) / 4096,  t, u in 0..255,
 *     in (0, 1) with mean exactly 0.5, each an exact float (an integer below 2^12 over a power
 *     of two).
 * A sample costs two draws per 8 values, whatever the class count: the class is chosen before
 * the values are made, not found from them. The class mean is the template, so the label is
 * learnable (a linear model separates the classes), but not from any one value: the noise's
 * amplitude is MGT_SYN_NOISE times the template's, so telling classes apart takes many values
 * (28x28: a nearest-class-mean classifier gets about half of 10 classes right; at
 * 224x224x3 the classes are far apart), and a small training set can be over-fitted. */
#ifndef MGT_SYNTHETIC_DEF_H
#define MGT_SYNTHETIC_DEF_H

#include <stdint.h>

#include "../util.h"

#define MGT_SYN_NOISE 15u
#define MGT_SYN_LABEL_STREAM 0x4C4142454CULL /* "LABEL": the label stream, from the pixel key */

/* The label stream's key: the split's pixel key (so the splits draw their labels apart). */
MGT_HD static inline uint64_t mgt_syn_label_key(uint64_t pixel_key) {
    return mgt_key3(pixel_key, MGT_SYN_LABEL_STREAM, 0);
}

/* Sample i's label: the top 32 bits of a draw scaled to [0, classes) (classes >= 1; the bias,
 * under classes / 2^32, is nil for any class count). */
MGT_HD static inline int32_t mgt_syn_label(uint64_t label_key, uint64_t i, int classes) {
    return (int32_t)(((mgt_rand64(label_key, i) >> 32) * (uint64_t)classes) >> 32);
}

/* The value of a template byte tb and a noise byte ub (0..255 each): exact in float32. */
MGT_HD static inline float mgt_syn_value_of(uint32_t tb, uint32_t ub) {
    return (float)(tb + MGT_SYN_NOISE * ub + 8u) * (1.0f / 4096.0f);
}

/* Value k (0..7) of a draw pair: byte k of the template draw t and of the noise draw u. */
MGT_HD static inline float mgt_syn_value(uint64_t t, uint64_t u, int k) {
    return mgt_syn_value_of((uint32_t)(t >> (8 * k)) & 255u, (uint32_t)(u >> (8 * k)) & 255u);
}

#endif
