// kernels/situ_poly.h — the numbers of SiTU's own exp and tanh (kernels/vec.h's situ_exp and
// situ_tanh), in one place for the scalar functions and the SIMD kernels that equal them bit for
// bit (kernels/impl/situ_simd.h, for situ_avx2.cpp and situ_avx512.cpp). Constants only: no
// code, so a file compiled with other -m flags may include it.
//
// exp: x clamped to [kExpMin, kExpMax] (2^n and the result stay normal floats), n = round(x *
// kLog2e), r = x - n * kLn2High - n * kLn2Low (kLn2High has 9 significant bits, so n * it is
// exact), then Horner over kExpPoly in r: p = kExpPoly[0]; p = p * r + c for the others; e^r =
// p * r^2 + r + 1 (Cephes' expf polynomial, |r| <= ln(2) / 2).
// tanh: below |x| = kTanhSmall, Horner over kTanhPoly in z = x^2 and x + (p * z) * x (Cephes'
// tanhf polynomial); above, sign(x) (1 - e) / (1 + e) with e = exp(-2|x|).
#pragma once

namespace k3::situ_poly {

inline constexpr float kExpMin = -87.0f;  // e^-87 = 1.6e-38
inline constexpr float kExpMax = 88.0f;   // e^88 = 1.7e38
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2High = 0.693359375f;
inline constexpr float kLn2Low = -2.12194440e-4f;
inline constexpr float kExpPoly[] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                     4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
inline constexpr float kTanhSmall = 0.625f;
// (a - b and a + (-b) round alike, so the signs live in the coefficients.)
inline constexpr float kTanhPoly[] = {-5.70498872745e-3f, 2.06390887954e-2f, -5.37397155531e-2f,
                                      1.33314422036e-1f, -3.33332819422e-1f};

}  // namespace k3::situ_poly
