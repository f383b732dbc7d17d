//! The old name of [`fusion`](crate::fusion), kept so that code written against it still
//! builds.

pub use crate::fusion::Piece;

/// The old name of [`plan_fusion`](crate::fusion::plan_fusion).
#[deprecated(since = "0.1.0", note = "renamed to `fusion::plan_fusion`")]
pub fn plan_buckets(lens: &[usize], elem_size: usize, bucket_bytes: usize) -> Vec<Vec<Piece>> {
    crate::fusion::plan_fusion(lens, elem_size, bucket_bytes)
}
