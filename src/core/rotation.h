// The fixed rotation of the rotated KV cache types (tq4, tq3): x -> H D x / sqrt(n) over one attention head
// of n = 2^k elements, D a fixed diagonal of random signs and H the n x n Sylvester-Hadamard matrix
// (a fast Walsh-Hadamard transform, n log2 n additions). The map is orthogonal, so scores q.k are
// unchanged when both sides are rotated, and a sum of rotated values is rotated back by the inverse,
// D H x / sqrt(n). It spreads a head's outlier channels over all of its elements, which is what lets
// 4- and 3-bit blocks with one scale hold keys and values well (QuaRot, TurboQuant).
#pragma once
#include <cstdint>

namespace cera {

// Sign i of D: +1 or -1, the top bit of splitmix64(i), the same for every head, layer and model
// (constexpr, so that device code computes the same signs).
constexpr float rotation_sign(int64_t i) {
    uint64_t z = uint64_t(i) + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (z >> 63) ? -1.0f : 1.0f;
}

// True when a head of n elements can be rotated: n a power of two, 2 to 1024.
bool rotation_fits(int64_t n);

// Rotates x[0 .. n) in place (inverse: the transpose, D H x / sqrt(n)); rotation_fits(n) must hold.
void rotate_head(float* x, int64_t n, bool inverse);

}  // namespace cera
