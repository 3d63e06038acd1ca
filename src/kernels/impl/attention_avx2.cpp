// kernels/impl/attention_avx2.cpp — the avx2 build of kernels/impl/attention_body.h.
#define K3_ATTENTION_SUFFIX avx2
#include "attention_body.h"
