//! Counter-based random numbers that the GPU kernels and the CPU references compute bit for bit
//! alike (`kernels/include/aot_random.cuh` is the device twin): synthetic weights and sampling
//! draws are pure functions of `(seed, stream, counter)`, so a model generated on the GPU equals
//! the one the CPU reference engine generates, and a seeded sample is reproducible anywhere.

/// SplitMix64's finaliser: a bijective 64-bit mix with full avalanche.
pub const fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// 64 random bits for element `counter` of stream `stream` under `seed`.
pub const fn random_bits(seed: u64, stream: u64, counter: u64) -> u64 {
    let key = mix64(seed ^ mix64(stream.wrapping_add(0x9e37_79b9_7f4a_7c15)));
    mix64(key.wrapping_add(counter.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
}

/// The top 24 bits as an integer in `[0, 2^24)`: exactly representable in fp32.
pub const fn random_u24(seed: u64, stream: u64, counter: u64) -> u32 {
    (random_bits(seed, stream, counter) >> 40) as u32
}

/// Uniform in `[-1, 1)`, a multiple of 2^-23 (exact in fp32).
pub fn uniform_pm1(seed: u64, stream: u64, counter: u64) -> f32 {
    random_u24(seed, stream, counter) as f32 * (1.0 / 8_388_608.0) - 1.0
}

/// The value `fill_uniform_bf16` stores at `index`: `bf16(fma(scale, u, offset))`, `u` from
/// [`uniform_pm1`]. One fused multiply-add and one rounding, as the kernel does.
pub fn uniform_bf16_value(
    seed: u64,
    stream: u64,
    index: u64,
    scale: f32,
    offset: f32,
) -> half::bf16 {
    half::bf16::from_f32(scale.mul_add(uniform_pm1(seed, stream, index), offset))
}

/// Reference for `fill_uniform_bf16`: `n` values of stream `stream`.
pub fn fill_uniform_bf16_reference(
    n: usize,
    seed: u64,
    stream: u64,
    scale: f32,
    offset: f32,
) -> Vec<half::bf16> {
    (0..n as u64)
        .map(|i| uniform_bf16_value(seed, stream, i, scale, offset))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_covers_the_range_and_streams_differ() {
        let xs: Vec<f32> = (0..10_000).map(|i| uniform_pm1(7, 3, i)).collect();
        assert!(xs.iter().all(|&x| (-1.0..1.0).contains(&x)));
        let mean = xs.iter().map(|&x| f64::from(x)).sum::<f64>() / xs.len() as f64;
        assert!(mean.abs() < 0.05, "mean {mean}");
        assert!(xs.iter().any(|&x| x < -0.99) && xs.iter().any(|&x| x > 0.99));
        assert_ne!(uniform_pm1(7, 3, 0), uniform_pm1(7, 4, 0));
        assert_ne!(uniform_pm1(7, 3, 0), uniform_pm1(8, 3, 0));
        // Known value, so the CUDA twin can be checked against this one by the GPU test.
        assert_eq!(mix64(0), 0);
        assert_eq!(mix64(1), 0x5692_161d_100b_05e5);
    }
}
