// kernels/impl/attention_scalar.cpp — the scalar build of kernels/impl/attention_body.h.
#define K3_ATTENTION_SUFFIX scalar
#include "attention_body.h"
