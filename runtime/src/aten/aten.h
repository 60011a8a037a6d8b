/* ATen front end internals: the table of ATen op names libtpurt implements, and the
 * helpers that builders use to read arguments and declare outputs. A builder
 * validates arguments the way PyTorch's CPU backend does (same exception type, the op
 * named in the message), computes output shapes and dtypes, and fills a node. */
#ifndef TPURT_ATEN_ATEN_H_
#define TPURT_ATEN_ATEN_H_

#include "core/internal.h"

typedef struct tpu_build_s {
  const char* name;      /* "add.Tensor" */
  tpu_variant_t variant;
  const tpu_arg_t* args;
  int nargs;             /* includes trailing out= args for the OUT variant */
  tpu_node_t* node;
  const void* data;      /* entry's extra data (e.g. the unary function id) */
} tpu_build_t;

typedef tpu_status_t (*tpu_build_fn)(tpu_build_t* b);

typedef struct tpu_aten_entry_s {
  const char* name;
  tpu_build_fn build;
  const void* data;
  int flags; /* TPU_ATEN_* */
} tpu_aten_entry_t;

/* The op is random but its schema has no Generator (native_dropout): the adapter
 * appends a seed drawn from the device generator as one extra trailing INT argument. */
#define TPU_ATEN_NEEDS_SEED 1
/* The builder and its kernel only move elements (any element size) and take complex
 * scalars: calls with complex arguments may use the entry as it is. */
#define TPU_ATEN_COMPLEX 2
/* A torch._foreach_* op (aten/foreach.c): prepared per list position by
 * tpu_foreach_prepare as its element op, never built directly. */
#define TPU_ATEN_FOREACH 4
/* In place, self takes the result's shape when the two differ (tpu_aten_op_resizes_self). */
#define TPU_ATEN_RESIZES_SELF 8

/* Complex dtypes (aten/complex.c). Builders of the other families never see a complex
 * argument or output: tpu_op_prepare sends a call that has one to the complex family's
 * builder of the same name (tpu__aten_complex, whose ops take real and complex
 * arguments, or tpu__aten_complex_alt, the complex forms of ops listed elsewhere), and
 * answers UNIMPLEMENTED (the adapter's counted CPU fallback) when there is none. */
extern const tpu_aten_entry_t tpu__aten_complex_alt[];

/* Each family exports a NULL-name-terminated entry array. */
#define TPU_ATEN_FAMILIES(X) X(elementwise) X(reduce) X(linalg) X(nn) X(index) X(random) X(norm) X(resample) X(gated) X(complex) X(vision) X(foreach) X(optim) X(lapack)
#define TPU__DECL_TAB(f) extern const tpu_aten_entry_t tpu__aten_##f[];
TPU_ATEN_FAMILIES(TPU__DECL_TAB)
#undef TPU__DECL_TAB

/* Foreach entries (aten/foreach.c): the element op's name; the lists' common length
 * (ATen's checks and messages); the element op's arguments for list position k (at most
 * TPU_FOREACH_MAX_ARGS; tensors and scalars copied from the lists). */
#define TPU_FOREACH_MAX_ARGS 16
const char* tpu__foreach_element(const tpu_aten_entry_t* e);
tpu_status_t tpu__foreach_length(const tpu_aten_entry_t* e, const tpu_arg_t* args, int nargs, int64_t* out_len);
tpu_status_t tpu__foreach_args(const tpu_aten_entry_t* e, const tpu_arg_t* args, int nargs, int64_t k,
                               tpu_arg_t* out, int* out_n);

/* Composite ops: after the builder has declared output 0, runs the table entry `op`
 * (an in-place op such as "relu_") on that output right after the node, with extra[0..n)
 * as its arguments after self (strings must outlive the node: literals). The follow-up
 * is validated now, against output 0's dtype and shape (an UNIMPLEMENTED or invalid
 * follow-up fails the whole call), and built and queued by tpu_node_submit as an
 * ordinary node of its own, so defer_and_fuse can fuse it with its neighbours. The node
 * is named after the op the user called in messages. */
tpu_status_t tpu__build_then(tpu_build_t* b, const char* op, const tpu_arg_t* extra, int n);

/* Error helpers: messages start with the op name, as PyTorch's do. */
tpu_status_t tpu__err(tpu_build_t* b, tpu_status_code_t code, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Argument accessors. Index i counts schema arguments. They fail with TypeError when the
 * kind is wrong. *_opt variants accept None and return `dflt`. */
const tpu_arg_t* tpu__arg(tpu_build_t* b, int i);  /* NULL if i >= nargs */
bool tpu__arg_is_none(tpu_build_t* b, int i);
tpu_status_t tpu__arg_tensor(tpu_build_t* b, int i, const tpu_view_t** out);
tpu_status_t tpu__arg_int(tpu_build_t* b, int i, int64_t* out);
tpu_status_t tpu__arg_int_opt(tpu_build_t* b, int i, int64_t dflt, int64_t* out);
tpu_status_t tpu__arg_double(tpu_build_t* b, int i, double* out);   /* int/double/scalar */
tpu_status_t tpu__arg_double_opt(tpu_build_t* b, int i, double dflt, double* out);
tpu_status_t tpu__arg_bool(tpu_build_t* b, int i, bool* out);
tpu_status_t tpu__arg_bool_opt(tpu_build_t* b, int i, bool dflt, bool* out);
tpu_status_t tpu__arg_intlist(tpu_build_t* b, int i, const int64_t** out, int* out_len);

/* An optional tensor argument: *out is NULL for None or an undefined tensor. */
tpu_status_t tpu__arg_tensor_opt(tpu_build_t* b, int i, const tpu_view_t** out);
/* Adds v as the node's next input, or an absent input when v is NULL. */
tpu_status_t tpu__node_add_opt(tpu_build_t* b, const tpu_view_t* v);
/* A bool[want] argument (output masks), passed as a list of 0/1 ints; None or a single
 * bool fills every entry (None: true). */
tpu_status_t tpu__arg_bool_mask(tpu_build_t* b, int i, int want, bool* mask);
/* ATen's CPU mixed-dtype rule for normalization parameters (native/cpu/mixed_data_type.h):
 * parameters of another dtype than the input must all be float32, and the input then a
 * reduced float (bf16/f16). *mixed says whether the call is mixed. */
tpu_status_t tpu__norm_params_mixed(tpu_build_t* b, tpu_dtype_t x, const tpu_view_t* p1,
                                    const tpu_view_t* p2, bool* mixed);
/* A tensor argument of a dtype no kernel computes with: UNIMPLEMENTED for the storage-only
 * dtypes (uint16/32/64, complex32, float8: the CPU fallback runs the op), else TypeError.
 * `what` names the argument ("argument 1", "tensor 3"). */
tpu_status_t tpu__err_dtype(tpu_build_t* b, tpu_dtype_t d, const char* what);
tpu_status_t tpu__arg_dtype_err(tpu_build_t* b, int i, tpu_dtype_t d); /* "argument i" */
/* UNIMPLEMENTED with ATen's message: "<kernel>" not implemented for '<dtype>'. */
tpu_status_t tpu__err_not_implemented_for(tpu_build_t* b, const char* kernel, tpu_dtype_t t);

/* Adds input from a tensor or scalar argument (scalars become scalar operands with
 * dtype for promotion taken from the argument). */
tpu_status_t tpu__input_from_arg(tpu_build_t* b, int i);
/* fill_'s value (argument 1: a scalar or a 0-dim tensor, as fill_ checks it) as the
 * node's next input. */
tpu_status_t tpu__fill_value_input(tpu_build_t* b);

/* Wraps negative dims; IndexError naming the op when out of range. */
tpu_status_t tpu__wrap_dim(tpu_build_t* b, int64_t dim, int ndim, int* out_dim);
/* Tensor::expand(target) of t, as a check: its RuntimeError when t cannot be expanded. */
tpu_status_t tpu__check_expand(tpu_build_t* b, const tpu_view_t* t, int nd, const int64_t* target);
/* Broadcasts shapes; RuntimeError "The size of tensor a (3) must match ..." on mismatch. */
tpu_status_t tpu__broadcast(tpu_build_t* b, const int64_t* a, int na, const int64_t* c,
                            int nc, int64_t* out, int* out_n);

/* PyTorch's result_type over the listed arguments (tensors by dimension category,
 * 0-dim tensors, wrapped numbers). Arguments that are None are skipped. */
tpu_dtype_t tpu__result_type(tpu_build_t* b, const int* arg_idx, int n);
/* The dtype an argument has for promotion purposes (scalar: by its kind). */
tpu_dtype_t tpu__arg_dtype(const tpu_arg_t* a);

/* The C++ type name of a dtype as c10's messages print it ("float", "long int"). */
const char* tpu__dtype_cpp_name(tpu_dtype_t dtype);
/* Out variant: every out= tensor must have its output's declared dtype exactly, as the
 * out= forms of structured and generated (CompositeExplicitAutograd) kernels require:
 * "Expected out tensor to have dtype float, but got double instead". Call after the
 * outputs are declared; the out= tensors are the last node->n_out arguments. */
tpu_status_t tpu__out_dtypes_exact(tpu_build_t* b);

/* For in-place and out=: the dtype outputs will actually be stored as. */
bool tpu__dtype_ok_for_out(tpu_dtype_t computed, tpu_dtype_t out);

#endif /* TPURT_ATEN_ATEN_H_ */
