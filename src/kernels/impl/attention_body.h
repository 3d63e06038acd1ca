// kernels/impl/attention_body.h — the KDA head step and the MLA head attention, written once as
// plain loops shaped for the vectoriser (inner loops over contiguous value/latent lanes, dot
// products split into 16 independent partial sums). Included by attention_<isa>.cpp, each
// compiled with its own -m flags: the scalar build is the twin of the AVX2 and AVX-512 builds.
// Define K3_ATTENTION_SUFFIX before including.
#include <algorithm>
#include <cmath>
#include <cstddef>

#include "kernels_impl.h"

#define K3_CAT2(a, b) a##b
#define K3_CAT(a, b) K3_CAT2(a, b)
#define K3_NAME(base) K3_CAT(base, K3_ATTENTION_SUFFIX)

namespace k3::impl {
namespace {

// sum_i a[i] b[i] in 16 interleaved partial sums (vectorisable without reassociation flags).
inline float dot16(const float* a, const float* b, size_t n) {
  float part[16] = {};
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (size_t j = 0; j < 16; ++j) part[j] += a[i + j] * b[i + j];
  for (; i < n; ++i) part[i % 16] += a[i] * b[i];
  float s = 0.0f;
  for (size_t j = 0; j < 16; ++j) s += part[j];
  return s;
}

}  // namespace

void K3_NAME(kda_head_step_)(float* S, const float* q, const float* k, const float* v,
                             const float* a, float beta, size_t dk, float* u, float* o) {
  // Sweep 1: decay each key row and read it with the key: u = k^T Diag(a) S.
  std::fill(u, u + dk, 0.0f);
  for (size_t i = 0; i < dk; ++i) {
    float* row = S + i * dk;
    const float ai = a[i], ki = k[i];
    for (size_t j = 0; j < dk; ++j) {
      row[j] *= ai;
      u[j] += ki * row[j];
    }
  }
  for (size_t j = 0; j < dk; ++j) u[j] = beta * (v[j] - u[j]);
  // Sweep 2: rank-1 write, and read the updated rows with the query.
  std::fill(o, o + dk, 0.0f);
  for (size_t i = 0; i < dk; ++i) {
    float* row = S + i * dk;
    const float ki = k[i], qi = q[i];
    for (size_t j = 0; j < dk; ++j) {
      row[j] += ki * u[j];
      o[j] += qi * row[j];
    }
  }
}

void K3_NAME(mla_head_attend_)(const float* qabs, const float* q_pe, const float* latent,
                               const float* rope, size_t T, size_t kv_lora, size_t rope_dim,
                               float scale, float* scores, float* lat) {
  float max_score = -INFINITY;
  for (size_t j = 0; j < T; ++j) {
    const float s =
        (dot16(qabs, latent + j * kv_lora, kv_lora) + dot16(q_pe, rope + j * rope_dim, rope_dim)) *
        scale;
    scores[j] = s;
    max_score = std::max(max_score, s);
  }
  float sum = 0.0f;
  for (size_t j = 0; j < T; ++j) {
    scores[j] = std::exp(scores[j] - max_score);
    sum += scores[j];
  }
  const float inv = 1.0f / sum;
  std::fill(lat, lat + kv_lora, 0.0f);
  for (size_t j = 0; j < T; ++j) {
    const float p = scores[j] * inv;
    const float* c = latent + j * kv_lora;
    for (size_t r = 0; r < kv_lora; ++r) lat[r] += p * c[r];
  }
}

}  // namespace k3::impl

#undef K3_NAME
#undef K3_CAT
#undef K3_CAT2
