#include "kernels/isa.h"

#include "impl/kernels_impl.h"
#include "util/error.h"

namespace k3 {
namespace {

// `quant`: the row quantisers' variant. They are bound by memory and the source read, not by
// lane count, so the AVX-512 table uses the AVX2 ones (tested byte for byte on every machine
// with AVX2, which every AVX-512 machine has).
#define K3_TABLE(isa_value, suffix, quant)                                                        \
  KernelTable {                                                                                   \
    isa_value, impl::matmul_f32_##suffix, impl::matmul_int8_##suffix, impl::matmul_int4_##suffix, \
        impl::matmul_mxfp4_exact_##suffix, impl::quantize_q8_32_##suffix,                         \
        impl::matmul_mxfp4_idot_##suffix, impl::matmul_int4_idot_##suffix,                        \
        impl::matmul_int8_idot_##suffix, impl::kda_head_step_##suffix,                            \
        impl::kda_head_chunk_##suffix, impl::mla_head_attend_##suffix,                            \
        impl::quantize_int8_row_##quant, impl::quantize_int4_g64_row_##quant,                     \
        impl::situ_glu_##suffix                                                                   \
  }

const KernelTable kScalar = K3_TABLE(Isa::kScalar, scalar, scalar);
const KernelTable kAvx2 = K3_TABLE(Isa::kAvx2, avx2, avx2);
const KernelTable kAvx512 = K3_TABLE(Isa::kAvx512, avx512, avx2);
const KernelTable kAvx512L1 = [] {
  KernelTable t = K3_TABLE(Isa::kAvx512, avx512, avx2);
  t.matmul_mxfp4_idot = impl::matmul_mxfp4_idot_avx512_l1;
  return t;
}();

#undef K3_TABLE

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "?";
}

bool parse_isa(const std::string& name, Isa* out) {
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (name == isa_name(isa)) {
      *out = isa;
      return true;
    }
  }
  return false;
}

bool isa_supported(Isa isa) {
  // __builtin_cpu_supports reads CPUID and, for AVX/AVX-512, the OS-enabled state (XCR0).
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
             __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }
  return false;
}

Isa best_isa() {
  if (isa_supported(Isa::kAvx512)) return Isa::kAvx512;
  if (isa_supported(Isa::kAvx2)) return Isa::kAvx2;
  return Isa::kScalar;
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512})
    if (isa_supported(isa)) out.push_back(isa);
  return out;
}

size_t kda_chunk_scratch_floats(size_t bt, size_t dk) {
  return impl::kda_chunk_scratch(bt, dk);
}

RowPrefetch row_prefetch_for_this_cpu() {
  static const RowPrefetch chosen =
      __builtin_cpu_is("intel") ? RowPrefetch::kL2Half : RowPrefetch::kL1Whole;
  return chosen;
}

const char* row_prefetch_name(RowPrefetch prefetch) {
  return prefetch == RowPrefetch::kL1Whole ? "L1, whole rows" : "L2, half the rows";
}

const KernelTable& kernel_table(Isa isa) {
  return kernel_table(isa, row_prefetch_for_this_cpu());
}

const KernelTable& kernel_table(Isa isa, RowPrefetch prefetch) {
  if (!isa_supported(isa))
    throw Error(std::string("this CPU cannot run the ") + isa_name(isa) + " kernels");
  switch (isa) {
    case Isa::kScalar:
      return kScalar;
    case Isa::kAvx2:
      return kAvx2;
    case Isa::kAvx512:
      return prefetch == RowPrefetch::kL1Whole ? kAvx512L1 : kAvx512;
  }
  return kScalar;
}

}  // namespace k3
