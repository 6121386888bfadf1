#include "optim/fused_adam.hpp"

#include <cmath>

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include "optim/optim_registry.hpp"

namespace kiln {

namespace {

struct Coefficients {
  float beta1, beta2, one_minus_beta1, one_minus_beta2;
  bool weight_decay_on;
  float weight_decay;  // Adam: added to the gradient (L2); AdamW: decoupled
  float decay;         // AdamW: 1 - lr * weight_decay
  float step_size;     // lr / (1 - beta1^t)
  float bias_correction2_sqrt;
  float eps;
};

// One pass: what LibTorch's Adam::step computes with a tensor op each.
// A loop the compiler vectorises (this file is built with -fno-math-errno,
// so sqrt is one instruction): no aliasing, no branch inside. T is float,
// or c10::BFloat16 (bf16-true without master weights): each element read
// as float32, computed in float32 and rounded once as it is stored, as
// PyTorch's fused Adam does for bfloat16. Every element is computed alike
// wherever it lies in the tensor, so a rank's shard steps to the replicated
// step's bits (LibTorch's bfloat16 ops round a tensor's tail apart from
// its vectorised body: their bits depend on where a shard starts).
template <bool Decoupled, bool WeightDecay, class T>
void fused_range(T* __restrict p, const T* __restrict g, T* __restrict m, T* __restrict v, int64_t begin,
                 int64_t end, const Coefficients c) {
  for (int64_t i = begin; i < end; ++i) {
    float grad = static_cast<float>(g[i]);
    float weight = static_cast<float>(p[i]);
    if (WeightDecay) {
      if (Decoupled)
        weight *= c.decay;
      else
        grad += c.weight_decay * weight;
    }
    const float avg = static_cast<float>(m[i]) * c.beta1 + c.one_minus_beta1 * grad;
    const float avg_sq = static_cast<float>(v[i]) * c.beta2 + c.one_minus_beta2 * grad * grad;
    m[i] = static_cast<T>(avg);
    v[i] = static_cast<T>(avg_sq);
    const float denom = std::sqrt(avg_sq) / c.bias_correction2_sqrt + c.eps;
    p[i] = static_cast<T>(weight - c.step_size * (avg / denom));
  }
}

template <bool Decoupled, class T>
void fused_pass(T* p, const T* g, T* m, T* v, int64_t n, const Coefficients& c) {
  at::parallel_for(0, n, 32768, [&](int64_t begin, int64_t end) {
    if (c.weight_decay_on)
      fused_range<Decoupled, true>(p, g, m, v, begin, end, c);
    else
      fused_range<Decoupled, false>(p, g, m, v, begin, end, c);
  });
}

bool fusable(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m, const at::Tensor& v) {
  const at::ScalarType type = p.scalar_type();
  return p.device().is_cpu() && (type == at::kFloat || type == at::kBFloat16) && g.scalar_type() == type &&
         m.scalar_type() == type && v.scalar_type() == type && p.is_contiguous() && g.is_contiguous() &&
         m.is_contiguous() && v.is_contiguous() && !g.is_sparse();
}

template <class Options, class State, bool Decoupled>
void fused_step(torch::optim::Optimizer& optimizer) {
  at::NoGradGuard no_grad;
  auto& states = optimizer.state();
  for (auto& group : optimizer.param_groups()) {
    const auto& o = static_cast<const Options&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const at::Tensor& grad = p.grad();
      const auto key = optimizer_state_key(p);
      auto it = states.find(key);
      if (it == states.end()) {
        auto fresh = std::make_unique<State>();
        fresh->step(0);
        fresh->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
        fresh->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
        it = states.emplace(key, std::move(fresh)).first;
      }
      auto& s = static_cast<State&>(*it->second);
      s.step(s.step() + 1);
      const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
      const double bias_correction1 = 1 - std::pow(beta1, static_cast<double>(s.step()));
      const double bias_correction2 = 1 - std::pow(beta2, static_cast<double>(s.step()));
      if (fusable(p, grad, s.exp_avg(), s.exp_avg_sq())) {
        const Coefficients c{static_cast<float>(beta1),
                             static_cast<float>(beta2),
                             static_cast<float>(1 - beta1),
                             static_cast<float>(1 - beta2),
                             o.weight_decay() != 0,
                             static_cast<float>(o.weight_decay()),
                             static_cast<float>(1 - o.lr() * o.weight_decay()),
                             static_cast<float>(o.lr() / bias_correction1),
                             static_cast<float>(std::sqrt(bias_correction2)),
                             static_cast<float>(o.eps())};
        if (p.scalar_type() == at::kFloat)
          fused_pass<Decoupled>(p.data_ptr<float>(), grad.data_ptr<float>(), s.exp_avg().template data_ptr<float>(),
                                s.exp_avg_sq().template data_ptr<float>(), p.numel(), c);
        else
          fused_pass<Decoupled>(p.data_ptr<c10::BFloat16>(), grad.data_ptr<c10::BFloat16>(),
                                s.exp_avg().template data_ptr<c10::BFloat16>(),
                                s.exp_avg_sq().template data_ptr<c10::BFloat16>(), p.numel(), c);
        continue;
      }
      // LibTorch's own arithmetic for what the pass does not take.
      at::Tensor g = grad;
      if (Decoupled && o.weight_decay() != 0)
        p.mul_(1 - o.lr() * o.weight_decay());
      else if (!Decoupled && o.weight_decay() != 0)
        g = g.add(p, o.weight_decay());
      s.exp_avg().mul_(beta1).add_(g, 1 - beta1);
      s.exp_avg_sq().mul_(beta2).addcmul_(g, g, 1 - beta2);
      const at::Tensor denom = (s.exp_avg_sq().sqrt() / std::sqrt(bias_correction2)).add_(o.eps());
      p.addcdiv_(s.exp_avg(), denom, -o.lr() / bias_correction1);
    }
  }
}

// As torch::optim's steps: the closure (if any) with gradients on, then the update.
template <class Options, class State, bool Decoupled>
at::Tensor step_after(torch::optim::Optimizer& optimizer, const torch::optim::Optimizer::LossClosure& closure) {
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode grad(true);
    loss = closure();
  }
  fused_step<Options, State, Decoupled>(optimizer);
  return loss;
}

}  // namespace

at::Tensor FusedAdam::step(LossClosure closure) {
  return step_after<torch::optim::AdamOptions, torch::optim::AdamParamState, false>(*this, closure);
}

at::Tensor FusedAdamW::step(LossClosure closure) {
  return step_after<torch::optim::AdamWOptions, torch::optim::AdamWParamState, true>(*this, closure);
}

}  // namespace kiln
