// util/crc32c.h — CRC-32C (Castagnoli, the iSCSI / ext4 / Google Cloud Storage checksum), for
// checksums of large files written and re-read at drive speed: the repacked container records one
// per shard when it writes it (io/safetensors_writer.h) and checks it before keeping the shard on
// a rerun (tools/repack_lib.cpp). Not a cryptographic hash: it detects damage, not forgery.
//
// crc32c() uses the SSE4.2 instruction where the CPU has it (checked at run time) and
// crc32c_scalar(), a table-driven twin, elsewhere; both give the same value for every input.
// `crc` continues a running checksum: crc32c(b, nb, crc32c(a, na)) == crc32c(a + b, na + nb);
// 0 starts one. crc32c("123456789", 9) == 0xE3069283 (the standard check value).
#pragma once

#include <cstddef>
#include <cstdint>

namespace k3 {

uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);
uint32_t crc32c_scalar(const void* data, size_t size, uint32_t crc = 0);

}  // namespace k3
