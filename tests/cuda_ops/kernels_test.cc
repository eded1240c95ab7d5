// The raw kernels (kernels.h launchers) through the CUDA runtime alone, fp32,
// against the CPU references and their hand-written backwards. Needs no
// CUDA-enabled LibTorch (torch is only the host-side tensor library here);
// skips, saying so, when the CUDA runtime finds no device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "cuda_ops/kernels.h"
#include "cuda_ops/reference.h"
#include "tests/cuda_ops/gradcheck.h"

namespace depthbench {
namespace {

namespace ref = reference;

#define REQUIRE_CUDA_DEVICE()                                                         \
  do {                                                                                \
    int count = 0;                                                                    \
    const cudaError_t err = cudaGetDeviceCount(&count);                               \
    if (err != cudaSuccess)                                                           \
      GTEST_SKIP() << "no CUDA device: cudaGetDeviceCount: " << cudaGetErrorString(err); \
    if (count == 0) GTEST_SKIP() << "no CUDA device: cudaGetDeviceCount returned 0";  \
  } while (0)

// A device copy of a contiguous fp32 CPU tensor (or an uninitialised one).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const torch::Tensor& host) : shape_(host.sizes().vec()) {
    torch::Tensor c = host.to(torch::kFloat32).contiguous();
    bytes_ = c.numel() * sizeof(float);
    EXPECT_EQ(cudaMalloc(&ptr_, bytes_ > 0 ? bytes_ : 1), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr_, c.data_ptr<float>(), bytes_, cudaMemcpyHostToDevice), cudaSuccess);
  }
  explicit DeviceBuffer(std::vector<int64_t> shape)
      : DeviceBuffer(torch::zeros(shape, torch::kFloat32)) {}
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(ptr_); }
  float* get() const { return static_cast<float*>(ptr_); }
  torch::Tensor ToHost() const {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    torch::Tensor out = torch::empty(shape_, torch::kFloat32);
    EXPECT_EQ(cudaMemcpy(out.data_ptr<float>(), ptr_, bytes_, cudaMemcpyDeviceToHost),
              cudaSuccess);
    return out;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  std::vector<int64_t> shape_;
};

void ExpectClose(const torch::Tensor& got, const torch::Tensor& want, const std::string& what,
                 double rtol = 1e-4, double atol = 1e-5) {
  EXPECT_TRUE(testing::AllClose(got, want, rtol, atol))
      << what << ": max abs diff " << testing::MaxAbsDiff(got, want);
}

TEST(CudaKernels, RmsNormForwardBackward) {
  REQUIRE_CUDA_DEVICE();
  torch::manual_seed(0);
  const int64_t rows = 300, d = 1216;
  torch::Tensor x = torch::randn({rows, d}), w = torch::rand({d}) + 0.5, dy = torch::randn({rows, d});
  DeviceBuffer dx_(x), dw_(w), ddy(dy), y({rows, d}), inv({rows}), dx({rows, d}), dwt({d}),
      ws({DbRmsNormWorkspaceFloats(rows, d)});
  ASSERT_EQ(DbRmsNormForward(dx_.get(), dw_.get(), y.get(), inv.get(), rows, d, 1e-6f,
                             kDbFloat32, nullptr), 0);
  ExpectClose(y.ToHost(), ref::RmsNorm(x, w, 1e-6), "y");
  ASSERT_EQ(DbRmsNormBackward(ddy.get(), dx_.get(), dw_.get(), inv.get(), dx.get(), dwt.get(),
                              ws.get(), rows, d, kDbFloat32, nullptr), 0);
  ref::RmsNormGrads g = ref::RmsNormBackward(dy.to(torch::kFloat64), x.to(torch::kFloat64),
                                             w.to(torch::kFloat64), 1e-6);
  ExpectClose(dx.ToHost(), g.dx, "dx");
  ExpectClose(dwt.ToHost(), g.dweight, "dweight", 1e-4, 1e-3);
}

TEST(CudaKernels, SwiGluForwardBackward) {
  REQUIRE_CUDA_DEVICE();
  torch::manual_seed(1);
  const int64_t n = 100003;
  torch::Tensor g = torch::randn({n}) * 3, u = torch::randn({n}), dh = torch::randn({n});
  DeviceBuffer dg_in(g), du_in(u), ddh(dh), h({n}), dg({n}), du({n});
  ASSERT_EQ(DbSwiGluForward(dg_in.get(), du_in.get(), h.get(), n, kDbFloat32, nullptr), 0);
  ExpectClose(h.ToHost(), ref::SwiGluGate(g, u), "h");
  ASSERT_EQ(DbSwiGluBackward(ddh.get(), dg_in.get(), du_in.get(), dg.get(), du.get(), n,
                             kDbFloat32, nullptr), 0);
  ref::SwiGluGrads r = ref::SwiGluGateBackward(dh, g, u);
  ExpectClose(dg.ToHost(), r.dg, "dg");
  ExpectClose(du.ToHost(), r.du, "du");
}

TEST(CudaKernels, AttnResMixForwardBackward) {
  REQUIRE_CUDA_DEVICE();
  torch::manual_seed(2);
  const int64_t rows = 257, d = 1024;
  const int S = 7;
  std::vector<torch::Tensor> src;
  std::vector<std::unique_ptr<DeviceBuffer>> dsrc, grads;
  DbSourceList list{};
  DbGradList glist{};
  for (int i = 0; i < S; ++i) {
    src.push_back(torch::randn({rows, d}) * (1 + 0.3 * i));
    dsrc.push_back(std::make_unique<DeviceBuffer>(src.back()));
    grads.push_back(std::make_unique<DeviceBuffer>(std::vector<int64_t>{rows, d}));
    list.ptr[i] = dsrc.back()->get();
    glist.ptr[i] = grads.back()->get();
  }
  torch::Tensor q = torch::randn({d}) * 0.1, kg = torch::rand({d}) + 0.5,
                og = torch::rand({d}) + 0.5, dy = torch::randn({rows, d});
  DeviceBuffer dq_in(q), dkg_in(kg), dog_in(og), ddy(dy), y({rows, d}), probs({rows, S}),
      inv({rows}), dq({d}), dkg({d}), dog({d}), ws({DbAttnResMixWorkspaceFloats(rows, d)});
  ASSERT_EQ(DbAttnResMixForward(list, S, dq_in.get(), dkg_in.get(), dog_in.get(), y.get(),
                                probs.get(), inv.get(), rows, d, 1e-6f, kDbFloat32, nullptr), 0);
  ExpectClose(y.ToHost(), ref::AttnResMix(src, q, kg, og, 1e-6), "y");
  ExpectClose(probs.ToHost(), ref::AttnResMixWeights(src, q, kg, 1e-6), "probs");
  ASSERT_EQ(DbAttnResMixBackward(ddy.get(), list, S, dq_in.get(), dkg_in.get(), dog_in.get(),
                                 probs.get(), inv.get(), glist, dq.get(), dkg.get(), dog.get(),
                                 ws.get(), rows, d, 1e-6f, kDbFloat32, nullptr), 0);
  std::vector<torch::Tensor> src64;
  for (const auto& s : src) src64.push_back(s.to(torch::kFloat64));
  ref::AttnResGrads r = ref::AttnResMixBackward(dy.to(torch::kFloat64), src64,
                                                q.to(torch::kFloat64), kg.to(torch::kFloat64),
                                                og.to(torch::kFloat64), 1e-6);
  for (int i = 0; i < S; ++i) ExpectClose(grads[i]->ToHost(), r.dsources[i], "dsource");
  ExpectClose(dq.ToHost(), r.dquery, "dquery", 1e-3, 1e-3);
  ExpectClose(dkg.ToHost(), r.dkey_gain, "dkey_gain", 1e-3, 1e-3);
  ExpectClose(dog.ToHost(), r.dout_gain, "dout_gain", 1e-3, 1e-3);
}

TEST(CudaKernels, SinkhornForwardBackward) {
  REQUIRE_CUDA_DEVICE();
  for (int n : {2, 4, 8}) {
    torch::manual_seed(3 + n);
    const int64_t batch = 1000;
    torch::Tensor z = torch::randn({batch, n, n}), dout = torch::randn({batch, n, n});
    DeviceBuffer dz_in(z), ddout(dout), out({batch, n, n}), dz({batch, n, n});
    ASSERT_EQ(DbSinkhornForward(dz_in.get(), out.get(), batch, n, 20, 1e-6f, nullptr), 0);
    ExpectClose(out.ToHost(), ref::Sinkhorn(z.to(torch::kFloat64)), "out n=" + std::to_string(n));
    ASSERT_EQ(DbSinkhornBackward(ddout.get(), dz_in.get(), dz.get(), batch, n, 20, 1e-6f,
                                 nullptr), 0);
    ExpectClose(dz.ToHost(),
                ref::SinkhornBackward(dout.to(torch::kFloat64), z.to(torch::kFloat64)),
                "dlogits n=" + std::to_string(n), 1e-3, 1e-4);
  }
}

TEST(CudaKernels, HcReadWriteForwardBackward) {
  REQUIRE_CUDA_DEVICE();
  const int n = 4;
  const int64_t rows = 129, d = 1024;
  torch::manual_seed(4);
  torch::Tensor h = torch::randn({rows, n, d}), read = torch::randn({rows, n}),
                a = torch::randn({rows, n, n}), b = torch::randn({rows, n}),
                y = torch::randn({rows, d}), dx = torch::randn({rows, d}),
                dout = torch::randn({rows, n, d});
  DeviceBuffer dh_in(h), dread_in(read), da_in(a), db_in(b), dy_in(y), ddx(dx), ddout(dout),
      x({rows, d}), out({rows, n, d}), dh({rows, n, d}), dread({rows, n}), da({rows, n, n}),
      dbw({rows, n}), dyo({rows, d});
  ASSERT_EQ(DbHcReadForward(dh_in.get(), dread_in.get(), x.get(), rows, n, d, kDbFloat32,
                            nullptr), 0);
  ExpectClose(x.ToHost(), ref::HcRead(h, read), "read x");
  ASSERT_EQ(DbHcReadBackward(ddx.get(), dh_in.get(), dread_in.get(), dh.get(), dread.get(),
                             rows, n, d, kDbFloat32, nullptr), 0);
  ref::HcReadGrads rg = ref::HcReadBackward(dx.to(torch::kFloat64), h.to(torch::kFloat64),
                                            read.to(torch::kFloat64));
  ExpectClose(dh.ToHost(), rg.dh, "read dh");
  ExpectClose(dread.ToHost(), rg.dread, "read dread", 1e-4, 1e-3);
  ASSERT_EQ(DbHcWriteForward(dh_in.get(), da_in.get(), db_in.get(), dy_in.get(), out.get(), rows,
                             n, d, kDbFloat32, nullptr), 0);
  ExpectClose(out.ToHost(), ref::HcWrite(h, a, b, y), "write out");
  ASSERT_EQ(DbHcWriteBackward(ddout.get(), dh_in.get(), da_in.get(), db_in.get(), dy_in.get(),
                              dh.get(), da.get(), dbw.get(), dyo.get(), rows, n, d, kDbFloat32,
                              nullptr), 0);
  ref::HcWriteGrads wg = ref::HcWriteBackward(dout.to(torch::kFloat64), h.to(torch::kFloat64),
                                              a.to(torch::kFloat64), b.to(torch::kFloat64),
                                              y.to(torch::kFloat64));
  ExpectClose(dh.ToHost(), wg.dh, "write dh");
  ExpectClose(da.ToHost(), wg.da, "write da", 1e-4, 1e-3);
  ExpectClose(dbw.ToHost(), wg.db, "write db", 1e-4, 1e-3);
  ExpectClose(dyo.ToHost(), wg.dy, "write dy");
}

}  // namespace
}  // namespace depthbench
