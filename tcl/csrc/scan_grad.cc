// The Mamba block's sequence ops for torch training on CPU, forward and backward, each one pass
// over the data (tcl.models.scans loads this with ctypes): the selective scan (a row's state in
// L1 for all its steps) and the depthwise causal conv with its SiLU.
//
//   h_t = exp(delta_t * A) * h_{t-1} + (delta_t * u_t) * B_t,   h_{-1} = 0
//   y_t = C_t . h_t
//
// u, delta, y (L, b, E); A (E, N); B, C (L, b, N); all float32, contiguous, time-major, as
// tcl.models.scans.scan_sequential_tm takes them (the D skip, the gate and the softplus stay
// torch ops around it). The torch version of the same scan runs a dozen small ops per step on
// the whole batch's state; here a row's (N, E) state stays in cache for all its steps, and rows
// are split over `threads` threads.
//
// The backward recomputes the row's states (L * N * E floats a thread, no (L, b, N, E) tensor is
// kept between the passes), then runs the state gradient back in time:
//   gh_t     = C_t gy_t + exp(delta_{t+1} A) gh_{t+1}      (d loss / d h_t)
//   gC_t     = h_t . gy_t                gB_t = gh_t . (delta_t u_t)
//   s_t      = B_t . gh_t (over N)      gu_t = delta_t s_t,  gdelta_t = u_t s_t + sum_n g_tn A_n
//   g_t      = gh_t * h_{t-1} * exp(delta_t A)     gA = sum_t,rows g_t delta_t
// exactly the arithmetic of scans._SelectiveScanFn.backward, fused.

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

#include "mamba_ops.h"

namespace {

// One row's gradients. At (N, E) is A transposed; gA (N, E) accumulates over the thread's rows.
// hs, dA: L * N * E scratch; gh: N * E; s, du: E.
TCL_VECTOR_CLONES
void scan_grad_row(const Dims d, int64_t row, const float* __restrict u, const float* __restrict delta,
                   const float* __restrict At, const float* __restrict B, const float* __restrict C,
                   const float* __restrict gy, float* __restrict gu, float* __restrict gdelta,
                   float* __restrict gB, float* __restrict gC, float* __restrict gA,
                   float* __restrict hs, float* __restrict dA, float* __restrict gh,
                   float* __restrict s, float* __restrict du) {
  const int64_t E = d.E, N = d.N, NE = N * E;
  // the states, as the forward computed them
  for (int64_t t = 0; t < d.L; ++t) {
    const int64_t xe = (t * d.b + row) * E, xn = (t * d.b + row) * N;
    const float* ut = u + xe;
    const float* dt = delta + xe;
    for (int64_t e = 0; e < E; ++e) du[e] = dt[e] * ut[e];
    float* ht = hs + t * NE;
    float* at = dA + t * NE;
    for (int64_t n = 0; n < N; ++n) {
      const float bn = B[xn + n];
      const float* an = At + n * E;
      float* hn = ht + n * E;
      float* a = at + n * E;
      if (t == 0) {
        for (int64_t e = 0; e < E; ++e) hn[e] = du[e] * bn;
      } else {
        const float* hp = hn - NE;
        for (int64_t e = 0; e < E; ++e) {
          a[e] = exp_f(dt[e] * an[e]);
          hn[e] = a[e] * hp[e] + du[e] * bn;
        }
      }
    }
  }
  // back in time
  std::fill(gh, gh + NE, 0.0f);
  for (int64_t t = d.L - 1; t >= 0; --t) {
    const int64_t xe = (t * d.b + row) * E, xn = (t * d.b + row) * N;
    const float* ut = u + xe;
    const float* dt = delta + xe;
    const float* gyt = gy + xe;
    const float* ht = hs + t * NE;
    for (int64_t e = 0; e < E; ++e) {
      du[e] = dt[e] * ut[e];
      s[e] = 0.0f;
    }
    for (int64_t n = 0; n < N; ++n) {
      const float cn = C[xn + n], bn = B[xn + n];
      float* ghn = gh + n * E;
      const float* hn = ht + n * E;
      float c_acc = 0.0f, b_acc = 0.0f;
#pragma omp simd reduction(+ : c_acc, b_acc)
      for (int64_t e = 0; e < E; ++e) {
        ghn[e] += cn * gyt[e];
        c_acc += hn[e] * gyt[e];
        b_acc += ghn[e] * du[e];
        s[e] += bn * ghn[e];
      }
      gC[xn + n] = c_acc;
      gB[xn + n] = b_acc;
    }
    float* gut = gu + xe;
    float* gdt = gdelta + xe;
    for (int64_t e = 0; e < E; ++e) {
      gut[e] = dt[e] * s[e];
      gdt[e] = ut[e] * s[e];
    }
    if (t == 0) break;  // h_{-1} = 0: no decay gradient, and gh is not needed further back
    const float* hp = ht - NE;
    const float* at = dA + t * NE;
    for (int64_t n = 0; n < N; ++n) {
      const float* an = At + n * E;
      const float* a = at + n * E;
      const float* hpn = hp + n * E;
      float* ghn = gh + n * E;
      float* gAn = gA + n * E;
      for (int64_t e = 0; e < E; ++e) {
        const float g = ghn[e] * hpn[e] * a[e];  // d loss / d (delta_t A)
        gAn[e] += g * dt[e];
        gdt[e] += g * an[e];
        ghn[e] *= a[e];
      }
    }
  }
}

// The conv's pre-activation gradient of one step and row: g * silu'(a), a = bias + sum_k w_k x_{t-K+1+k}
// recomputed (silu'(a) = s (1 + a (1 - s)), s = sigmoid(a)); also accumulates gw (K, E), gbias (E).
TCL_VECTOR_CLONES
void conv_grad_rows(int64_t L, int64_t b, int64_t E, int64_t K, int64_t first, int64_t last,
                    const float* __restrict x, const float* __restrict w, const float* __restrict bias,
                    const float* __restrict gy, float* __restrict gx, float* __restrict gw,
                    float* __restrict gbias, float* __restrict ga) {
  for (int64_t row = first; row < last; ++row) {
    for (int64_t t = L - 1; t >= 0; --t) {
      const int64_t xe = (t * b + row) * E;
      for (int64_t e = 0; e < E; ++e) ga[e] = bias ? bias[e] : 0.0f;
      for (int64_t k = std::max<int64_t>(0, K - 1 - t); k < K; ++k) {
        const float* xs = x + ((t - (K - 1 - k)) * b + row) * E;
        const float* wk = w + k * E;
        for (int64_t e = 0; e < E; ++e) ga[e] += wk[e] * xs[e];
      }
      const float* g = gy + xe;
      for (int64_t e = 0; e < E; ++e) {
        const float a = ga[e];
        const float sg = 1.0f / (1.0f + exp_f(-a));
        ga[e] = g[e] * sg * (1.0f + a * (1.0f - sg));
        gbias[e] += ga[e];
      }
      // a_t reads x_{t-K+1+k} through tap k: its gradient goes back there
      for (int64_t k = std::max<int64_t>(0, K - 1 - t); k < K; ++k) {
        const int64_t xs_off = ((t - (K - 1 - k)) * b + row) * E;
        const float* xs = x + xs_off;
        float* gxs = gx + xs_off;
        const float* wk = w + k * E;
        float* gwk = gw + k * E;
        for (int64_t e = 0; e < E; ++e) {
          gxs[e] += wk[e] * ga[e];
          gwk[e] += xs[e] * ga[e];
        }
      }
    }
  }
}

// rows [0, b) split into `threads` contiguous ranges, fn(first, last, thread index) on each
template <class Fn>
void over_rows(int64_t b, int threads, Fn fn) {
  const int64_t n = std::max<int64_t>(1, std::min<int64_t>(threads, b));
  if (n == 1) {
    fn(0, b, 0);
    return;
  }
  std::vector<std::thread> pool;
  for (int64_t i = 1; i < n; ++i) pool.emplace_back(fn, b * i / n, b * (i + 1) / n, static_cast<int>(i));
  fn(0, b / n, 0);
  for (auto& th : pool) th.join();
}

std::vector<float> transpose_a(const float* A, int64_t E, int64_t N) {
  std::vector<float> At(static_cast<size_t>(E * N));
  for (int64_t e = 0; e < E; ++e)
    for (int64_t n = 0; n < N; ++n) At[n * E + e] = A[e * N + n];
  return At;
}

}  // namespace

// y = the scan of (u, delta, A, B, C); shapes in the header. Returns 0.
extern "C" __attribute__((visibility("default")))
int tcl_scan_forward(int64_t L, int64_t b, int64_t E, int64_t N, const float* u, const float* delta,
                     const float* A, const float* B, const float* C, float* y, int threads) {
  const Dims d{L, b, E, N};
  const std::vector<float> At = transpose_a(A, E, N);
  over_rows(b, threads, [&](int64_t first, int64_t last, int) {
    std::vector<float> scratch(static_cast<size_t>(E * N + 3 * E));
    float* h = scratch.data();
    float* dl = h + E * N;
    for (int64_t row = first; row < last; ++row)
      scan_row(d, row, u, delta, At.data(), B, C, nullptr, nullptr, nullptr, false, h, dl, dl + E,
               dl + 2 * E, y);
  });
  return 0;
}

// The gradients of sum(y * gy) with respect to u, delta, A (E, N), B and C; every output is
// overwritten. Returns 0.
extern "C" __attribute__((visibility("default")))
int tcl_scan_backward(int64_t L, int64_t b, int64_t E, int64_t N, const float* u, const float* delta,
                      const float* A, const float* B, const float* C, const float* gy, float* gu,
                      float* gdelta, float* gA, float* gB, float* gC, int threads) {
  const Dims d{L, b, E, N};
  const int64_t NE = N * E;
  const std::vector<float> At = transpose_a(A, E, N);
  const int64_t n_threads = std::max<int64_t>(1, std::min<int64_t>(threads, b));
  std::vector<float> gA_parts(static_cast<size_t>(n_threads * NE), 0.0f);  // one (N, E) a thread
  over_rows(b, static_cast<int>(n_threads), [&](int64_t first, int64_t last, int i) {
    std::vector<float> scratch(static_cast<size_t>(2 * L * NE + NE + 2 * E));
    float* hs = scratch.data();
    float* dA = hs + L * NE;
    float* gh = dA + L * NE;
    float* s = gh + NE;
    for (int64_t row = first; row < last; ++row)
      scan_grad_row(d, row, u, delta, At.data(), B, C, gy, gu, gdelta, gB, gC, gA_parts.data() + i * NE,
                    hs, dA, gh, s, s + E);
  });
  for (int64_t e = 0; e < E; ++e)
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (int64_t i = 0; i < n_threads; ++i) acc += gA_parts[i * NE + n * E + e];
      gA[e * N + n] = acc;
    }
  return 0;
}

// y = silu(bias + sum_k w_k x_{t-K+1+k}) (x_s = 0 for s < 0): x, y (L, b, E); w (K, E); bias (E)
// or null. Returns 0.
extern "C" __attribute__((visibility("default")))
int tcl_conv_forward(int64_t L, int64_t b, int64_t E, int64_t K, const float* x, const float* w,
                     const float* bias, float* y, int threads) {
  over_rows(b, threads, [&](int64_t first, int64_t last, int) { causal_conv(L, b, E, K, first, last, x, w, bias, true, y); });
  return 0;
}

// The gradients of sum(y * gy) for tcl_conv_forward: gx (L, b, E), gw (K, E), gbias (E) (ignored
// when null); every output is overwritten. Returns 0.
extern "C" __attribute__((visibility("default")))
int tcl_conv_backward(int64_t L, int64_t b, int64_t E, int64_t K, const float* x, const float* w,
                      const float* bias, const float* gy, float* gx, float* gw, float* gbias, int threads) {
  std::fill(gx, gx + L * b * E, 0.0f);
  const int64_t n_threads = std::max<int64_t>(1, std::min<int64_t>(threads, b));
  // per thread: gw (K, E), gbias (E), the step's pre-activation gradient (E)
  std::vector<float> parts(static_cast<size_t>(n_threads * (K + 2) * E), 0.0f);
  over_rows(b, static_cast<int>(n_threads), [&](int64_t first, int64_t last, int i) {
    float* mine = parts.data() + i * (K + 2) * E;
    conv_grad_rows(L, b, E, K, first, last, x, w, bias, gy, gx, mine, mine + K * E, mine + (K + 1) * E);
  });
  for (int64_t j = 0; j < (K + 1) * E; ++j) {
    float acc = 0.0f;
    for (int64_t i = 0; i < n_threads; ++i) acc += parts[i * (K + 2) * E + j];
    if (j < K * E) {
      gw[j] = acc;
    } else if (gbias) {
      gbias[j - K * E] = acc;
    }
  }
  return 0;
}
