// Y[r][o] = sum_i W[o][i] X[r][i] for one dense matrix in the RAM format K3_BITS (K3_MLA_BITS)
// made it (docs/quant_formats.md), uploaded as stored (docs/vulkan.md §6):
//   FORMAT 0 (f32):      W[o][i] = the float                       words [O][I]
//   FORMAT 1 (int8 row): W[o][i] = q[o][i] * s[o]                   words [O][I/4], s [O]
//   FORMAT 2 (int4 g64): W[o][i] = (nib - 8) * s[o][i/64]           words [O][I/8], s [O][I/64]
// with f32 activations (the K3_IDOT=0 numerics). The order is mxfp4_mm.comp's: invocation t of
// a 64-wide workgroup sums the 32-input groups t, t + 64, ... in increasing order (each group's
// 32 products in input order, then times its scale; int8's row scale once at the end), and the
// 64 partial sums meet in a fixed tree. Nothing depends on TILE, the rows of the dispatch or the
// subgroup size, and `precise` forbids fused multiply-adds.
#version 450

layout(local_size_x = 64) in;
layout(constant_id = 0) const uint TILE = 1;
layout(constant_id = 1) const uint FORMAT = 0;

layout(std430, set = 0, binding = 0) readonly buffer Weights { uint w[]; };
layout(std430, set = 0, binding = 1) readonly buffer Scales { float s[]; };
layout(std430, set = 1, binding = 0) buffer Act { float a[]; };

layout(push_constant) uniform Params {
  uint O;      // outputs (rows of W)
  uint I;      // inputs (a multiple of 32; of 64 for int4)
  uint rows;   // rows of X
  uint w_off;  // unused (each matrix binds its own ranges)
  uint s_off;  // unused
  uint x_off;  // X's first float in Act, rows I apart
  uint y_off;  // Y's first float in Act, rows O apart
} p;

shared float red[64 * 16];

void main() {
  const uint o = gl_WorkGroupID.x;
  const uint r0 = gl_WorkGroupID.y * TILE;
  const uint t = gl_LocalInvocationID.x;
  const uint groups = p.I / 32;
  precise float acc[16];
  for (uint r = 0; r < 16; ++r) acc[r] = 0.0;
  for (uint g = t; g < groups; g += 64) {
    float wv[32];
    float sc = 1.0;
    if (FORMAT == 0) {
      const uint wb = o * p.I + g * 32;
      for (uint k = 0; k < 32; ++k) wv[k] = uintBitsToFloat(w[wb + k]);
    } else if (FORMAT == 1) {
      const uint wb = o * (p.I / 4) + g * 8;
      for (uint q = 0; q < 8; ++q) {
        const int word = int(w[wb + q]);
        for (uint b = 0; b < 4; ++b) wv[q * 4 + b] = float(bitfieldExtract(word, int(8 * b), 8));
      }
    } else {
      const uint wb = o * (p.I / 8) + g * 4;
      for (uint q = 0; q < 4; ++q) {
        const uint word = w[wb + q];
        for (uint b = 0; b < 8; ++b) wv[q * 8 + b] = float(int((word >> (4 * b)) & 15u) - 8);
      }
      sc = s[o * (p.I / 64) + g / 2];
    }
    for (uint r = 0; r < TILE; ++r) {
      if (r0 + r >= p.rows) break;
      const uint xb = p.x_off + (r0 + r) * p.I + g * 32;
      precise float ga = 0.0;
      for (uint k = 0; k < 32; ++k) ga += a[xb + k] * wv[k];
      if (FORMAT == 2) {
        acc[r] += ga * sc;
      } else {
        acc[r] += ga;
      }
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
      if (r0 + r < p.rows) {
        precise float y = red[r * 64];
        if (FORMAT == 1) y = y * s[o];
        a[p.y_off + (r0 + r) * p.O + o] = y;
      }
}
