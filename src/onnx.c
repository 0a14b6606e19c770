/* onnx.c: an ONNX model built node by node, encoded by protobuf-c (see onnx.h).
 *
 * Every string and array the messages point to is allocated here and listed in the graph's pool,
 * so that one call frees them all; an allocation that fails marks the graph, and the write then
 * refuses it. */
#include "onnx.h"

#include <stdlib.h>
#include <string.h>

#include "onnx.pb-c.h"
#include "tensor_io.h"

struct mgt_onnx {
    Onnx__GraphProto graph;
    void **pool; /* everything allocated for the messages */
    size_t npool, cap_pool;
    size_t cap_node, cap_init, cap_in, cap_out;
    int failed;
};

/* n zeroed bytes owned by the graph's pool (NULL when out of memory, and the graph failed). */
static void *own(mgt_onnx *g, size_t n) {
    if (g->failed)
        return NULL;
    if (g->npool == g->cap_pool) {
        size_t cap = g->cap_pool ? 2 * g->cap_pool : 256;
        void **p = realloc(g->pool, cap * sizeof *p);
        if (!p) {
            g->failed = 1;
            return NULL;
        }
        g->pool = p;
        g->cap_pool = cap;
    }
    void *b = calloc(1, n ? n : 1);
    if (!b) {
        g->failed = 1;
        return NULL;
    }
    return g->pool[g->npool++] = b;
}

static char *own_str(mgt_onnx *g, const char *s) {
    char *c = own(g, strlen(s) + 1);
    if (c)
        memcpy(c, s, strlen(s) + 1);
    return c;
}

/* Appends item to a message's repeated field (a pointer array of *n entries, room *cap). */
static int push(mgt_onnx *g, void ***arr, size_t *n, size_t *cap, void *item) {
    if (!item || g->failed)
        return g->failed = 1, -1;
    if (*n == *cap) {
        size_t c = *cap ? 2 * *cap : 64;
        void **a = realloc(*arr, c * sizeof *a);
        if (!a)
            return g->failed = 1, -1;
        *arr = a;
        *cap = c;
    }
    (*arr)[(*n)++] = item;
    return 0;
}

mgt_onnx *mgt_onnx_new(const char *name) {
    mgt_onnx *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    onnx__graph_proto__init(&g->graph);
    g->graph.name = own_str(g, name);
    if (g->failed) {
        mgt_onnx_free(g);
        return NULL;
    }
    return g;
}

void mgt_onnx_free(mgt_onnx *g) {
    if (!g)
        return;
    for (size_t i = 0; i < g->npool; i++)
        free(g->pool[i]);
    free(g->pool);
    free(g->graph.node);
    free(g->graph.initializer);
    free(g->graph.input);
    free(g->graph.output);
    free(g);
}

int mgt_onnx_node(mgt_onnx *g, const char *op, const char *const *in, int nin, const char *out,
                  const mgt_onnx_attr *attrs, int nattrs) {
    Onnx__NodeProto *n = own(g, sizeof *n);
    if (!n)
        return -1;
    onnx__node_proto__init(n);
    n->op_type = own_str(g, op);
    n->name = own_str(g, out);
    n->n_input = (size_t)nin;
    n->input = own(g, sizeof *n->input * (size_t)(nin ? nin : 1));
    for (int k = 0; n->input && k < nin; k++)
        n->input[k] = own_str(g, in[k]);
    n->n_output = 1;
    n->output = own(g, sizeof *n->output);
    if (n->output)
        n->output[0] = own_str(g, out);
    n->n_attribute = (size_t)nattrs;
    n->attribute = own(g, sizeof *n->attribute * (size_t)(nattrs ? nattrs : 1));
    for (int k = 0; n->attribute && k < nattrs; k++) {
        const mgt_onnx_attr *a = &attrs[k];
        Onnx__AttributeProto *p = own(g, sizeof *p);
        if (!p)
            break;
        onnx__attribute_proto__init(p);
        p->name = own_str(g, a->name);
        p->has_type = 1;
        if (a->kind == MGT_ONNX_INT) {
            p->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
            p->has_i = 1;
            p->i = a->i;
        } else if (a->kind == MGT_ONNX_FLOAT) {
            p->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT;
            p->has_f = 1;
            p->f = a->f;
        } else if (a->kind == MGT_ONNX_STRING) {
            p->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__STRING;
            p->has_s = 1;
            p->s.data = (uint8_t *)own_str(g, a->s);
            p->s.len = strlen(a->s);
        } else {
            p->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS;
            p->n_ints = (size_t)a->nints;
            p->ints = own(g, sizeof *p->ints * (size_t)(a->nints ? a->nints : 1));
            if (p->ints)
                memcpy(p->ints, a->ints, sizeof *p->ints * (size_t)a->nints);
        }
        n->attribute[k] = p;
    }
    return push(g, (void ***)&g->graph.node, &g->graph.n_node, &g->cap_node, g->failed ? NULL : n);
}

static int init_raw(mgt_onnx *g, const char *name, int type, const void *data, size_t bytes,
                    int ndim, const int64_t *dims) {
    Onnx__TensorProto *t = own(g, sizeof *t);
    if (!t)
        return -1;
    onnx__tensor_proto__init(t);
    t->name = own_str(g, name);
    t->has_data_type = 1;
    t->data_type = type;
    t->n_dims = (size_t)ndim;
    t->dims = own(g, sizeof *t->dims * (size_t)(ndim ? ndim : 1));
    if (t->dims && ndim) /* a scalar (ndim 0) has no dims */
        memcpy(t->dims, dims, sizeof *t->dims * (size_t)ndim);
    t->has_raw_data = 1;
    t->raw_data.len = bytes;
    t->raw_data.data = own(g, bytes);
    if (t->raw_data.data) /* little-endian, as this host is */
        memcpy(t->raw_data.data, data, bytes);
    return push(g, (void ***)&g->graph.initializer, &g->graph.n_initializer, &g->cap_init,
                g->failed ? NULL : t);
}

static size_t numel(int ndim, const int64_t *dims) {
    size_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= (size_t)dims[i];
    return n;
}

int mgt_onnx_init_f32(mgt_onnx *g, const char *name, const float *data, int ndim,
                      const int64_t *dims) {
    return init_raw(g, name, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, data,
                    numel(ndim, dims) * sizeof(float), ndim, dims);
}

int mgt_onnx_init_i64(mgt_onnx *g, const char *name, const int64_t *data, int ndim,
                      const int64_t *dims) {
    return init_raw(g, name, ONNX__TENSOR_PROTO__DATA_TYPE__INT64, data,
                    numel(ndim, dims) * sizeof(int64_t), ndim, dims);
}

/* A float32 tensor value of the given shape (-1: "batch"). */
static Onnx__ValueInfoProto *value_info(mgt_onnx *g, const char *name, int elem, int ndim,
                                        const int64_t *dims) {
    Onnx__ValueInfoProto *v = own(g, sizeof *v);
    Onnx__TypeProto *t = own(g, sizeof *t);
    Onnx__TypeProto__Tensor *tt = own(g, sizeof *tt);
    Onnx__TensorShapeProto *sh = own(g, sizeof *sh);
    Onnx__TensorShapeProto__Dimension **d = own(g, sizeof *d * (size_t)(ndim ? ndim : 1));
    if (!v || !t || !tt || !sh || !d)
        return NULL;
    onnx__value_info_proto__init(v);
    onnx__type_proto__init(t);
    onnx__type_proto__tensor__init(tt);
    onnx__tensor_shape_proto__init(sh);
    for (int i = 0; i < ndim; i++) {
        if (!(d[i] = own(g, sizeof *d[i])))
            return NULL;
        onnx__tensor_shape_proto__dimension__init(d[i]);
        if (dims[i] < 0) {
            d[i]->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
            d[i]->dim_param = own_str(g, dims[i] == -1 ? "batch" : "sequence");
        } else {
            d[i]->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
            d[i]->dim_value = dims[i];
        }
    }
    sh->n_dim = (size_t)ndim;
    sh->dim = d;
    tt->has_elem_type = 1;
    tt->elem_type = elem;
    tt->shape = sh;
    t->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    t->tensor_type = tt;
    v->name = own_str(g, name);
    v->type = t;
    return g->failed ? NULL : v;
}

int mgt_onnx_input(mgt_onnx *g, const char *name, int ndim, const int64_t *dims) {
    return push(g, (void ***)&g->graph.input, &g->graph.n_input, &g->cap_in,
                value_info(g, name, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, ndim, dims));
}

int mgt_onnx_input_ids(mgt_onnx *g, const char *name, int ndim, const int64_t *dims) {
    return push(g, (void ***)&g->graph.input, &g->graph.n_input, &g->cap_in,
                value_info(g, name, ONNX__TENSOR_PROTO__DATA_TYPE__INT64, ndim, dims));
}

int mgt_onnx_output(mgt_onnx *g, const char *name, int ndim, const int64_t *dims) {
    return push(g, (void ***)&g->graph.output, &g->graph.n_output, &g->cap_out,
                value_info(g, name, ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, ndim, dims));
}

int mgt_onnx_write(mgt_onnx *g, const char *path, const char *producer, const char *version,
                   const char *doc, mgt_err *err) {
    Onnx__ModelProto model = ONNX__MODEL_PROTO__INIT;
    Onnx__OperatorSetIdProto opset = ONNX__OPERATOR_SET_ID_PROTO__INIT;
    Onnx__OperatorSetIdProto *opsets[1] = {&opset};
    opset.domain = "";
    opset.has_version = 1;
    opset.version = MGT_ONNX_OPSET;
    model.has_ir_version = 1;
    model.ir_version = MGT_ONNX_IR_VERSION;
    model.n_opset_import = 1;
    model.opset_import = opsets;
    model.producer_name = (char *)producer;
    model.producer_version = (char *)version;
    model.doc_string = (char *)doc;
    model.graph = &g->graph;
    if (g->failed)
        return mgt_errf(err, "out of host memory building the ONNX graph for %s", path);
    const size_t n = onnx__model_proto__get_packed_size(&model);
    /* protobuf's own limit: a message over 2 GiB is refused by every reader */
    if (n > ((size_t)1 << 31) - 1)
        return mgt_errf(err,
                        "%s: the model would be %zu bytes, more than the 2 GiB one ONNX file may "
                        "hold",
                        path, n);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        return mgt_errf(err, "out of host memory for the %zu bytes of %s", n, path);
    onnx__model_proto__pack(&model, buf);
    const int rc = mgt_atomic_write(path, buf, n, err);
    free(buf);
    return rc;
}
