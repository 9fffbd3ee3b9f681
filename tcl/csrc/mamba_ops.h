// The Mamba block's sequence kernels (the selective scan of a row, the depthwise causal conv) and
// their branch-free math, shared by TCL's onnxruntime operators (ortops.cc: serving) and its
// torch training kernels (scan_grad.cc).
//
//   h_t = exp(delta_t * A) * h_{t-1} + (delta_t * u_t) * B_t      state (E, N) per row
//   y_t = (C_t . h_t + D * u_t) * silu(z_t)                       (D and z optional)
//
// Everything here has internal linkage: each library compiles its own copy.

#ifndef TCL_CSRC_MAMBA_OPS_H_
#define TCL_CSRC_MAMBA_OPS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

// ---- math: branch-free, so the loops over E vectorise -----------------------------------------

inline float bits_to_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t float_to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

// max/min as the compare-selects the vector units have (std::fmax's NaN rules keep GCC from
// vectorising a loop that calls it)
inline float max_f(float x, float lo) { return x < lo ? lo : x; }
inline float min_f(float x, float hi) { return x > hi ? hi : x; }

// exp(x) to ~2 ulp for x in [-87, 88] (clamped there: below, the result is < 1.7e-38 anyway).
// x = k ln2 + r, |r| <= ln2/2, exp(r) by its Taylor series to r^6 (truncation < 1.3e-7
// relative; one more term measured ~15% slower in the scan for no change in its error).
inline float exp_f(float x) {
  x = min_f(max_f(x, -87.0f), 88.0f);
  const float shift = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer in the low bits
  float kf = x * 1.44269504f + shift;
  const int32_t k = static_cast<int32_t>(float_to_bits(kf) - float_to_bits(shift));
  kf -= shift;
  const float r = (x - kf * 0.693145752f) - kf * 1.42860677e-6f;  // ln2 split hi + lo
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return p * bits_to_float(static_cast<uint32_t>(k + 127) << 23);
}

// log1p(v) for v in [0, 1]: 2 atanh(s), s = v / (2 + v) <= 1/3, odd series to s^17 (< 1e-9 rel.)
inline float log1p_unit(float v) {
  const float s = v / (2.0f + v);
  const float s2 = s * s;
  float p = 1.0f / 17.0f;
  p = p * s2 + 1.0f / 15.0f;
  p = p * s2 + 1.0f / 13.0f;
  p = p * s2 + 1.0f / 11.0f;
  p = p * s2 + 1.0f / 9.0f;
  p = p * s2 + 1.0f / 7.0f;
  p = p * s2 + 1.0f / 5.0f;
  p = p * s2 + 1.0f / 3.0f;
  p = p * s2 + 1.0f;
  return 2.0f * s * p;
}

inline float softplus_f(float x) { return max_f(x, 0.0f) + log1p_unit(exp_f(-std::fabs(x))); }

// The hot loops are compiled once per x86-64 level (AVX-512, AVX2, SSE4.2, baseline) and the
// best one the CPU supports is picked at load (GCC function multi-versioning). Elsewhere: one
// build for the target.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TCL_VECTOR_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "arch=x86-64-v2", "default")))
#else
#define TCL_VECTOR_CLONES
#endif

struct Dims { int64_t L, b, E, N; };

// One row of the batch over all L steps. h: E*N scratch laid out (N, E) so every inner loop
// runs over contiguous E; At is A transposed to (N, E).
TCL_VECTOR_CLONES
void scan_row(const Dims d, int64_t row, const float* __restrict u, const float* __restrict delta,
              const float* __restrict At, const float* __restrict B, const float* __restrict C,
              const float* __restrict D, const float* __restrict z, const float* __restrict bias,
              bool softplus, float* __restrict h, float* __restrict dl, float* __restrict du,
              float* __restrict acc, float* __restrict y) {
  const int64_t E = d.E, N = d.N;
  std::fill(h, h + E * N, 0.0f);
  for (int64_t t = 0; t < d.L; ++t) {
    const int64_t xe = (t * d.b + row) * E, xn = (t * d.b + row) * N;
    const float* ut = u + xe;
    const float* dt = delta + xe;
    if (bias) {
      for (int64_t e = 0; e < E; ++e) dl[e] = dt[e] + bias[e];
    } else {
      std::copy(dt, dt + E, dl);
    }
    if (softplus) {
      for (int64_t e = 0; e < E; ++e) dl[e] = softplus_f(dl[e]);
    }
    for (int64_t e = 0; e < E; ++e) {
      du[e] = dl[e] * ut[e];
      acc[e] = 0.0f;
    }
    for (int64_t n = 0; n < N; ++n) {
      const float bn = B[xn + n], cn = C[xn + n];
      const float* an = At + n * E;
      float* hn = h + n * E;
      for (int64_t e = 0; e < E; ++e) {
        const float hv = exp_f(dl[e] * an[e]) * hn[e] + du[e] * bn;
        hn[e] = hv;
        acc[e] += cn * hv;
      }
    }
    float* yt = y + xe;
    if (D) {
      for (int64_t e = 0; e < E; ++e) acc[e] += D[e] * ut[e];
    }
    if (z) {
      const float* zt = z + xe;
      for (int64_t e = 0; e < E; ++e) yt[e] = acc[e] * (zt[e] / (1.0f + exp_f(-zt[e])));
    } else {
      for (int64_t e = 0; e < E; ++e) yt[e] = acc[e];
    }
  }
}

// The causal conv over all steps of rows [first, last): y[t, r] = act(bias + sum_k w_k * x[t-K+1+k, r]).
TCL_VECTOR_CLONES
void causal_conv(int64_t L, int64_t b, int64_t E, int64_t K, int64_t first, int64_t last, const float* __restrict x,
                 const float* __restrict w, const float* __restrict bias, bool silu, float* __restrict y) {
  for (int64_t t = 0; t < L; ++t) {
    for (int64_t row = first; row < last; ++row) {
      float* out = y + (t * b + row) * E;
      if (bias) {
        std::copy(bias, bias + E, out);
      } else {
        std::fill(out, out + E, 0.0f);
      }
      for (int64_t k = std::max<int64_t>(0, K - 1 - t); k < K; ++k) {
        const float* xs = x + ((t - (K - 1 - k)) * b + row) * E;
        const float* wk = w + k * E;
        for (int64_t e = 0; e < E; ++e) out[e] += wk[e] * xs[e];
      }
      if (silu) {
        for (int64_t e = 0; e < E; ++e) out[e] = out[e] / (1.0f + exp_f(-out[e]));
      }
    }
  }
}

}  // namespace

#endif  // TCL_CSRC_MAMBA_OPS_H_
