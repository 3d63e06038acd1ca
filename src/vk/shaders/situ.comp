// h = SiTU(g, u) = [b1 tanh(g / b1) sigmoid(g)] [b2 tanh(u / b2)] over n floats of Act, written
// over g (docs/architecture.md §3.6; the CPU's situ() in src/kernels/include/kernels/vec.h).
#version 450

layout(local_size_x = 64) in;

layout(std430, set = 1, binding = 0) buffer Act { float a[]; };

layout(push_constant) uniform Params {
  uint n;
  uint g_off;
  uint u_off;
  float beta;
  float beta_linear;
} p;

// tanh with a stated precision (GLSL's tanh has none): its odd series below 0.25 (the first
// term left out is under 1e-8 of x there), (1 - e) / (1 + e) with e = exp(-2|x|) above, where
// 1 - e >= 0.39 loses nothing to cancellation; saturates at ±1.
float tanh_exp(float x) {
  const float ax = min(abs(x), 20.0);
  if (ax < 0.25) {
    const float x2 = x * x;
    return x * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0 + x2 * (62.0 / 2835.0)))));
  }
  const float e = exp(-2.0 * ax);
  return sign(x) * ((1.0 - e) / (1.0 + e));
}

void main() {
  const uint i = gl_GlobalInvocationID.x;
  if (i >= p.n) return;
  const float g = a[p.g_off + i], u = a[p.u_off + i];
  const float sig = 1.0 / (1.0 + exp(-g));
  a[p.g_off + i] = p.beta * tanh_exp(g / p.beta) * sig * (p.beta_linear * tanh_exp(u / p.beta_linear));
}
