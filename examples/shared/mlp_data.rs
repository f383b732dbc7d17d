//! The data every MLP example trains on (`ddp_mlp`, `ddp_gpu`, `candle_ddp`), shared
//! through `#[path]` so that their results compare: the same pseudo-random numbers, the
//! same target function.

/// Deterministic pseudo-random numbers in [-1, 1) (a SplitMix64-style hash of `(seed, i)`).
pub(crate) fn uniform(seed: u64, i: u64) -> f32 {
    let mut z = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(i.wrapping_mul(0xBF58_476D_1CE4_E5B9));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
}

/// The function the model learns.
pub(crate) fn target(x: &[f32]) -> f32 {
    x.iter()
        .enumerate()
        .map(|(j, v)| (v * (j as f32 + 1.0)).sin() / (j as f32 + 1.0))
        .sum()
}

/// Sample `i`'s `input` features (the data set is samples `0..dataset` of `seed`).
pub(crate) fn sample(seed: u64, input: usize, i: usize) -> Vec<f32> {
    (0..input)
        .map(|j| uniform(seed ^ 0xDA7A, (i * input + j) as u64))
        .collect()
}
