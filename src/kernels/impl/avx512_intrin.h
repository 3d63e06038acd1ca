// kernels/impl/avx512_intrin.h — <immintrin.h> for the AVX-512 files. GCC 12's
// _mm512_undefined_*() placeholders self-initialise and trip -W(maybe-)uninitialized once inlined
// (GCC PR 105593, fixed in 13): the warning is about the header, not the kernels, so it stays off
// for the rest of every file that includes this one.
#pragma once

#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
