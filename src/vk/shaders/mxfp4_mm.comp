// Y[r][o] = sum_i W[o][i] X[r][i] on MXFP4 weights: the nibbles as stored (two per byte, the low
// one first), one f32 scale per (output, 32-input group) (docs/vulkan.md §2).
//
// A workgroup of 64 invocations computes one output o for TILE rows (TILE = 1: the GEMV route,
// 16: the tiled GEMM route). Invocation t sums the groups g = t, t + 64, ... in increasing g (each
// group's 32 products in input order, then times its scale), and the 64 partial sums meet in a
// fixed tree in shared memory. Nothing in that order depends on TILE, on the number of rows or on
// the subgroup size, and `precise` forbids fused multiply-adds, so a row gets the same bits on
// either route and in any batch.
#version 450

layout(local_size_x = 64) in;
layout(constant_id = 0) const uint TILE = 1;

layout(std430, set = 0, binding = 0) readonly buffer Packed { uint w[]; };
layout(std430, set = 0, binding = 1) readonly buffer Scales { float s[]; };
layout(std430, set = 1, binding = 0) buffer Act { float a[]; };

layout(push_constant) uniform Params {
  uint O;      // outputs (rows of W)
  uint I;      // inputs (a multiple of 32)
  uint rows;   // rows of X
  uint w_off;  // W's first word in Packed
  uint s_off;  // W's first scale in Scales
  uint x_off;  // X's first float in Act, rows I apart
  uint y_off;  // Y's first float in Act, rows O apart
} p;

const float kE2M1[16] = float[16](0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                                  -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0);

shared float red[64 * 16];

void main() {
  const uint o = gl_WorkGroupID.x;
  const uint r0 = gl_WorkGroupID.y * TILE;
  const uint t = gl_LocalInvocationID.x;
  const uint groups = p.I / 32;
  precise float acc[16];
  for (uint r = 0; r < 16; ++r) acc[r] = 0.0;
  for (uint g = t; g < groups; g += 64) {
    const uint wb = p.w_off + o * (p.I / 8) + g * 4;
    const float sc = s[p.s_off + o * groups + g];
    float wv[32];
    for (uint q = 0; q < 4; ++q) {
      const uint word = w[wb + q];
      for (uint b = 0; b < 8; ++b) wv[q * 8 + b] = kE2M1[(word >> (4 * b)) & 15u];
    }
    for (uint r = 0; r < TILE; ++r) {
      if (r0 + r >= p.rows) break;
      const uint xb = p.x_off + (r0 + r) * p.I + g * 32;
      precise float ga = 0.0;
      for (uint k = 0; k < 32; ++k) ga += a[xb + k] * wv[k];
      acc[r] += ga * sc;
    }
  }
  for (uint r = 0; r < TILE; ++r) red[r * 64 + t] = acc[r];
  barrier();
  for (uint step = 32; step > 0; step >>= 1) {
    if (t < step)
      for (uint r = 0; r < TILE; ++r) {
        precise float v = red[r * 64 + t] + red[r * 64 + t + step];
        red[r * 64 + t] = v;
      }
    barrier();
  }
  if (t == 0)
    for (uint r = 0; r < TILE; ++r)
      if (r0 + r < p.rows) a[p.y_off + (r0 + r) * p.O + o] = red[r * 64];
}
