// Fused CPU causal self-attention with a hand-written backward pass (issue
// 18, goal 2): softmax(scale q k^T + causal mask) v, optionally with
// same-token depth keys and values in the same softmax (MoDA). See
// cpu_fused.h for the contract.
//
// Why: as ATen ops the attention is baddbmm, softmax and bmm forward and
// five batched GEMMs backward over B x H small matrices. ATen's CPU bmm runs
// those as one GEMM call per matrix behind a dispatcher round trip each
// (select, as_strided, resolve_conj, addmm_: ~74,000 op calls per training
// step at d = 256 / 16 heads, B = 16, T = 128, about half the step's time in
// a LibTorch profile); with a head dim of 16 the GEMMs themselves are too
// small for BLAS blocking to pay. Here each (batch, key/value head) is one
// task over the intra-op threads, whose keys and values stay in L1/L2 while
// every query row of its heads runs against them; the scores of a row are
// computed only up to its own position (no masked upper triangle), and the
// backward pass recomputes them from q and k with the saved log-sum-exp
// instead of keeping a B x H x T x T probability tensor (as flash attention
// does on GPUs).
//
// No BLAS here: the products are small register-blocked loops over a head
// dim of 8-128 (kRows query rows against kBlock keys, or kRows rows of
// weights against one value row), on explicit vectors. A BLAS call per
// (batch, head) would multiply the masked upper triangle too (twice the
// causal half's FLOPs) and keep T x T scores in memory.
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "cuda_ops/cpu_fused.h"
#include "cuda_ops/cpu_fused_isa.h"
// Last: the ISA of this object (cpu_fused_isa.h).
#include "cuda_ops/cpu_fused_target.h"
#include "cuda_ops/cpu_fused_vec.h"

namespace depthbench {
namespace cpu_fused {
namespace DEPTHBENCH_CPU_FUSED_ISA {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Scores of one query row are computed kBlock keys at a time, the block's
// partial sums held in registers across the head dim.
constexpr int64_t kBlock = 32;

int64_t RoundUp(int64_t n) { return (n + kBlock - 1) / kBlock * kBlock; }

struct AttnShape {
  int64_t B, H, KV, T, hd, S;  // S: depth slots (0: none)
  int64_t group() const { return H / KV; }
};

// Rows of a [B, heads, T, hd] tensor whose last dim is contiguous, through
// its strides: E = const T to read, T to write (the gradients, views of one
// packed q/k/v gradient among them).
template <typename E>
struct StridedRows {
  E* p = nullptr;  // null: an undefined tensor (no rows)
  int64_t sb = 0, sh = 0, st = 0;
  explicit StridedRows(const torch::Tensor& t) {
    if (!t.defined()) return;
    p = t.data_ptr<std::remove_const_t<E>>();
    sb = t.stride(0);
    sh = t.stride(1);
    st = t.stride(2);
  }
  E* at(int64_t b, int64_t h, int64_t t) const { return p + b * sb + h * sh + t * st; }
};
template <typename T>
using Rows = StridedRows<const T>;
template <typename T>
using OutRows = StridedRows<T>;

// Rotary embedding tables [T, hd] (trainer_core's Rope: cos, and sin with
// the first half negated): rope_t(x)[c] = x[c] cos[t][c] + x[c'] sin[t][c]
// with c' the same position in the other half. Null: q and k are used as
// given.
template <typename T>
struct RopeTables {
  const T* cos = nullptr;
  const T* sin = nullptr;
  explicit operator bool() const { return cos != nullptr; }
};

// Whether a depth slot's gradient sums over a group's query heads (a
// KV-head slot under GQA: zero-filled, then accumulated) rather than being
// written once per row.
inline bool SlotSummedOverGroup(bool per_query_head, int64_t group) {
  return !per_query_head && group > 1;
}

// MoDA's depth slots: S tensors [B, H or KV, T, hd] of keys and as many of
// values (any strides, last dim contiguous); query head h reads row (b, h, t)
// of an H-head slot and (b, h / group, t) of a KV-head slot.
template <typename T, typename R>
struct Slots {
  std::vector<R> k, v;
  std::vector<char> per_query;
  // An undefined key (and value) tensor: a slot without rows (has(j) false).
  Slots(const std::vector<torch::Tensor>& keys, const std::vector<torch::Tensor>& values,
        int64_t H) {
    for (size_t j = 0; j < keys.size(); ++j) {
      k.emplace_back(keys[j]);
      v.emplace_back(values[j]);
      per_query.push_back(keys[j].defined() && keys[j].size(1) == H);
    }
  }
  bool has(int64_t j) const { return k[j].p != nullptr; }
  auto key(int64_t j, int64_t b, int64_t h, int64_t g, int64_t t) const {
    return k[j].at(b, per_query[j] ? h : g, t);
  }
  auto value(int64_t j, int64_t b, int64_t h, int64_t g, int64_t t) const {
    return v[j].at(b, per_query[j] ? h : g, t);
  }
};

// y = mul rope_t(x) for one row (cs, sn: row t of the tables).
template <typename T, int HD>
inline void RopeRow(const T* __restrict x, const T* __restrict cs, const T* __restrict sn,
                    int64_t hd_rt, T mul, T* __restrict y) {
  const int64_t half = (HD > 0 ? HD : hd_rt) / 2;
  for (int64_t c = 0; c < half; ++c) {
    y[c] = (x[c] * cs[c] + x[c + half] * sn[c]) * mul;
    y[c + half] = (x[c + half] * cs[c + half] + x[c] * sn[c + half]) * mul;
  }
}

// y = mul rope_t^T(g), the adjoint: g cos plus the other half's g sin.
template <typename T, int HD>
inline void RopeAdjointRow(const T* __restrict g, const T* __restrict cs, const T* __restrict sn,
                           int64_t hd_rt, T mul, T* __restrict y) {
  const int64_t half = (HD > 0 ? HD : hd_rt) / 2;
  for (int64_t c = 0; c < half; ++c) {
    y[c] = (g[c] * cs[c] + g[c + half] * sn[c + half]) * mul;
    y[c + half] = (g[c + half] * cs[c + half] + g[c] * sn[c]) * mul;
  }
}

// Lanes of the head-dim vectors of a float kernel with head dim HD: the
// build's widest vector (VF: 16 in the AVX-512 build) where HD is a multiple
// of it, else V8f's 8; 0 (scalar loops) for doubles or other head dims.
template <typename T, int HD>
constexpr int kHdLanes = !std::is_same_v<T, float> || HD <= 0 ? 0
                         : HD % kVF == 0                     ? kVF
                         : HD % 8 == 0                       ? 8
                                                             : 0;
// Whether the head-dim loops run on vectors, and the vector type.
template <typename T, int HD>
constexpr bool kVecHd = kHdLanes<T, HD> > 0;
template <typename T, int HD>
using HdVec = std::conditional_t<kHdLanes<T, HD> == kVF, VF, V8f>;

template <typename T, int HD>
inline T DotHd(const T* a, const T* b, int64_t hd_rt) {
  if constexpr (kVecHd<T, HD>) {
    using V = HdVec<T, HD>;
    constexpr int W = kHdLanes<T, HD>;
    V acc = LoadV<V>(a) * LoadV<V>(b);
#pragma GCC unroll 16
    for (int c = W; c < HD; c += W) acc += LoadV<V>(a + c) * LoadV<V>(b + c);
    return SumV(acc);
  } else {
    const int64_t hd = HD > 0 ? HD : hd_rt;
    T sum = 0;
    for (int64_t c = 0; c < hd; ++c) sum += a[c] * b[c];
    return sum;
  }
}

// y[c] += w * x[c] over the head dim.
template <typename T, int HD>
inline void AxpyHd(T w, const T* x, T* y, int64_t hd_rt) {
  if constexpr (kVecHd<T, HD>) {
    using V = HdVec<T, HD>;
    constexpr int W = kHdLanes<T, HD>;
#pragma GCC unroll 16
    for (int c = 0; c < HD; c += W) StoreV<V>(y + c, LoadV<V>(y + c) + w * LoadV<V>(x + c));
  } else {
    const int64_t hd = HD > 0 ? HD : hd_rt;
    for (int64_t c = 0; c < hd; ++c) y[c] += w * x[c];
  }
}

// y[c] = w * x[c] + z[c] over the head dim (z null: w * x[c]).
template <typename T, int HD>
inline void ScaledPlusHd(T w, const T* x, const T* z, T* y, int64_t hd_rt) {
  if constexpr (kVecHd<T, HD>) {
    using V = HdVec<T, HD>;
    constexpr int W = kHdLanes<T, HD>;
#pragma GCC unroll 16
    for (int c = 0; c < HD; c += W) {
      const V wx = w * LoadV<V>(x + c);
      StoreV<V>(y + c, z ? wx + LoadV<V>(z + c) : wx);
    }
  } else {
    const int64_t hd = HD > 0 ? HD : hd_rt;
    for (int64_t c = 0; c < hd; ++c) y[c] = w * x[c] + (z ? z[c] : T(0));
  }
}

// out[r][c] = sum_{j < n} w[r * ld + j] rows[j * stride + c] for r < R:
// probability-weighted sums of value rows (and dq from the key rows) for R
// query rows at once, so each value row loaded serves R rows of products,
// the R HD-wide accumulators in registers on the vector path.
template <typename T, int HD, int R>
inline void WeightedRowSums(const T* w, int64_t ld, int64_t n, const T* rows, int64_t stride,
                            T* const* out, int64_t hd_rt) {
  if constexpr (kVecHd<T, HD>) {
    using V = HdVec<T, HD>;
    constexpr int W = kHdLanes<T, HD>, kC = HD / W;
    V acc[R][kC] = {};
    for (int64_t j = 0; j < n; ++j) {
      const float* row = rows + j * stride;
      V x[kC];
#pragma GCC unroll 16
      for (int c = 0; c < kC; ++c) x[c] = LoadV<V>(row + W * c);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const float wr = w[r * ld + j];
#pragma GCC unroll 16
        for (int c = 0; c < kC; ++c) acc[r][c] += wr * x[c];
      }
    }
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < kC; ++c) StoreV<V>(out[r] + W * c, acc[r][c]);
    }
  } else {
    const int64_t hd = HD > 0 ? HD : hd_rt;
    for (int r = 0; r < R; ++r) {
      std::fill(out[r], out[r] + hd, T(0));
      for (int64_t j = 0; j < n; ++j) AxpyHd<T, HD>(w[r * ld + j], rows + j * stride, out[r], hd);
    }
  }
}

// Query rows per block, forward and backward: their scores come from one
// pass over the block's keys, their probability-weighted sums from one pass
// over the value (key) rows, and in the backward the key and value gradient
// rows are updated once per block with kRows terms (one load and store of a
// row per kRows products instead of per product).
constexpr int kRows = 4;

// Vector registers a register-blocked loop below keeps accumulators in,
// about half the file: 16 of AVX-512's 32 zmm, 8 of AVX2's 16 ymm, 4 V8f
// (8 xmm) of the baseline's 16 xmm. More independent accumulators than an
// FMA's latency times its issue rate keep the FMA units busy (Zen 5: 4
// cycles x 2 per cycle = 8); fewer, the loop waits on each sum.
#if defined(DEPTHBENCH_CPU_FUSED_AVX512)
constexpr int kAccRegs = 16;
#elif defined(DEPTHBENCH_CPU_FUSED_AVX2)
constexpr int kAccRegs = 8;
#else
constexpr int kAccRegs = 4;
#endif

// The largest of 4, 2 and 1 query rows whose `per_row` accumulators each fit
// kAccRegs.
constexpr int RowsThatFit(int per_row) {
  return per_row * 4 <= kAccRegs ? 4 : per_row * 2 <= kAccRegs ? 2 : 1;
}
static_assert(kRows == 4, "RowsThatFit picks among 4, 2 and 1 rows of a block");

// Query rows per pass of WeightedRowSums: HD / lanes accumulators per row.
template <typename T, int HD>
constexpr int kSumRows = kVecHd<T, HD> ? RowsThatFit(HD / kHdLanes<T, HD>) : 1;

// s[r * ld + j] = sum_c a[r * hd + c] mt[c * tp + j] for the block's kRows
// rows and j < n (n a multiple of kBlock, mt zero-padded to tp columns):
// kBlock transposed keys at a time against as many rows as fit the
// registers, the partial sums held there across the head dim, so each key
// vector loaded serves those rows. (Written with explicit vectors: GCC kept
// the former plain-array accumulators of two rows on the stack, a store and
// reload per product.)
template <typename T, int HD>
inline void BlockTimesTransposed(const T* a, const T* mt, int64_t hd_rt, int64_t tp, int64_t n,
                                 T* s, int64_t ld) {
  const int64_t hd = HD > 0 ? HD : hd_rt;
  if constexpr (std::is_same_v<T, float>) {
    static_assert(kBlock % kVF == 0, "whole vectors of keys");
    constexpr int kK = kBlock / kVF, R = RowsThatFit(kK);
    for (int r0 = 0; r0 < kRows; r0 += R) {
      for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
        VF acc[R][kK] = {};
        const float* m = mt + j0;
        for (int64_t c = 0; c < hd; ++c, m += tp) {
          VF kv[kK];
#pragma GCC unroll 4
          for (int k = 0; k < kK; ++k) kv[k] = LoadVF(m + k * kVF);
#pragma GCC unroll 4
          for (int r = 0; r < R; ++r) {
            const VF x = BroadcastVF(a[(r0 + r) * hd + c]);
#pragma GCC unroll 4
            for (int k = 0; k < kK; ++k) acc[r][k] += x * kv[k];
          }
        }
        for (int r = 0; r < R; ++r) {
          for (int k = 0; k < kK; ++k) StoreVF(s + (r0 + r) * ld + j0 + k * kVF, acc[r][k]);
        }
      }
    }
  } else {
    for (int r = 0; r < kRows; ++r) {
      T* sr = s + r * ld;
      std::fill(sr, sr + n, T(0));
      for (int64_t c = 0; c < hd; ++c) {
        const T x = a[r * hd + c];
        const T* m = mt + c * tp;
        for (int64_t j = 0; j < n; ++j) sr[j] += x * m[j];
      }
    }
  }
}

// WeightedRowSums over the block's kRows rows (w: kRows rows of ld), as
// many rows a pass as fit the registers.
template <typename T, int HD>
inline void BlockWeightedRowSums(const T* w, int64_t ld, int64_t n, const T* rows, int64_t stride,
                                 T* const* out, int64_t hd) {
  constexpr int R = kSumRows<T, HD>;
  for (int r0 = 0; r0 < kRows; r0 += R) {
    WeightedRowSums<T, HD, R>(w + r0 * ld, ld, n, rows, stride, out + r0, hd);
  }
}

// dst[j][c] += sum_r coef[r * ld + j] * vecs[r * hd + c] for j < n, r < kRows.
template <typename T, int HD>
inline void RankUpdate(const T* coef, int64_t ld, const T* vecs, int64_t n, T* dst,
                       int64_t hd_rt) {
  if constexpr (kVecHd<T, HD> && HD % 16 == 0) {
    // All HD columns at once where the kRows vectors' HD / kVF registers
    // each fit (AVX-512 up to HD = 64), else by 16 columns: each pass
    // streams the n destination rows and broadcasts the coefficients again.
    constexpr int C = kRows * HD / kVF <= kAccRegs ? HD : 16;
    for (int c = 0; c < HD; c += C) {
      const float* v[kRows];
      for (int r = 0; r < kRows; ++r) v[r] = vecs + r * HD + c;
      RankUpdateBlock<kRows, C>(coef, ld, v, n, dst + c, HD);
    }
  } else if constexpr (kVecHd<T, HD>) {
    for (int64_t j = 0; j < n; ++j) {
      const float c0 = coef[j], c1 = coef[ld + j], c2 = coef[2 * ld + j], c3 = coef[3 * ld + j];
      float* d = dst + j * HD;
#pragma GCC unroll 16
      for (int c = 0; c < HD; c += 8) {
        V8f acc = Load8(d + c);
        acc += c0 * Load8(vecs + c);
        acc += c1 * Load8(vecs + HD + c);
        acc += c2 * Load8(vecs + 2 * HD + c);
        acc += c3 * Load8(vecs + 3 * HD + c);
        Store8(d + c, acc);
      }
    }
  } else {
    const int64_t hd = HD > 0 ? HD : hd_rt;
    for (int64_t j = 0; j < n; ++j) {
      for (int r = 0; r < kRows; ++r) AxpyHd<T, HD>(coef[r * ld + j], vecs + r * hd, dst + j * hd, hd);
    }
  }
}

// s[j] = exp(s[j] - shift) for j < n; returns the sum of the new values.
inline float ExpShiftSum(float* s, int64_t n, float shift) {
  const V8f sh = Broadcast8(shift);
  V8f acc{};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const V8f e = Exp8(Load8(s + j) - sh);
    Store8(s + j, e);
    acc += e;
  }
  float sum = Sum8(acc);
  if (j < n) {
    float tail[8] = {};
    for (int64_t k = j; k < n; ++k) tail[k - j] = s[k] - shift;
    const V8f e = Exp8(Load8(tail));
    for (int64_t k = j; k < n; ++k) {
      s[k] = e[k - j];
      sum += e[k - j];
    }
  }
  return sum;
}
inline double ExpShiftSum(double* s, int64_t n, double shift) {
  double sum = 0;
  for (int64_t j = 0; j < n; ++j) sum += (s[j] = std::exp(s[j] - shift));
  return sum;
}

template <typename T>
inline T RowMax(const T* __restrict s, int64_t n) {
  constexpr int kParts = 8;
  T part[kParts];
  for (int k = 0; k < kParts; ++k) part[k] = -std::numeric_limits<T>::infinity();
  int64_t j = 0;
  for (; j + kParts <= n; j += kParts) {
    for (int k = 0; k < kParts; ++k) part[k] = part[k] < s[j + k] ? s[j + k] : part[k];
  }
  T m = part[0];
  for (int k = 1; k < kParts; ++k) m = m < part[k] ? part[k] : m;
  for (; j < n; ++j) m = m < s[j] ? s[j] : m;
  return m;
}

// Rows (b, h, t < T) of x, rotated by the tables if given (written into
// buf, hd per row): the first row and the row stride.
template <typename T, int HD>
std::pair<const T*, int64_t> RotatedRows(const Rows<T>& x, int64_t b, int64_t h, int64_t T_len,
                                         int64_t hd, const RopeTables<T>& rope, T* buf) {
  if (!rope) return {x.at(b, h, 0), x.st};
  for (int64_t t = 0; t < T_len; ++t) {
    RopeRow<T, HD>(x.at(b, h, t), rope.cos + t * hd, rope.sin + t * hd, hd, T(1), buf + t * hd);
  }
  return {buf, hd};
}

// mt[c * tp + t] = rows[t * stride + c], zero for t >= T. By tiles of 16
// rows: each destination row gets 16 consecutive values (one cache line of
// floats) from 16 source rows that stay in L1 across the tile's columns.
// (Row by row, every value was a store to another destination row: a
// tenth of the backward's time at head dim 64.)
template <typename T>
void Transpose(const T* rows, int64_t stride, int64_t T_len, int64_t hd, int64_t tp, T* mt) {
  constexpr int64_t kTile = 16;
  int64_t t0 = 0;
  for (; t0 + kTile <= T_len; t0 += kTile) {
    const T* r = rows + t0 * stride;
    for (int64_t c = 0; c < hd; ++c) {
      T* m = mt + c * tp + t0;
#pragma GCC unroll 16
      for (int64_t t = 0; t < kTile; ++t) m[t] = r[t * stride + c];
    }
  }
  for (int64_t c = 0; c < hd; ++c) {
    T* m = mt + c * tp;
    for (int64_t t = t0; t < T_len; ++t) m[t] = rows[t * stride + c];
    std::fill(m + T_len, m + tp, T(0));
  }
}

// qs = scale rope_i(q row (b, h, i)), or scale q without tables.
template <typename T, int HD>
inline void ScaledQuery(const Rows<T>& qr, const RopeTables<T>& rope, int64_t b, int64_t h,
                        int64_t i, int64_t hd, T sc, T* qs) {
  const T* qi = qr.at(b, h, i);
  if (rope) {
    RopeRow<T, HD>(qi, rope.cos + i * hd, rope.sin + i * hd, hd, sc, qs);
  } else {
    for (int64_t c = 0; c < hd; ++c) qs[c] = qi[c] * sc;
  }
}

// The depth slots are visited slot-major: one slot's rows for every query
// row of a head, then the next slot's, so each pass reads a handful of
// sequential row streams (the slot's keys and values, their gradients)
// that the hardware prefetchers follow. Row-major (every slot's row for
// one query row, then the next row), the last layer of MoDA at L=8 read 14
// slots x 6 streams in the backward, far more than the prefetchers track,
// and the depth part, a few percent of the attention's FLOPs, took more
// time than the sequence attention itself (issue 18). The per-row state
// the slot passes need waits in per-head buffers: the depth queries [T, hd]
// both ways, the depth scores [S, T] forward, rowsum(dO o) [T] backward.

// out[r] = a_r . b_r over the head dim for the rows r < n <= kVF (a_r at
// a + r * lda, b_r at b + r * ldb), out with room for kVF values. On the
// vector path the kVF rows are reduced together (RowDotsVF): one horizontal
// sum per row (DotHd's) was a chain of lane extracts and adds per product,
// and the depth slots' passes are little else.
template <typename T, int HD>
inline void RowDots(const T* a, int64_t lda, const T* b, int64_t ldb, int64_t n, T* out,
                    int64_t hd_rt) {
  if constexpr (kHdLanes<T, HD> == kVF) {
    RowDotsVF(a, lda, b, ldb, n, HD, out);
  } else {
    for (int64_t r = 0; r < n; ++r) out[r] = DotHd<T, HD>(a + r * lda, b + r * ldb, hd_rt);
  }
}

// How many rows ahead the slot passes ask for the slot rows they will read
// or write (PrefetchL1). In a MoDA step the slots are out of cache: written
// by earlier layers' forward (or by later layers' backward, for their
// gradients), T-major views with rows 1-1.5 KB apart, so the hardware's
// stream prefetchers, which stop at 4 KB pages, fetch little ahead of
// rows 4 to a page. perf put the slot backward's time on the first store
// into each gradient row and on the first load of each key row.
constexpr int64_t kSlotRowsAhead = 8;

// Asks for row i + kSlotRowsAhead (rows from `rows`, `stride` apart) when it
// is below T_len.
template <typename T, bool kForWrite = false>
inline void PrefetchSlotRow(const T* rows, int64_t stride, int64_t i, int64_t T_len,
                            int64_t hd) {
  if (rows != nullptr && i + kSlotRowsAhead < T_len) {
    PrefetchL1<kForWrite>(rows + (i + kSlotRowsAhead) * stride,
                          hd * static_cast<int64_t>(sizeof(T)));
  }
}

// Asks for a slot pass's first kSlotRowsAhead rows, which the pass's own
// prefetching (PrefetchSlotRow) never covers: issued a pass or a slot
// ahead, they arrive while the rows before them are worked on.
template <typename T, bool kForWrite = false>
inline void PrefetchFirstSlotRows(const T* rows, int64_t stride, int64_t T_len, int64_t hd) {
  if (rows == nullptr) return;
  for (int64_t i = 0; i < std::min(kSlotRowsAhead, T_len); ++i) {
    PrefetchL1<kForWrite>(rows + i * stride, hd * static_cast<int64_t>(sizeof(T)));
  }
}

// out[i] = a_i . row_i(i) for i < T (a_i at a + i * lda; rows given by the
// first row and their stride), by chunks of kVF rows (RowDots), asking for
// the rows kSlotRowsAhead ahead; out with room for T rounded up to kVF.
template <typename T, int HD>
inline void DotsAlongT(const T* a, int64_t lda, const T* rows, int64_t stride, int64_t T_len,
                       T* out, int64_t hd) {
  for (int64_t i0 = 0; i0 < T_len; i0 += kVF) {
    for (int64_t r = 0; r < kVF; ++r) PrefetchSlotRow(rows, stride, i0 + r, T_len, hd);
    RowDots<T, HD>(a + i0 * lda, lda, rows + i0 * stride, stride,
                   std::min<int64_t>(kVF, T_len - i0), out + i0, hd);
  }
}

// e[j * ld + i] = qd_i . key_j(i) for every slot j and row i < T of head h
// (ld >= T rounded up to kVF): the depth scores, slot-major; qd: [T, hd]
// scaled (unrotated) queries.
template <typename T, int HD>
void DepthScores(const Slots<T, Rows<T>>& depth, int64_t b, int64_t h, int64_t g, int64_t T_len,
                 int64_t hd, const T* qd, T* e, int64_t ld) {
  const size_t S = depth.k.size();
  if (S > 0) PrefetchFirstSlotRows(depth.key(0, b, h, g, 0), depth.k[0].st, T_len, hd);
  for (size_t j = 0; j < S; ++j) {
    // The next slot's first keys, or the first values of the value pass.
    if (j + 1 < S) {
      PrefetchFirstSlotRows(depth.key(j + 1, b, h, g, 0), depth.k[j + 1].st, T_len, hd);
    } else {
      PrefetchFirstSlotRows(depth.value(0, b, h, g, 0), depth.v[0].st, T_len, hd);
    }
    DotsAlongT<T, HD>(qd, hd, depth.key(j, b, h, g, 0), depth.k[j].st, T_len, e + j * ld, hd);
  }
}

// qd[i] = scale q_i for i < T, unrotated: the query the depth keys are
// scored with (a depth key is its own token's, and RoPE at relative offset 0
// is the identity on q . k, so depth keys and their query stay unrotated).
template <typename T>
void DepthQueries(const Rows<T>& qr, int64_t b, int64_t h, int64_t T_len, int64_t hd, T sc,
                  T* qd) {
  for (int64_t i = 0; i < T_len; ++i) {
    const T* qi = qr.at(b, h, i);
    for (int64_t c = 0; c < hd; ++c) qd[i * hd + c] = qi[c] * sc;
  }
}

template <typename T, int HD>
void Forward(const AttnShape& sh, const torch::Tensor& q, const torch::Tensor& k,
             const torch::Tensor& v, const std::vector<torch::Tensor>& dk,
             const std::vector<torch::Tensor>& dv, double scale, const RopeTables<T>& rope,
             torch::Tensor& out, torch::Tensor& lse) {
  const Rows<T> qr(q), kr(k), vr(v);
  const Slots<T, Rows<T>> depth(dk, dv, sh.H);
  T* op = out.data_ptr<T>();
  T* lp = lse.data_ptr<T>();
  const int64_t hd = HD > 0 ? HD : sh.hd, T_len = sh.T, S = sh.S, tp = RoundUp(T_len);
  const T sc = static_cast<T>(scale);
  at::parallel_for(0, sh.B * sh.KV, 1, [&](int64_t begin, int64_t end) {
    // Scores of a block's kRows query rows (row r at sb + r * (tp + S), its
    // depth scores at column tp), their scaled queries at qs + r * hd, and
    // a row of output for each row past the end (discarded); with depth
    // slots, the head's depth queries [T, hd] and its depth scores [S, T]
    // (DepthScores), which the row pass turns into probabilities for the
    // slot pass that adds the slots' values.
    const int64_t ld = tp + S;
    std::vector<T> kt(static_cast<size_t>(hd * tp)), sb(static_cast<size_t>(kRows * ld)),
        qs(static_cast<size_t>(kRows * hd)), spare(static_cast<size_t>(kRows * hd)),
        qd(static_cast<size_t>(S > 0 ? T_len * hd : 0)), es(static_cast<size_t>(S * tp)),
        krot(rope ? static_cast<size_t>(T_len * hd) : 0);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / sh.KV, g = task % sh.KV;
      const auto [k_rows, k_stride] = RotatedRows<T, HD>(kr, b, g, T_len, hd, rope, krot.data());
      Transpose(k_rows, k_stride, T_len, hd, tp, kt.data());
      for (int64_t h = g * sh.group(); h < (g + 1) * sh.group(); ++h) {
        if (S > 0) {
          DepthQueries(qr, b, h, T_len, hd, sc, qd.data());
          DepthScores<T, HD>(depth, b, h, g, T_len, hd, qd.data(), es.data(), tp);
        }
        for (int64_t i0 = 0; i0 < T_len; i0 += kRows) {
          const int64_t n = std::min<int64_t>(i0 + kRows, T_len);  // keys the block sees
          for (int64_t r = 0; r < kRows; ++r) {
            if (i0 + r < T_len) {
              ScaledQuery<T, HD>(qr, rope, b, h, i0 + r, hd, sc, qs.data() + r * hd);
            } else {  // scored as a row of zeros
              std::fill(qs.begin() + r * hd, qs.begin() + (r + 1) * hd, T(0));
            }
          }
          BlockTimesTransposed<T, HD>(qs.data(), kt.data(), hd, tp, RoundUp(n), sb.data(), ld);
          T* outs[kRows];
          T inv[kRows];
          for (int64_t r = 0; r < kRows; ++r) {
            const int64_t i = i0 + r;
            T* s = sb.data() + r * ld;
            if (i >= T_len) {  // past the end: weights of zero into a spare row
              std::fill(s, s + n, T(0));
              outs[r] = spare.data() + r * hd;
              continue;
            }
            // The i + 1 sequence scores, then (from column tp) the depth
            // scores, in one softmax; columns i < j < n are masked.
            T* e = s + tp;
            for (int64_t j = 0; j < S; ++j) e[j] = es[j * tp + i];
            const T m = std::max(RowMax(s, i + 1), RowMax(e, S));
            const T sum = ExpShiftSum(s, i + 1, m) + ExpShiftSum(e, S, m);
            std::fill(s + i + 1, s + n, T(0));
            inv[r] = T(1) / sum;
            outs[r] = op + ((b * T_len + i) * sh.H + h) * hd;
            for (int64_t j = 0; j < S; ++j) es[j * tp + i] = e[j] * inv[r];
            lp[(b * sh.H + h) * T_len + i] = m + std::log(sum);
          }
          BlockWeightedRowSums<T, HD>(sb.data(), ld, n, vr.at(b, g, 0), vr.st, outs, hd);
          for (int64_t r = 0; r < n - i0; ++r) {
            for (int64_t c = 0; c < hd; ++c) outs[r][c] *= inv[r];
          }
        }
        // The slots' values, weighted by their probabilities, slot-major
        // (output rows of head h from o0, sh.H * hd apart).
        T* o0 = op + (b * T_len * sh.H + h) * hd;
        for (int64_t j = 0; j < S; ++j) {
          const T* pj = es.data() + j * tp;
          const T* vj = depth.value(j, b, h, g, 0);
          const int64_t vst = depth.v[j].st;
          if (j + 1 < S) {
            PrefetchFirstSlotRows(depth.value(j + 1, b, h, g, 0), depth.v[j + 1].st, T_len, hd);
          }
          for (int64_t i = 0; i < T_len; ++i) {
            PrefetchSlotRow(vj, vst, i, T_len, hd);
            AxpyHd<T, HD>(pj[i], vj + i * vst, o0 + i * sh.H * hd, hd);
          }
        }
      }
    }
  });
}

template <typename T, int HD>
void Backward(const AttnShape& sh, const torch::Tensor& q, const torch::Tensor& k,
              const torch::Tensor& v, const std::vector<torch::Tensor>& dk,
              const std::vector<torch::Tensor>& dv, double scale, const RopeTables<T>& rope,
              const torch::Tensor& out, const torch::Tensor& lse, const torch::Tensor& dout,
              torch::Tensor& gq, torch::Tensor& gk, torch::Tensor& gv,
              std::vector<torch::Tensor>& gdk, std::vector<torch::Tensor>& gdv,
              const std::vector<torch::Tensor>& in_gdk, const std::vector<torch::Tensor>& in_gdv,
              const torch::Tensor& in_gk, const torch::Tensor& in_gv) {
  const Rows<T> qr(q), kr(k), vr(v);
  // Gradients arriving for the unrotated keys and the values themselves
  // (MoDA's returned views; undefined: none), added as gk and gv are
  // written.
  const Rows<T> in_gkr(in_gk), in_gvr(in_gv);
  const Slots<T, Rows<T>> depth(dk, dv, sh.H);
  // Gradients already arriving for slots written once per row (passed-
  // through slots; undefined: none), added as those rows are written.
  const Slots<T, Rows<T>> incoming(in_gdk, in_gdv, sh.H);
  // Written per query head; a KV-head slot with several query heads per
  // key/value head is summed over them (zero-filled by the caller).
  const Slots<T, OutRows<T>> gdepth(gdk, gdv, sh.H);
  const T* op = out.data_ptr<T>();
  const T* lp = lse.data_ptr<T>();
  const T* gop = dout.data_ptr<T>();
  // [B, H, T, hd] and [B, KV, T, hd] through their strides.
  const OutRows<T> gqr(gq), gkr(gk), gvr(gv);
  const int64_t hd = HD > 0 ? HD : sh.hd, T_len = sh.T, S = sh.S, tp = RoundUp(T_len);
  const T sc = static_cast<T>(scale);
  at::parallel_for(0, sh.B * sh.KV, 1, [&](int64_t begin, int64_t end) {
    // Per block of kRows query rows: probabilities P and score gradients
    // dS (rows of tp, zero past each row's own position), the scaled
    // queries and the output gradients. With depth slots, per head: the
    // depth queries [T, hd], rowsum(dO o) per row [T], and one slot's
    // probabilities and dO v rows [T] at a time (the slot pass).
    std::vector<T> kt(static_cast<size_t>(hd * tp)), vt(static_cast<size_t>(hd * tp)),
        P(static_cast<size_t>(kRows * tp)), DS(static_cast<size_t>(kRows * tp)),
        qsb(static_cast<size_t>(kRows * hd)), gob(static_cast<size_t>(kRows * hd)),
        qd(static_cast<size_t>(S > 0 ? T_len * hd : 0)), rowsum(static_cast<size_t>(T_len)),
        pe(static_cast<size_t>(S > 0 ? tp : 0)), dpe(static_cast<size_t>(S > 0 ? tp : 0)),
        gqb(static_cast<size_t>(kRows * hd)),
        gk_task(static_cast<size_t>(T_len * hd)), gv_task(static_cast<size_t>(T_len * hd)),
        krot(rope ? static_cast<size_t>(T_len * hd) : 0);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / sh.KV, g = task % sh.KV;
      // The (rotated) key rows, for the scores and for dq.
      const auto [k_rows, k_stride] = RotatedRows<T, HD>(kr, b, g, T_len, hd, rope, krot.data());
      Transpose(k_rows, k_stride, T_len, hd, tp, kt.data());
      Transpose(vr.at(b, g, 0), vr.st, T_len, hd, tp, vt.data());
      // The task's key and value gradients (of the rotated keys), summed
      // over its query heads, then written out (rotated back) below.
      std::fill(gk_task.begin(), gk_task.end(), T(0));
      std::fill(gv_task.begin(), gv_task.end(), T(0));
      for (int64_t h = g * sh.group(); h < (g + 1) * sh.group(); ++h) {
        for (int64_t i0 = 0; i0 < T_len; i0 += kRows) {
          const int64_t n = std::min<int64_t>(i0 + kRows, T_len);  // keys the block sees
          // Scaled queries and output gradients of the block's rows (zeros
          // past the end), then their score rows P and dO v^T rows (in DS)
          // up to the block's last key.
          for (int r = 0; r < kRows; ++r) {
            T* qs = qsb.data() + r * hd;
            T* go = gob.data() + r * hd;
            const int64_t i = i0 + r;
            if (i >= T_len) {
              std::fill(qs, qs + hd, T(0));
              std::fill(go, go + hd, T(0));
              continue;
            }
            ScaledQuery<T, HD>(qr, rope, b, h, i, hd, sc, qs);
            const T* goi = gop + ((b * T_len + i) * sh.H + h) * hd;
            std::copy(goi, goi + hd, go);
          }
          BlockTimesTransposed<T, HD>(qsb.data(), kt.data(), hd, tp, RoundUp(n), P.data(), tp);
          BlockTimesTransposed<T, HD>(gob.data(), vt.data(), hd, tp, RoundUp(n), DS.data(), tp);
          for (int r = 0; r < kRows; ++r) {
            T* p = P.data() + r * tp;
            T* ds = DS.data() + r * tp;
            const T* go = gob.data() + r * hd;
            const int64_t i = i0 + r;
            if (i >= T_len) {  // past the end: a block row of zeros
              std::fill(p, p + n, T(0));
              std::fill(ds, ds + n, T(0));
              continue;
            }
            // Probabilities, recomputed: exp(score - log-sum-exp).
            const T l = lp[(b * sh.H + h) * T_len + i];
            ExpShiftSum(p, i + 1, l);
            // dP = dO v^T; dS = P (dP - rowsum(dO o)).
            const T D = DotHd<T, HD>(go, op + ((b * T_len + i) * sh.H + h) * hd, hd);
            rowsum[i] = D;
            for (int64_t j = 0; j <= i; ++j) ds[j] = p[j] * (ds[j] - D);
            for (int64_t j = i + 1; j < n; ++j) p[j] = ds[j] = T(0);
          }
          // dq = scale rope_i^T(dS k), k rotated; the depth keys' term (not
          // rotated, DepthQueries) is added by the slot pass below.
          T* gq_block[kRows];
          for (int r = 0; r < kRows; ++r) gq_block[r] = gqb.data() + r * hd;
          BlockWeightedRowSums<T, HD>(DS.data(), tp, n, k_rows, k_stride, gq_block, hd);
          for (int64_t i = i0; i < n; ++i) {
            const T* gqi = gq_block[i - i0];
            T* gq_row = gqr.at(b, h, i);
            if (rope) {
              RopeAdjointRow<T, HD>(gqi, rope.cos + i * hd, rope.sin + i * hd, hd, sc, gq_row);
            } else {
              for (int64_t c = 0; c < hd; ++c) gq_row[c] = gqi[c] * sc;
            }
          }
          // dk_j += sum_r dS_rj scale q_r; dv_j += sum_r P_rj dO_r.
          RankUpdate<T, HD>(DS.data(), tp, qsb.data(), n, gk_task.data(), hd);
          RankUpdate<T, HD>(P.data(), tp, gob.data(), n, gv_task.data(), hd);
        }
        if (S == 0) continue;
        // The depth slots, slot-major (see DepthScores): per row i, with
        // pe = exp(qd_i . k_j - lse_i) and dse = pe (dO_i . v_j - rowsum_i),
        //   dq_i += scale dse k_j;  dk_j = dse qd_i;  dv_j = pe dO_i
        // (plus the gradient arriving for the slot's row, or summed over
        // the group's query heads).
        DepthQueries(qr, b, h, T_len, hd, sc, qd.data());
        const T* l_row = lp + (b * sh.H + h) * T_len;
        // Rows are walked from their first row and stride, hoisted: per
        // row, Slots' lookups cost more than the row's arithmetic. The
        // output gradient's rows of head h: from go0, sh.H * hd apart.
        const T* go0 = gop + (b * T_len * sh.H + h) * hd;
        T* gq0 = gqr.at(b, h, 0);
        PrefetchFirstSlotRows(depth.key(0, b, h, g, 0), depth.k[0].st, T_len, hd);
        for (int64_t j = 0; j < S; ++j) {
          const T* kj = depth.key(j, b, h, g, 0);
          const T* vj = depth.value(j, b, h, g, 0);
          T* gkj = gdepth.key(j, b, h, g, 0);
          T* gvj = gdepth.value(j, b, h, g, 0);
          // The arriving gradients' rows; none to ask for where they are
          // the slot's gradient itself (taken over, added into in place).
          const T* ikj = incoming.has(j) ? incoming.key(j, b, h, g, 0) : nullptr;
          const T* ivj = incoming.has(j) ? incoming.value(j, b, h, g, 0) : nullptr;
          const T* ik_ask = ikj != gkj ? ikj : nullptr;
          const T* iv_ask = ivj != gvj ? ivj : nullptr;
          const int64_t kst = depth.k[j].st, vst = depth.v[j].st, gkst = gdepth.k[j].st,
                        gvst = gdepth.v[j].st, ikst = incoming.k[j].st, ivst = incoming.v[j].st;
          // The first rows of this slot's later passes and of the next
          // slot's keys.
          PrefetchFirstSlotRows(vj, vst, T_len, hd);
          PrefetchFirstSlotRows<T, true>(gkj, gkst, T_len, hd);
          PrefetchFirstSlotRows<T, true>(gvj, gvst, T_len, hd);
          PrefetchFirstSlotRows(ik_ask, ikst, T_len, hd);
          PrefetchFirstSlotRows(iv_ask, ivst, T_len, hd);
          if (j + 1 < S) {
            PrefetchFirstSlotRows(depth.key(j + 1, b, h, g, 0), depth.k[j + 1].st, T_len, hd);
          }
          DotsAlongT<T, HD>(qd.data(), hd, kj, kst, T_len, pe.data(), hd);
          DotsAlongT<T, HD>(go0, sh.H * hd, vj, vst, T_len, dpe.data(), hd);
          for (int64_t i = 0; i < T_len; ++i) {
            pe[i] -= l_row[i];
            dpe[i] -= rowsum[i];
          }
          ExpShiftSum(pe.data(), T_len, T(0));
          for (int64_t i = 0; i < T_len; ++i) dpe[i] *= pe[i];  // dse
          const bool summed = SlotSummedOverGroup(gdepth.per_query[j], sh.group());
          for (int64_t i = 0; i < T_len; ++i) {
            PrefetchSlotRow<T, true>(gkj, gkst, i, T_len, hd);
            PrefetchSlotRow<T, true>(gvj, gvst, i, T_len, hd);
            PrefetchSlotRow(ik_ask, ikst, i, T_len, hd);
            PrefetchSlotRow(iv_ask, ivst, i, T_len, hd);
            const T* qdi = qd.data() + i * hd;
            const T* go = go0 + i * sh.H * hd;
            const T dse = dpe[i];
            AxpyHd<T, HD>(dse * sc, kj + i * kst, gq0 + i * gqr.st, hd);
            T* gk_row = gkj + i * gkst;
            T* gv_row = gvj + i * gvst;
            if (summed) {  // summed over the group's query heads (zero-filled)
              AxpyHd<T, HD>(dse, qdi, gk_row, hd);
              AxpyHd<T, HD>(pe[i], go, gv_row, hd);
            } else {  // this row only, plus what arrives (if any)
              ScaledPlusHd<T, HD>(dse, qdi, ikj ? ikj + i * ikst : nullptr, gk_row, hd);
              ScaledPlusHd<T, HD>(pe[i], go, ivj ? ivj + i * ivst : nullptr, gv_row, hd);
            }
          }
        }
      }
      for (int64_t t = 0; t < T_len; ++t) {
        const T* gk_t = gk_task.data() + t * hd;
        T* gk_row = gkr.at(b, g, t);
        T* gv_row = gvr.at(b, g, t);
        if (rope) {
          RopeAdjointRow<T, HD>(gk_t, rope.cos + t * hd, rope.sin + t * hd, hd, T(1), gk_row);
        } else {
          std::copy(gk_t, gk_t + hd, gk_row);
        }
        std::copy(gv_task.data() + t * hd, gv_task.data() + (t + 1) * hd, gv_row);
        if (in_gkr.p != nullptr) AxpyHd<T, HD>(T(1), in_gkr.at(b, g, t), gk_row, hd);
        if (in_gvr.p != nullptr) AxpyHd<T, HD>(T(1), in_gvr.at(b, g, t), gv_row, hd);
      }
    }
  });
}

// Head dims compiled with a constant trip count (the dot/axpy loops unroll);
// others run the same code with the dim at run time.
template <typename Fn>
void WithHeadDim(int64_t hd, Fn&& fn) {
  switch (hd) {
    case 16: fn(std::integral_constant<int, 16>{}); break;
    case 32: fn(std::integral_constant<int, 32>{}); break;
    case 64: fn(std::integral_constant<int, 64>{}); break;
    default: fn(std::integral_constant<int, 0>{}); break;
  }
}

// An undefined tensor passes through.
torch::Tensor LastDimContiguous(const torch::Tensor& t) {
  return !t.defined() || t.stride(-1) == 1 ? t : t.contiguous();
}

// Runs the kernels for q [B, H, T, hd], k and v [B, KV, T, hd] (views of any
// strides, last dim contiguous), optional rope tables [T, hd] (undefined:
// none) and S depth slots of keys and values ([B, H or KV, T, hd] each).
struct AttnArgs {
  torch::Tensor q, k, v;
  std::vector<torch::Tensor> dk, dv;
  torch::Tensor cos, sin;
  double scale;
  AttnShape shape() const {
    return {q.size(0), q.size(1), k.size(1), q.size(2), q.size(3), static_cast<int64_t>(dk.size())};
  }
};

template <typename T>
RopeTables<T> TablesOf(const AttnArgs& a) {
  RopeTables<T> r;
  if (a.cos.defined()) {
    r.cos = a.cos.data_ptr<T>();
    r.sin = a.sin.data_ptr<T>();
  }
  return r;
}

// -> {out [B, T, H * hd], lse [B, H, T]}
std::pair<torch::Tensor, torch::Tensor> AttnForward(const AttnArgs& a) {
  const AttnShape sh = a.shape();
  torch::Tensor out = torch::empty({sh.B, sh.T, sh.H * sh.hd}, a.q.options());
  torch::Tensor lse = torch::empty({sh.B, sh.H, sh.T}, a.q.options());
  AT_DISPATCH_FLOATING_TYPES(a.q.scalar_type(), "cpu_fused::CausalAttention", [&] {
    WithHeadDim(sh.hd, [&](auto hd_c) {
      Forward<scalar_t, decltype(hd_c)::value>(sh, a.q, a.k, a.v, a.dk, a.dv, a.scale,
                                               TablesOf<scalar_t>(a), out, lse);
    });
  });
  return {out, lse};
}

// Writes gq, gk, gv and the depth slots' gradients gdk, gdv (any strides;
// SlotGradients allocates the latter); in_gdk, in_gdv (empty, or S tensors,
// undefined where none): gradients added into slot rows written once.
void AttnBackward(const AttnArgs& a, const torch::Tensor& out, const torch::Tensor& lse,
                  const torch::Tensor& dout, torch::Tensor& gq, torch::Tensor& gk,
                  torch::Tensor& gv, std::vector<torch::Tensor>& gdk,
                  std::vector<torch::Tensor>& gdv, const std::vector<torch::Tensor>& in_gdk = {},
                  const std::vector<torch::Tensor>& in_gdv = {},
                  const torch::Tensor& in_gk = {}, const torch::Tensor& in_gv = {}) {
  const AttnShape sh = a.shape();
  const std::vector<torch::Tensor> none(a.dk.size());
  AT_DISPATCH_FLOATING_TYPES(a.q.scalar_type(), "cpu_fused::CausalAttentionBackward", [&] {
    WithHeadDim(sh.hd, [&](auto hd_c) {
      Backward<scalar_t, decltype(hd_c)::value>(
          sh, a.q, a.k, a.v, a.dk, a.dv, a.scale, TablesOf<scalar_t>(a), out, lse, dout, gq, gk,
          gv, gdk, gdv, in_gdk.empty() ? none : in_gdk, in_gdv.empty() ? none : in_gdv,
          LastDimContiguous(in_gk), LastDimContiguous(in_gv));
    });
  });
}

// A new gradient for a depth slot, in the slot's own layout where it is stored T-major
// ([B, T, heads, hd] transposed, as MoDA's FFN slots, views of one K/V
// projection [B, T, 2 kv_dim]): a contiguous [B, heads, T, hd] gradient
// made autograd's view backward copy it back (0.75 ms of a MoDA step at
// L = 8, d = 128). The kernels address slot rows through their strides.
torch::Tensor EmptySlotGradient(const torch::Tensor& slot) {
  if (slot.stride(2) > slot.stride(1)) {
    return torch::empty({slot.size(0), slot.size(2), slot.size(1), slot.size(3)}, slot.options())
        .transpose(1, 2);
  }
  return torch::empty(slot.sizes(), slot.options());
}

// The gradients of depth slots `slots` given the gradients already arriving
// for them (`in`, S tensors, undefined where none: a passed-through slot's
// later readers'): a slot the kernel sums over several query heads (a
// KV-head slot under GQA) starts as a copy of its incoming gradient (or
// zeros), and its entry in `in` is cleared; a slot written once per row is
// allocated and keeps its entry, which the kernel adds as it writes. An
// incoming gradient of the kernels' own that nobody else sees
// (TakeOwnedGradient, cpu_fused_isa.h) is used as the slot's gradient
// itself: added into in place, where a copy would write a new slot-sized
// tensor per later reader.
std::vector<torch::Tensor> SlotGradients(const std::vector<torch::Tensor>& slots, int64_t H,
                                         int64_t KV, std::vector<torch::Tensor>& in) {
  std::vector<torch::Tensor> out;
  for (size_t j = 0; j < slots.size(); ++j) {
    const torch::Tensor& slot = slots[j];
    const bool own = TakeOwnedGradient(in[j], slot.sizes(), slot.scalar_type(),
                                       /*rows_any_layout=*/true);
    if (SlotSummedOverGroup(slot.size(1) == H, H / KV)) {
      out.push_back(own              ? in[j]
                    : in[j].defined() ? in[j].clone()
                                      : EmptySlotGradient(slot).zero_());
      in[j] = torch::Tensor();
    } else {
      // Taken over: the kernel reads each element of in[j] before writing it.
      out.push_back(own ? in[j] : EmptySlotGradient(slot));
    }
  }
  return out;
}

// The S slots of a stacked [B, H, T, S, hd] depth tensor (undefined: none).
std::vector<torch::Tensor> SlotsOf(const torch::Tensor& stacked) {
  if (!stacked.defined()) return {};
  return stacked.unbind(3);
}

class CausalAttentionFunction : public torch::autograd::Function<CausalAttentionFunction> {
 public:
  // has_depth false: depth_keys and depth_values are empty placeholders
  // (autograd functions take no undefined inputs).
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q_in,
                               const torch::Tensor& k_in, const torch::Tensor& v_in,
                               const torch::Tensor& dk_in, const torch::Tensor& dv_in,
                               double scale, bool has_depth) {
    torch::Tensor q = LastDimContiguous(q_in), k = LastDimContiguous(k_in),
                  v = LastDimContiguous(v_in);
    torch::Tensor dk = has_depth ? dk_in.contiguous() : torch::Tensor();
    torch::Tensor dv = has_depth ? dv_in.contiguous() : torch::Tensor();
    auto [out, lse] = AttnForward({q, k, v, SlotsOf(dk), SlotsOf(dv), {}, {}, scale});
    ctx->save_for_backward({q, k, v, dk, dv, out, lse});
    ctx->saved_data["scale"] = scale;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &dk = saved[3], &dv = saved[4];
    const AttnArgs a{saved[0],    saved[1], saved[2], SlotsOf(dk), SlotsOf(dv), {}, {},
                     ctx->saved_data["scale"].toDouble()};
    const AttnShape sh = a.shape();
    torch::Tensor gq = torch::empty({sh.B, sh.H, sh.T, sh.hd}, a.q.options());
    torch::Tensor gk = torch::empty({sh.B, sh.KV, sh.T, sh.hd}, a.q.options());
    torch::Tensor gv = torch::empty({sh.B, sh.KV, sh.T, sh.hd}, a.q.options());
    // Per query head slots: every row written once.
    torch::Tensor gdk = dk.defined() ? torch::empty_like(dk) : torch::Tensor();
    torch::Tensor gdv = dv.defined() ? torch::empty_like(dv) : torch::Tensor();
    std::vector<torch::Tensor> gdk_slots = SlotsOf(gdk), gdv_slots = SlotsOf(gdv);
    AttnBackward(a, saved[5], saved[6], grads[0].contiguous(), gq, gk, gv, gdk_slots, gdv_slots);
    return {gq, gk, gv, gdk, gdv, torch::Tensor(), torch::Tensor()};
  }
};

// q, k and v heads of a packed [B, T, H + 2 KV, hd] tensor, as
// [B, heads, T, hd] views.
std::array<torch::Tensor, 3> QkvHeads(const torch::Tensor& qkv, int64_t H, int64_t KV) {
  return {qkv.narrow(2, 0, H).transpose(1, 2), qkv.narrow(2, H, KV).transpose(1, 2),
          qkv.narrow(2, H + KV, KV).transpose(1, 2)};
}

std::vector<torch::Tensor> LastDimContiguous(at::TensorList ts) {
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& t : ts) out.push_back(LastDimContiguous(t));
  return out;
}

// The attention of a packed projection with the rotary embedding applied to
// q and k on the fly: one gradient tensor for all three (no rotated copies,
// and no concatenation of three gradients in the backward). The depth
// slots are read in place (no [B, H, T, S, hd] stack). With return_kv it
// also returns k (unrotated) and v, [B, KV, T, hd] (MoDA's cache), as views
// of qkv: no copies (two [B, KV, T, hd] passes and tensors per layer; the
// kernels read slot rows through their strides). Their gradients arrive
// here and are added to the packed one, where autograd's backward of views
// taken outside would each zero-fill and add a qkv-sized tensor. With
// pass_slots the S key and S value slots follow, passed through: their
// gradients (from the later layers that read them) are added into the
// slots' gradients as the kernel writes them.
class CausalAttentionQkvFunction : public torch::autograd::Function<CausalAttentionQkvFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& qkv_in,
                               const torch::Tensor& cos_in, const torch::Tensor& sin_in,
                               at::TensorList dk_in, at::TensorList dv_in, int64_t heads,
                               int64_t kv_heads, double scale, bool return_kv,
                               bool pass_slots) {
    torch::Tensor qkv = LastDimContiguous(qkv_in);
    torch::Tensor cos = cos_in.contiguous(), sin = sin_in.contiguous();
    std::vector<torch::Tensor> dk = LastDimContiguous(dk_in), dv = LastDimContiguous(dv_in);
    auto [q, k, v] = QkvHeads(qkv, heads, kv_heads);
    auto [out, lse] = AttnForward({q, k, v, dk, dv, cos, sin, scale});
    std::vector<torch::Tensor> to_save = {qkv, cos, sin, out, lse};
    to_save.insert(to_save.end(), dk.begin(), dk.end());
    to_save.insert(to_save.end(), dv.begin(), dv.end());
    ctx->save_for_backward(to_save);
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["kv_heads"] = kv_heads;
    ctx->saved_data["return_kv"] = return_kv;
    variable_list result = {out};
    if (return_kv) result.insert(result.end(), {k, v});
    if (pass_slots) {
      result.insert(result.end(), dk.begin(), dk.end());
      result.insert(result.end(), dv.begin(), dv.end());
    }
    return result;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& qkv = saved[0];
    const int64_t H = ctx->saved_data["heads"].toInt(), KV = ctx->saved_data["kv_heads"].toInt();
    const size_t S = (saved.size() - 5) / 2;
    auto [q, k, v] = QkvHeads(qkv, H, KV);
    const AttnArgs a{q,
                     k,
                     v,
                     std::vector<torch::Tensor>(saved.begin() + 5, saved.begin() + 5 + S),
                     std::vector<torch::Tensor>(saved.begin() + 5 + S, saved.end()),
                     saved[1],
                     saved[2],
                     ctx->saved_data["scale"].toDouble()};
    torch::Tensor gqkv = torch::empty(qkv.sizes(), qkv.options());
    auto [gq, gk, gv] = QkvHeads(gqkv, H, KV);
    const bool return_kv = ctx->saved_data["return_kv"].toBool();
    const size_t passed = return_kv ? 3 : 1;  // the passed slots' gradients from here
    std::vector<torch::Tensor> in_gdk(S), in_gdv(S);
    if (grads.size() > passed) {
      for (size_t j = 0; j < S; ++j) {
        in_gdk[j] = std::move(grads[passed + j]);
        in_gdv[j] = std::move(grads[passed + S + j]);
      }
    }
    std::vector<torch::Tensor> gdk = SlotGradients(a.dk, H, KV, in_gdk);
    std::vector<torch::Tensor> gdv = SlotGradients(a.dv, H, KV, in_gdv);
    // The returned k and v views' gradients (undefined: unused) are added
    // as the kernel writes gk and gv: an add_ afterwards was one more pass
    // over both, strided views of the packed gradient (about 1.3% of a
    // MoDA training step at L = 8, d = 128).
    AttnBackward(a, saved[3], saved[4], grads[0].contiguous(), gq, gk, gv, gdk, gdv, in_gdk,
                 in_gdv, return_kv ? grads[1] : torch::Tensor(),
                 return_kv ? grads[2] : torch::Tensor());
    for (const torch::Tensor& g : gdk) MarkOwnedGradient(g);
    for (const torch::Tensor& g : gdv) MarkOwnedGradient(g);
    variable_list out = {gqkv, torch::Tensor(), torch::Tensor()};
    out.insert(out.end(), gdk.begin(), gdk.end());
    out.insert(out.end(), gdv.begin(), gdv.end());
    out.insert(out.end(),
               {torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()});
    return out;
  }
};

}  // namespace

torch::Tensor CausalAttention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const torch::Tensor& depth_keys,
                              const torch::Tensor& depth_values, double scale) {
  CheckCausalAttentionShapes("CausalAttention", q, k, v, depth_keys, depth_values);
  if (depth_keys.defined()) {
    return CausalAttentionFunction::apply(q, k, v, depth_keys, depth_values, scale, true);
  }
  torch::Tensor none = torch::empty({0}, q.options());
  return CausalAttentionFunction::apply(q, k, v, none, none, scale, false);
}

std::vector<torch::Tensor> CausalAttentionQkv(const torch::Tensor& qkv, int64_t heads,
                                              int64_t kv_heads, const torch::Tensor& cos,
                                              const torch::Tensor& sin,
                                              const std::vector<torch::Tensor>& depth_keys,
                                              const std::vector<torch::Tensor>& depth_values,
                                              double scale, bool return_kv, bool pass_slots) {
  CheckCausalAttentionQkvShapes("CausalAttentionQkv", qkv, heads, kv_heads, cos, sin, depth_keys,
                                depth_values);
  for (size_t j = 0; j < depth_keys.size(); ++j) {
    TORCH_CHECK(depth_keys[j].scalar_type() == qkv.scalar_type() &&
                    depth_values[j].scalar_type() == qkv.scalar_type(),
                "CausalAttentionQkv: depth slot ", j, " has dtypes ",
                depth_keys[j].scalar_type(), " / ", depth_values[j].scalar_type(), ", qkv ",
                qkv.scalar_type());
  }
  // As TensorLists: autograd then tracks each slot (a std::vector argument
  // would be passed through as a non-tensor).
  return CausalAttentionQkvFunction::apply(qkv, cos, sin, at::TensorList(depth_keys),
                                           at::TensorList(depth_values), heads, kv_heads, scale,
                                           return_kv, pass_slots);
}

}  // namespace DEPTHBENCH_CPU_FUSED_ISA
}  // namespace cpu_fused
}  // namespace depthbench
