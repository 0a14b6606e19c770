/* onnx.h: an ONNX model built node by node and written as the ONNX protobuf schema says
 * (proto/onnx.proto, encoded by protobuf-c's generated code), atomically.
 *
 * A graph of operator nodes of the default domain at one opset (MGT_ONNX_OPSET), float32 tensors
 * between them, float32 and int64 initializers (stored as raw little-endian bytes), and inputs and
 * outputs whose dimensions may be symbolic (a dynamic batch, and a language model's sequence
length); inputs are float32, or int64 for token ids. The builder copies what it is
 * given; names are the caller's, and must be unique among the graph's values. */
#ifndef MGT_ONNX_H
#define MGT_ONNX_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

/* The operator set the nodes are written for (ONNX 1.16, 2024), and the IR version that goes
 * with it. */
#define MGT_ONNX_OPSET 21
#define MGT_ONNX_IR_VERSION 10

typedef struct mgt_onnx mgt_onnx;

/* A node's attribute: an int, a float, a string, or a list of ints. */
typedef struct mgt_onnx_attr {
    const char *name;
    enum { MGT_ONNX_INT, MGT_ONNX_FLOAT, MGT_ONNX_STRING, MGT_ONNX_INTS } kind;
    int64_t i;
    float f;
    const char *s;
    const int64_t *ints;
    int nints;
} mgt_onnx_attr;

/* A graph named `name`; NULL when out of memory. */
mgt_onnx *mgt_onnx_new(const char *name);
void mgt_onnx_free(mgt_onnx *g);

/* A node op(in[0..nin)) -> out, with its attributes. An empty input name is an omitted optional
 * input. Returns 0, or -1 when out of memory (mgt_onnx_write then fails too). */
int mgt_onnx_node(mgt_onnx *g, const char *op, const char *const *in, int nin, const char *out,
                  const mgt_onnx_attr *attrs, int nattrs);
/* Initializers: a float32 or an int64 tensor of the given shape, copied. */
int mgt_onnx_init_f32(mgt_onnx *g, const char *name, const float *data, int ndim,
                      const int64_t *dims);
int mgt_onnx_init_i64(mgt_onnx *g, const char *name, const int64_t *data, int ndim,
                      const int64_t *dims);
/* The graph's float32 inputs and outputs; a dimension of -1 is the symbolic "batch", one of -2
 * the symbolic "sequence". mgt_onnx_input_ids: an int64 input (token ids). */
int mgt_onnx_input(mgt_onnx *g, const char *name, int ndim, const int64_t *dims);
int mgt_onnx_input_ids(mgt_onnx *g, const char *name, int ndim, const int64_t *dims);
int mgt_onnx_output(mgt_onnx *g, const char *name, int ndim, const int64_t *dims);

/* Encodes the model (producer and its version, a line of documentation) and writes it to path
 * atomically (tensor_io.h: mgt_atomic_write). */
int mgt_onnx_write(mgt_onnx *g, const char *path, const char *producer, const char *version,
                   const char *doc, mgt_err *err);

#endif
