// What every AMX kernel (gemm_amx_avx512.cpp, conv_amx_avx512.cpp) sets up its tiles with: the
// one tile configuration they use and the compiler fence around tile loads and stores. Plain
// inline asm, so it needs no target attributes of its own.
#pragma once

#include <cstdint>

namespace pto::cpu::amx {

constexpr int kTileRows = 16;  // rows of a tile (and fp32 columns: 64 bytes a row)

// The tile registers: C blocks 0-3 (row tile r, column tile c at 2r + c), A row tiles 4-5, B
// column tiles 6-7, all 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// LDTILECFG written out with the whole 64-byte config as its operand: GCC's _tile_loadconfig
// declares only a pointer's 8 bytes read, so GCC 12 dropped the column-width stores as dead and
// the instruction faulted on the half-written config (a #GP: SIGSEGV) once inlining changed.
// `k_pairs` (1 to 16): the pairs of K a product step takes, the A tiles' 4-byte columns and the
// B tiles' rows (fewer than 16 where K is short: a product costs the same, the loads less).
inline void configure_tiles(int k_pairs = kTileRows) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = static_cast<uint16_t>(t == 4 || t == 5 ? 4 * k_pairs : 64);
    cfg.rows[t] = static_cast<uint8_t>(t >= 6 ? k_pairs : kTileRows);
  }
  __asm__ volatile("ldtilecfg %0" : : "m"(cfg));
}

// How far ahead of the A tiles it multiplies a kernel streaming weights fetches them into L2:
// 8 KiB, four of the 2 KiB chunks (32 rows x 32 bf16) one step's two A tiles load. A panel met
// for the first time comes from L3 or memory, and tile loads alone wait out each line's latency:
// bf16 512 -> 512 @7 3x3, 16 of them chained (75 MB of weights, from L3), one thread, 6.4-6.7 ->
// 5.1 ms; 4 to 32 KiB ahead measured alike.
constexpr int64_t kPrefetchAheadBytes = 8192;

// Brings the 2 KiB chunk of A at kPrefetchAheadBytes past `a` into L2 (prefetches do not fault,
// so past the end of the weights is harmless).
inline void prefetch_a_chunk(const void* a) {
  const char* p = static_cast<const char*>(a) + kPrefetchAheadBytes;
  for (int line = 0; line < 32; ++line) __builtin_prefetch(p + line * 64, 0, 2);
}

// The tile instructions are asm statements that do not tell the compiler they touch memory: this
// orders the plain stores that fill a buffer before a tile load of it, and a tile store before
// the plain loads that read it.
inline void memory_fence() {
  __asm__ volatile("" ::: "memory");
}

}  // namespace pto::cpu::amx
