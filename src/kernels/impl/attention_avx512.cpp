// kernels/impl/attention_avx512.cpp — the avx512 build of kernels/impl/attention_body.h.
#define K3_ATTENTION_SUFFIX avx512
#include "attention_body.h"
