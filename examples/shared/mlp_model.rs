//! The MLP that `ddp_mlp` trains on the host and `ddp_gpu` on the GPU, shared through
//! `#[path]` so that both start from the same parameters (`ddp_gpu --reference on`
//! compares them).

use super::mlp_data::uniform;

/// Layer widths: `input`, `hidden` for each of the `layers` hidden layers, then 1.
pub(crate) fn layer_widths(input: usize, hidden: usize, layers: usize) -> Vec<usize> {
    let mut widths = vec![input];
    widths.extend(std::iter::repeat_n(hidden, layers));
    widths.push(1);
    widths
}

/// Layer `l`'s initial weights, `outputs x inputs` row-major, uniform in
/// ±1/sqrt(`inputs`); biases start at zero.
pub(crate) fn initial_weights(seed: u64, l: usize, inputs: usize, outputs: usize) -> Vec<f32> {
    let scale = (1.0 / inputs as f32).sqrt();
    let salt = seed ^ ((l as u64 + 1) << 32);
    (0..inputs * outputs)
        .map(|i| scale * uniform(salt, i as u64))
        .collect()
}
