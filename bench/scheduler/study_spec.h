// The study-sized sweep spec the scheduler benches submit: the ten designs
// x an LR grid x explicit shapes (L = 1..shapes, d_model 64) x seeds, 100
// steps each. At 10 LRs, 10 shapes and 100 seeds that is the 100,000-job
// study of issue 14 (scale_bench) and issue 16 (web_bench).
#ifndef DEPTHBENCH_BENCH_SCHEDULER_STUDY_SPEC_H_
#define DEPTHBENCH_BENCH_SCHEDULER_STUDY_SPEC_H_

#include <string>

#include "depthbench/v1/spec.pb.h"

namespace depthbench::bench {

// `lrs` LRs per design, 1e-4 * 2^i; with 0 the spec names no grid (the
// scheduler's default grids apply).
inline ::depthbench::v1::SweepSpec StudySpec(const std::string& name, int lrs, int shapes,
                                             int seeds) {
  ::depthbench::v1::SweepSpec spec;
  spec.set_name(name);
  for (const char* a : {"pre_ln", "sandwich_ln", "lns", "deepnorm", "keel", "hc", "mhc",
                        "attnres_full", "attnres_block", "moda"}) {
    spec.add_architectures(a);
    if (lrs == 0) continue;
    auto& grid = (*spec.mutable_lr_grids())[a];
    for (int i = 0; i < lrs; ++i) grid.add_lrs(1e-4 * (1 << i));
  }
  for (int l = 1; l <= shapes; ++l) {
    auto* s = spec.mutable_shapes()->add_explicit_shapes();
    s->set_layers(l);
    s->set_d_model(64);
  }
  for (int s = 0; s < seeds; ++s) spec.add_seeds(s);
  spec.mutable_training()->set_steps(100);
  return spec;
}

}  // namespace depthbench::bench

#endif  // DEPTHBENCH_BENCH_SCHEDULER_STUDY_SPEC_H_
