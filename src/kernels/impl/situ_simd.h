// kernels/impl/situ_simd.h — SiTU-GLU over a row on one vector ISA, written once for
// situ_avx2.cpp and situ_avx512.cpp: kernels/vec.h's situ() (situ_exp, situ_tanh; the numbers in
// kernels/situ_poly.h) with the same f32 operations in the same order on every lane, both tanh
// branches computed and blended, NaN lanes given back as situ() gives them; the tail (n % lanes)
// goes to the scalar twin's file (situ_scalar.cpp), so that no copy of vec.h's inline functions
// is compiled with the including file's -m flags. Bit for bit equal to the scalar twin
// (tests/dense_kernels_test.cpp).
//
// The including file supplies V, a type of its anonymous namespace (so each file's instantiation
// is its own, compiled with that file's flags): F, a vector of kLanes floats; M, a lane mask;
// set, load, store, add, sub, mul, div, min, max, round (to nearest even), pow2 (2^n of a
// rounded F, as exponent bits), lt and unordered (-> M), select(m, a, b) (b where m, else a),
// flip_sign(m, a) (-a where m), sign (the sign bit in every lane), xor_ and andnot (bitwise:
// ~a & b).
#pragma once

#include <cstddef>
#include <iterator>

#include "kernels/situ_poly.h"
#include "kernels_impl.h"

namespace k3::impl {
namespace {

// situ_exp on one vector (NaN lanes: whatever; the callers blend them).
template <class V>
typename V::F situ_exp_lanes(typename V::F x) {
  using namespace situ_poly;
  x = V::max(x, V::set(kExpMin));
  x = V::min(x, V::set(kExpMax));
  const typename V::F n = V::round(V::mul(x, V::set(kLog2e)));
  typename V::F r = V::sub(x, V::mul(n, V::set(kLn2High)));
  r = V::sub(r, V::mul(n, V::set(kLn2Low)));
  const typename V::F z = V::mul(r, r);
  typename V::F p = V::set(kExpPoly[0]);
  for (size_t k = 1; k < std::size(kExpPoly); ++k) p = V::add(V::mul(p, r), V::set(kExpPoly[k]));
  p = V::add(V::add(V::mul(p, z), r), V::set(1.0f));
  return V::mul(p, V::pow2(n));
}

// situ_tanh on one vector, NaN lanes given back.
template <class V>
typename V::F situ_tanh_lanes(typename V::F x) {
  using namespace situ_poly;
  const typename V::F ax = V::andnot(V::sign(), x);
  // |x| < kTanhSmall: the odd polynomial.
  const typename V::F z = V::mul(x, x);
  typename V::F p = V::set(kTanhPoly[0]);
  for (size_t k = 1; k < std::size(kTanhPoly); ++k) p = V::add(V::mul(p, z), V::set(kTanhPoly[k]));
  const typename V::F small = V::add(V::mul(V::mul(p, z), x), x);
  // Above: sign(x) (1 - e) / (1 + e).
  const typename V::F e = situ_exp_lanes<V>(V::mul(V::set(-2.0f), ax));
  const typename V::F one = V::set(1.0f);
  const typename V::F t = V::div(V::sub(one, e), V::add(one, e));
  const typename V::F large = V::flip_sign(V::lt(x, V::set(0.0f)), t);
  const typename V::F out = V::select(V::lt(ax, V::set(kTanhSmall)), large, small);
  return V::select(V::unordered(x), out, x);
}

template <class V>
void situ_glu_lanes(float* gate, const float* up, size_t n, float beta, float beta_linear) {
  const typename V::F vb = V::set(beta), vbl = V::set(beta_linear), one = V::set(1.0f);
  size_t i = 0;
  for (; i + V::kLanes <= n; i += V::kLanes) {
    const typename V::F g = V::load(gate + i), u = V::load(up + i);
    const typename V::F ng = V::xor_(g, V::sign());
    const typename V::F e = V::select(V::unordered(ng), situ_exp_lanes<V>(ng), ng);
    const typename V::F sig = V::div(one, V::add(one, e));
    const typename V::F left = V::mul(V::mul(vb, situ_tanh_lanes<V>(V::div(g, vb))), sig);
    const typename V::F right = V::mul(vbl, situ_tanh_lanes<V>(V::div(u, vbl)));
    V::store(gate + i, V::mul(left, right));
  }
  situ_glu_scalar(gate + i, up + i, n - i, beta, beta_linear);
}

}  // namespace
}  // namespace k3::impl
