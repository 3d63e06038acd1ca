// kernels/mxfp4.h — the MXFP4 (OCP microscaling FP4, compressed-tensors "mxfp4-pack-quantized")
// format of the routed experts (the kernels are in kernels/isa.h).
//
//   W[o][i] = E2M1[nibble(o, i)] * 2^(scale[o][i / 32] - 127)
//   nibble(o, 2j) = packed[o][j] & 0xF, nibble(o, 2j + 1) = packed[o][j] >> 4
//   E2M1 = {0, .5, 1, 1.5, 2, 3, 4, 6, -0, -.5, -1, -1.5, -2, -3, -4, -6}
//
// Exponent bytes (ue8m0): 1..254 give 2^(s-127) exactly. Documented choices for the edges:
//   s = 0   -> 2^-127 (the OCP value; exact as an f32 subnormal; the anchor's bit trick gives 0),
//   s = 255 -> NaN (OCP). Checkpoints are not expected to hold either; loaders refuse 255.
#pragma once

#include <cstddef>
#include <cstdint>

namespace k3 {

inline constexpr int kMxfp4Group = 32;  // inputs per scale byte
inline constexpr float kE2M1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// 2^(s - 127) for s in 0..254; NaN for 255.
float mxfp4_scale(uint8_t s);

// Dequantised weight (o, i) of an MXFP4 matrix with `cols` inputs.
float mxfp4_weight(const uint8_t* packed, const uint8_t* scales, size_t cols, size_t o, size_t i);

}  // namespace k3
