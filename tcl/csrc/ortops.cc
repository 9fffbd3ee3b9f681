// TCL's onnxruntime CPU operators, domain "tcl": the Mamba block's sequence ops, each one pass
// over the data instead of a dozen small standard ops per step.
//
// tcl.SelectiveScan(u, delta, A, B, C, D?, z?, delta_bias?; delta_softplus) -> y
//   delta_t = softplus(delta_t + delta_bias)          (attribute delta_softplus, default 1)
//   h_t     = exp(delta_t * A) * h_{t-1} + (delta_t * u_t) * B_t      state (E, N) per row
//   y_t     = (C_t . h_t + D * u_t) * silu(z_t)      (D and z optional)
//   u, delta, z (L, b, E); A (E, N); B, C (L, b, N); D, delta_bias (E); y (L, b, E). As
//   mamba-ssm's selective_scan_fn(u, delta, A, B, C, D, z, delta_bias, delta_softplus=True),
//   time-major.
//
// tcl.CausalConv1d(x, w, bias?; silu) -> y
//   y_t = act(bias + sum_k w_k * x_{t-K+1+k})         (x_s = 0 for s < 0; act = silu if silu=1)
//   x (L, b, E); w (K, E); bias (E); y (L, b, E): the block's depthwise causal conv.
//
// Inputs are time-major, as the exported graph has them. The standard-ONNX lowerings of both
// are in tcl/models/mamba_onnx.py, which tcl.serving swaps for these nodes when this library is
// built. The scan keeps each row's state (E x N floats) in L1 for all its steps, where the
// unfused graph streams the state of a whole block through memory once per op and step.
//
// The onnxruntime C ABI is declared here, only the parts this file uses: the function-table
// positions of OrtApi and the layout of OrtCustomOp are fixed by onnxruntime (the table only
// grows at its end); tests/test_ortops.py checks the library against the installed runtime.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "mamba_ops.h"

namespace {

// ---- onnxruntime C ABI (declarations of our own; positions as in onnxruntime_c_api.h) ------
struct OrtStatus;
struct OrtSessionOptions;
struct OrtCustomOpDomain;
struct OrtKernelInfo;
struct OrtKernelContext;
struct OrtValue;
struct OrtTensorTypeAndShapeInfo;
using Fn = void (*)();  // one OrtApi slot; cast to its signature at the call

struct OrtApiBase {
  const Fn* (*GetApi)(uint32_t version);
  const char* (*GetVersionString)();
};

// OrtApi slot numbers
enum Slot : int {
  kCreateStatus = 0,
  kCreateCustomOpDomain = 26,
  kCustomOpDomainAdd = 27,
  kAddCustomOpDomain = 28,
  kGetTensorMutableData = 51,
  kGetTensorElementType = 60,
  kGetDimensionsCount = 61,
  kGetDimensions = 62,
  kGetTensorTypeAndShape = 65,
  kKernelInfoGetAttributeInt64 = 86,
  kKernelContextGetInputCount = 88,
  kKernelContextGetInput = 90,
  kKernelContextGetOutput = 91,
  kReleaseStatus = 93,
  kReleaseTensorTypeAndShapeInfo = 99,
};

constexpr uint32_t kApiVersion = 16;  // onnxruntime >= 1.16: CreateKernelV2 / KernelComputeV2
constexpr int kFloat = 1;             // ONNXTensorElementDataType FLOAT
constexpr int kInvalidArgument = 2;   // OrtErrorCode ORT_INVALID_ARGUMENT
constexpr int kRequired = 0, kOptional = 1;  // OrtCustomOpInputOutputCharacteristic

struct OrtCustomOp {
  uint32_t version;
  void* (*CreateKernel)(const OrtCustomOp*, const Fn*, const OrtKernelInfo*);
  const char* (*GetName)(const OrtCustomOp*);
  const char* (*GetExecutionProviderType)(const OrtCustomOp*);
  int (*GetInputType)(const OrtCustomOp*, size_t);
  size_t (*GetInputTypeCount)(const OrtCustomOp*);
  int (*GetOutputType)(const OrtCustomOp*, size_t);
  size_t (*GetOutputTypeCount)(const OrtCustomOp*);
  void (*KernelCompute)(void*, OrtKernelContext*);
  void (*KernelDestroy)(void*);
  int (*GetInputCharacteristic)(const OrtCustomOp*, size_t);
  int (*GetOutputCharacteristic)(const OrtCustomOp*, size_t);
  int (*GetInputMemoryType)(const OrtCustomOp*, size_t);
  int (*GetVariadicInputMinArity)(const OrtCustomOp*);
  int (*GetVariadicInputHomogeneity)(const OrtCustomOp*);
  int (*GetVariadicOutputMinArity)(const OrtCustomOp*);
  int (*GetVariadicOutputHomogeneity)(const OrtCustomOp*);
  OrtStatus* (*CreateKernelV2)(const OrtCustomOp*, const Fn*, const OrtKernelInfo*, void**);
  OrtStatus* (*KernelComputeV2)(void*, OrtKernelContext*);
  void* InferOutputShapeFn;  // fields of later versions, unused at version 16
  void* GetStartVersion;
  void* GetEndVersion;
  void* GetMayInplace;
  void* ReleaseMayInplace;
  void* GetAliasMap;
  void* ReleaseAliasMap;
};
static_assert(sizeof(OrtCustomOp) == 208, "OrtCustomOp layout");

// Typed access to the table: api.call<Signature>(slot, args...)
struct Api {
  const Fn* table = nullptr;
  template <class Sig, class... Args>
  auto call(Slot slot, Args... args) const {
    return reinterpret_cast<Sig*>(table[slot])(args...);
  }
  OrtStatus* error(int code, const char* msg) const {
    return call<OrtStatus*(int, const char*)>(kCreateStatus, code, msg);
  }
};

// ---- the operators ----------------------------------------------------------------------------

struct Tensor {
  const float* data = nullptr;  // nullptr: an absent optional input
  std::vector<int64_t> shape;
};

struct OpSpec;

struct Kernel {
  Api api;
  const OpSpec* spec;
  int64_t flag;  // SelectiveScan: delta_softplus; CausalConv1d: silu
};

struct OpSpec {
  const char* name;
  std::vector<const char*> inputs;
  size_t required;   // the first `required` inputs must be present
  const char* flag;  // the op's int attribute
  int64_t flag_default;
  OrtStatus* (*run)(const Kernel&, Tensor* in, OrtKernelContext* ctx);
};

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + ")";
}

OrtStatus* fail(const Kernel& k, const std::string& msg) {
  return k.api.error(kInvalidArgument, (std::string("tcl.") + k.spec->name + ": " + msg).c_str());
}

// The input at `index` (absent optional -> data == nullptr); an error status on a bad type.
OrtStatus* read_input(const Kernel& k, OrtKernelContext* ctx, size_t index, Tensor* out) {
  const Api& api = k.api;
  size_t count = 0;
  if (OrtStatus* s = api.call<OrtStatus*(OrtKernelContext*, size_t*)>(kKernelContextGetInputCount, ctx, &count))
    return s;
  if (index >= count) return nullptr;
  const OrtValue* value = nullptr;
  if (OrtStatus* s = api.call<OrtStatus*(OrtKernelContext*, size_t, const OrtValue**)>(
          kKernelContextGetInput, ctx, index, &value))
    return s;
  if (!value) return nullptr;
  OrtTensorTypeAndShapeInfo* info = nullptr;
  if (OrtStatus* s = api.call<OrtStatus*(const OrtValue*, OrtTensorTypeAndShapeInfo**)>(
          kGetTensorTypeAndShape, value, &info))
    return s;
  int type = 0;
  size_t rank = 0;
  OrtStatus* s = api.call<OrtStatus*(const OrtTensorTypeAndShapeInfo*, int*)>(kGetTensorElementType, info, &type);
  if (!s) s = api.call<OrtStatus*(const OrtTensorTypeAndShapeInfo*, size_t*)>(kGetDimensionsCount, info, &rank);
  if (!s) {
    out->shape.assign(rank, 0);
    s = api.call<OrtStatus*(const OrtTensorTypeAndShapeInfo*, int64_t*, size_t)>(
        kGetDimensions, info, out->shape.data(), rank);
  }
  api.call<void(OrtTensorTypeAndShapeInfo*)>(kReleaseTensorTypeAndShapeInfo, info);
  if (s) return s;
  if (type != kFloat)
    return fail(k, std::string("input ") + k.spec->inputs[index] + " must be float32 (element type " +
                       std::to_string(type) + ")");
  void* data = nullptr;
  if ((s = api.call<OrtStatus*(OrtValue*, void**)>(kGetTensorMutableData, const_cast<OrtValue*>(value), &data)))
    return s;
  out->data = static_cast<const float*>(data);
  return nullptr;
}

// Inputs other than the first must have the shapes in `want` (nullptr: not checked).
OrtStatus* check_shapes(const Kernel& k, const Tensor* in, const std::vector<const std::vector<int64_t>*>& want) {
  for (size_t i = 1; i < want.size(); ++i)
    if (in[i].data && want[i] && in[i].shape != *want[i])
      return fail(k, std::string("input ") + k.spec->inputs[i] + " is " + shape_str(in[i].shape) +
                         ", expected " + shape_str(*want[i]) + " for " + k.spec->inputs[0] + " " +
                         shape_str(in[0].shape));
  return nullptr;
}

OrtStatus* output(const Kernel& k, OrtKernelContext* ctx, const std::vector<int64_t>& shape, float** data) {
  OrtValue* out = nullptr;
  if (OrtStatus* s = k.api.call<OrtStatus*(OrtKernelContext*, size_t, const int64_t*, size_t, OrtValue**)>(
          kKernelContextGetOutput, ctx, 0, shape.data(), shape.size(), &out))
    return s;
  void* p = nullptr;
  if (OrtStatus* s = k.api.call<OrtStatus*(OrtValue*, void**)>(kGetTensorMutableData, out, &p)) return s;
  *data = static_cast<float*>(p);
  return nullptr;
}

OrtStatus* run_selective_scan(const Kernel& k, Tensor* in, OrtKernelContext* ctx) {
  const auto& su = in[0].shape;
  const auto& sa = in[2].shape;
  if (su.size() != 3 || sa.size() != 2)
    return fail(k, "u must be (L, b, E) and A (E, N); got u " + shape_str(su) + ", A " + shape_str(sa));
  const Dims d{su[0], su[1], su[2], sa[1]};
  const std::vector<int64_t> want_e{d.L, d.b, d.E}, want_a{d.E, d.N}, want_n{d.L, d.b, d.N}, want_d{d.E};
  if (OrtStatus* s = check_shapes(k, in, {nullptr, &want_e, &want_a, &want_n, &want_n, &want_d, &want_e, &want_d}))
    return s;
  float* y = nullptr;
  if (OrtStatus* s = output(k, ctx, su, &y)) return s;
  if (d.L == 0 || d.b == 0 || d.E == 0) return nullptr;
  // scratch: A^T (N, E), then per row h (N, E) and three E-vectors
  std::vector<float> scratch(static_cast<size_t>(d.E * d.N * 2 + d.E * 3));
  float* At = scratch.data();
  float* h = At + d.E * d.N;
  float* dl = h + d.E * d.N;
  for (int64_t e = 0; e < d.E; ++e)
    for (int64_t n = 0; n < d.N; ++n) At[n * d.E + e] = in[2].data[e * d.N + n];
  for (int64_t row = 0; row < d.b; ++row)
    scan_row(d, row, in[0].data, in[1].data, At, in[3].data, in[4].data, in[5].data, in[6].data,
             in[7].data, k.flag != 0, h, dl, dl + d.E, dl + 2 * d.E, y);
  return nullptr;
}

OrtStatus* run_causal_conv1d(const Kernel& k, Tensor* in, OrtKernelContext* ctx) {
  const auto& sx = in[0].shape;
  const auto& sw = in[1].shape;
  if (sx.size() != 3 || sw.size() != 2 || sw[1] != sx[2])
    return fail(k, "x must be (L, b, E) and w (K, E); got x " + shape_str(sx) + ", w " + shape_str(sw));
  const int64_t L = sx[0], b = sx[1], E = sx[2], K = sw[0];
  const std::vector<int64_t> want_bias{E};
  if (OrtStatus* s = check_shapes(k, in, {nullptr, nullptr, &want_bias})) return s;
  float* y = nullptr;
  if (OrtStatus* s = output(k, ctx, sx, &y)) return s;
  causal_conv(L, b, E, K, 0, b, in[0].data, in[1].data, in[2].data, k.flag != 0, y);
  return nullptr;
}

const OpSpec kSpecs[] = {
    {"SelectiveScan", {"u", "delta", "A", "B", "C", "D", "z", "delta_bias"}, 5, "delta_softplus", 1,
     run_selective_scan},
    {"CausalConv1d", {"x", "w", "bias"}, 2, "silu", 0, run_causal_conv1d},
};

// OrtCustomOp first, so the callbacks' `const OrtCustomOp*` leads back to the spec
struct OpDef {
  OrtCustomOp op;
  const OpSpec* spec;
};
const OpSpec& spec_of(const OrtCustomOp* op) { return *reinterpret_cast<const OpDef*>(op)->spec; }

OrtStatus* compute(void* op_kernel, OrtKernelContext* ctx) {
  const Kernel& k = *static_cast<Kernel*>(op_kernel);
  std::vector<Tensor> in(k.spec->inputs.size());
  for (size_t i = 0; i < in.size(); ++i)
    if (OrtStatus* s = read_input(k, ctx, i, &in[i])) return s;
  for (size_t i = 0; i < k.spec->required; ++i)
    if (!in[i].data) return fail(k, std::string("input ") + k.spec->inputs[i] + " is required");
  return k.spec->run(k, in.data(), ctx);
}

OrtStatus* create_kernel(const OrtCustomOp* op, const Fn* table, const OrtKernelInfo* info, void** kernel) {
  auto* k = new Kernel{Api{table}, &spec_of(op), spec_of(op).flag_default};
  // a missing attribute keeps the default (onnxruntime reports it as an error status)
  if (OrtStatus* s = k->api.call<OrtStatus*(const OrtKernelInfo*, const char*, int64_t*)>(
          kKernelInfoGetAttributeInt64, info, k->spec->flag, &k->flag)) {
    k->api.call<void(OrtStatus*)>(kReleaseStatus, s);
    k->flag = k->spec->flag_default;
  }
  *kernel = k;
  return nullptr;
}

OpDef make_op(const OpSpec* spec) {
  OpDef def{};
  def.spec = spec;
  OrtCustomOp& op = def.op;
  op.version = kApiVersion;
  op.GetName = [](const OrtCustomOp* o) { return spec_of(o).name; };
  op.GetExecutionProviderType = [](const OrtCustomOp*) -> const char* { return "CPUExecutionProvider"; };
  op.GetInputType = [](const OrtCustomOp*, size_t) { return kFloat; };
  op.GetInputTypeCount = [](const OrtCustomOp* o) { return spec_of(o).inputs.size(); };
  op.GetOutputType = [](const OrtCustomOp*, size_t) { return kFloat; };
  op.GetOutputTypeCount = [](const OrtCustomOp*) { return size_t{1}; };
  op.KernelDestroy = [](void* k) { delete static_cast<Kernel*>(k); };
  op.GetInputCharacteristic = [](const OrtCustomOp* o, size_t i) {
    return i < spec_of(o).required ? kRequired : kOptional;
  };
  op.GetOutputCharacteristic = [](const OrtCustomOp*, size_t) { return kRequired; };
  op.GetInputMemoryType = [](const OrtCustomOp*, size_t) { return 0; };  // OrtMemTypeDefault
  op.GetVariadicInputMinArity = [](const OrtCustomOp*) { return 1; };
  op.GetVariadicInputHomogeneity = [](const OrtCustomOp*) { return 1; };
  op.GetVariadicOutputMinArity = [](const OrtCustomOp*) { return 1; };
  op.GetVariadicOutputHomogeneity = [](const OrtCustomOp*) { return 1; };
  op.CreateKernelV2 = create_kernel;
  op.KernelComputeV2 = compute;
  return def;
}

// must outlive every session using the domain: static for the life of the process
const OpDef kOps[] = {make_op(&kSpecs[0]), make_op(&kSpecs[1])};

}  // namespace

extern "C" __attribute__((visibility("default")))
OrtStatus* RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* base) {
  Api api{base->GetApi(kApiVersion)};
  if (!api.table) {
    std::fprintf(stderr, "tcl ortops: onnxruntime %s lacks C API version %u\n",
                 base->GetVersionString(), kApiVersion);
    return nullptr;  // nothing to build a status with; the model load then fails on unknown ops
  }
  OrtCustomOpDomain* domain = nullptr;
  if (OrtStatus* s = api.call<OrtStatus*(const char*, OrtCustomOpDomain**)>(kCreateCustomOpDomain, "tcl", &domain))
    return s;
  for (const OpDef& def : kOps)
    if (OrtStatus* s = api.call<OrtStatus*(OrtCustomOpDomain*, const OrtCustomOp*)>(kCustomOpDomainAdd, domain, &def.op))
      return s;
  // the domain stays alive for the process: sessions keep using it after this call
  return api.call<OrtStatus*(OrtSessionOptions*, OrtCustomOpDomain*)>(kAddCustomOpDomain, options, domain);
}
