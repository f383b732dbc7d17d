//! Training snapshots on disk, written so that a crash at any moment leaves either the
//! old snapshot or the new one, never a torn file.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use ringccl_collectives::{DType, Element};

use crate::batches::BatchPosition;
use crate::DdpError;

const MAGIC: &[u8; 8] = b"RINGCKPT";
const VERSION: u32 = 1;
/// Written in the machine's byte order; read back only on a machine with the same one.
const BYTE_ORDER: u32 = 0x0102_0304;
const PREFIX: &str = "checkpoint-";
const SUFFIX: &str = ".ckpt";

/// A snapshot of training: the number of optimizer steps taken, where the data sampler
/// stands, and named tensors (parameters, optimizer state), stored bit for bit.
///
/// [`save`](Self::save) writes it atomically: a temporary file, `fsync`, `rename` over
/// the final name, `fsync` of the directory; a crash at any moment leaves the previous
/// snapshot intact. Every file ends with a checksum; [`load_latest`](Self::load_latest)
/// skips a damaged file and falls back to the one before.
///
/// ```
/// use ringccl::ddp::{BatchPosition, Checkpoint};
/// let dir = std::env::temp_dir().join(format!("ckpt-doc-{}", std::process::id()));
/// let mut snapshot = Checkpoint::new(120, BatchPosition { epoch: 3, step: 4 });
/// snapshot.put("fc.weight", &[0.5f32, -1.25]);
/// snapshot.save(&dir, 2)?;
/// let back = Checkpoint::load_latest(&dir)?.expect("one snapshot");
/// assert_eq!(back.step(), 120);
/// assert_eq!(back.get::<f32>("fc.weight")?, vec![0.5, -1.25]);
/// # std::fs::remove_dir_all(&dir).ok();
/// # Ok::<(), ringccl::ddp::DdpError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    step: u64,
    position: BatchPosition,
    tensors: Vec<Tensor>,
}

#[derive(Clone, Debug, PartialEq)]
struct Tensor {
    name: String,
    dtype: DType,
    bytes: Vec<u8>,
}

impl Checkpoint {
    /// An empty snapshot after `step` optimizer steps, the sampler at `position` (the
    /// next batch to train on).
    ///
    /// ```
    /// use ringccl::ddp::{BatchPosition, Checkpoint};
    /// let snapshot = Checkpoint::new(50, BatchPosition { epoch: 1, step: 2 });
    /// assert_eq!(snapshot.names().count(), 0);
    /// ```
    pub fn new(step: u64, position: BatchPosition) -> Checkpoint {
        Checkpoint {
            step,
            position,
            tensors: Vec::new(),
        }
    }

    /// Optimizer steps taken when it was made.
    ///
    /// ```
    /// use ringccl::ddp::{BatchPosition, Checkpoint};
    /// assert_eq!(Checkpoint::new(50, BatchPosition::default()).step(), 50);
    /// ```
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The next batch to train on.
    ///
    /// ```
    /// use ringccl::ddp::{BatchPosition, Checkpoint};
    /// let at = BatchPosition { epoch: 3, step: 1 };
    /// assert_eq!(Checkpoint::new(7, at).position(), at);
    /// ```
    pub fn position(&self) -> BatchPosition {
        self.position
    }

    /// Adds (or replaces) tensor `name`.
    ///
    /// ```
    /// use ringccl::ddp::{BatchPosition, Checkpoint};
    /// let mut snapshot = Checkpoint::new(1, BatchPosition::default());
    /// snapshot.put("w", &[1.0f32, 2.0]);
    /// snapshot.put("w", &[3.0f32]); // replaces
    /// assert_eq!(snapshot.get::<f32>("w")?, vec![3.0]);
    /// # Ok::<(), ringccl::ddp::DdpError>(())
    /// ```
    pub fn put<T: Element>(&mut self, name: &str, values: &[T]) {
        let tensor = Tensor {
            name: name.to_string(),
            dtype: T::DTYPE,
            bytes: bytemuck::cast_slice(values).to_vec(),
        };
        match self.tensors.iter_mut().find(|t| t.name == name) {
            Some(old) => *old = tensor,
            None => self.tensors.push(tensor),
        }
    }

    /// Tensor `name`, which must have been stored as `T`.
    ///
    /// ```
    /// use ringccl::ddp::{BatchPosition, Checkpoint};
    /// let mut snapshot = Checkpoint::new(1, BatchPosition::default());
    /// snapshot.put("step_sizes", &[1i64, 2]);
    /// assert_eq!(snapshot.get::<i64>("step_sizes")?, vec![1, 2]);
    /// assert!(snapshot.get::<f32>("step_sizes").is_err()); // saved as i64
    /// assert!(snapshot.get::<i64>("missing").is_err());
    /// # Ok::<(), ringccl::ddp::DdpError>(())
    /// ```
    pub fn get<T: Element>(&self, name: &str) -> Result<Vec<T>, DdpError> {
        let Some(tensor) = self.tensors.iter().find(|t| t.name == name) else {
            return Err(DdpError::Checkpoint(format!(
                "the snapshot of step {} has no tensor {name:?}; was it written by another \
                 model?",
                self.step
            )));
        };
        if tensor.dtype != T::DTYPE {
            return Err(DdpError::Checkpoint(format!(
                "tensor {name:?} was saved as {}, read as {}",
                tensor.dtype,
                T::DTYPE
            )));
        }
        let mut values = vec![T::zeroed(); tensor.bytes.len() / T::DTYPE.size()];
        bytemuck::cast_slice_mut(&mut values).copy_from_slice(&tensor.bytes);
        Ok(values)
    }

    /// The tensors' names, in the order they were put.
    ///
    /// ```
    /// use ringccl::ddp::{BatchPosition, Checkpoint};
    /// let mut snapshot = Checkpoint::new(1, BatchPosition::default());
    /// snapshot.put("b", &[0u8]);
    /// snapshot.put("a", &[0u8]);
    /// assert_eq!(snapshot.names().collect::<Vec<_>>(), vec!["b", "a"]);
    /// ```
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.iter().map(|t| t.name.as_str())
    }

    /// Writes the snapshot into `dir` (created if missing) as `checkpoint-<step>.ckpt`,
    /// atomically, then removes all but the newest `keep` snapshots (at least 1).
    /// Returns the file's path.
    ///
    /// ```
    /// use ringccl::ddp::{BatchPosition, Checkpoint};
    /// let dir = std::env::temp_dir().join(format!("ringccl-doc-save-{}", std::process::id()));
    /// for step in 1..=3 {
    ///     Checkpoint::new(step, BatchPosition::default()).save(&dir, 2)?;
    /// }
    /// let latest = Checkpoint::load_latest(&dir)?.expect("a snapshot");
    /// assert_eq!(latest.step(), 3);
    /// assert_eq!(std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0), 2); // kept 2
    /// # std::fs::remove_dir_all(&dir).ok();
    /// # Ok::<(), ringccl::ddp::DdpError>(())
    /// ```
    pub fn save(&self, dir: &Path, keep: usize) -> Result<PathBuf, DdpError> {
        let io = |what: &str, path: &Path, e: io::Error| {
            DdpError::Checkpoint(format!("{what} {}: {e}", path.display()))
        };
        fs::create_dir_all(dir).map_err(|e| io("cannot create", dir, e))?;
        let name = format!("{PREFIX}{:012}{SUFFIX}", self.step);
        let path = dir.join(&name);
        let temporary = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        let bytes = self.encode();
        let written = File::create(&temporary)
            .and_then(|mut file| {
                file.write_all(&bytes)?;
                file.sync_all()
            })
            .map_err(|e| io("cannot write", &temporary, e));
        if let Err(e) = written {
            let _ = fs::remove_file(&temporary);
            return Err(e);
        }
        fs::rename(&temporary, &path).map_err(|e| io("cannot rename into", &path, e))?;
        // The rename itself must reach the disk before the snapshot counts as saved.
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io("cannot sync", dir, e))?;
        for (_, old) in snapshots(dir).into_iter().skip(keep.max(1)) {
            if let Err(e) = fs::remove_file(&old) {
                tracing::warn!(path = %old.display(), error = %e, "cannot remove an old checkpoint");
            }
        }
        Ok(path)
    }

    /// The newest intact snapshot in `dir`; `None` if there is none (or no `dir`).
    /// Damaged files (a checksum or format error) are skipped with a warning; leftover
    /// temporary files of interrupted saves are removed.
    ///
    /// ```
    /// use ringccl::ddp::{BatchPosition, Checkpoint};
    /// let dir = std::env::temp_dir().join(format!("ringccl-doc-load-{}", std::process::id()));
    /// assert!(Checkpoint::load_latest(&dir)?.is_none()); // nothing saved yet
    /// let mut snapshot = Checkpoint::new(9, BatchPosition { epoch: 0, step: 9 });
    /// snapshot.put("w", &[0.5f64]);
    /// snapshot.save(&dir, 1)?;
    /// assert_eq!(Checkpoint::load_latest(&dir)?, Some(snapshot));
    /// # std::fs::remove_dir_all(&dir).ok();
    /// # Ok::<(), ringccl::ddp::DdpError>(())
    /// ```
    pub fn load_latest(dir: &Path) -> Result<Option<Checkpoint>, DdpError> {
        let Ok(entries) = fs::read_dir(dir) else {
            return Ok(None);
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') && name.ends_with(".tmp") && name.contains(PREFIX) {
                let _ = fs::remove_file(entry.path());
            }
        }
        for (_, path) in snapshots(dir) {
            let bytes = match fs::read(&path) {
                Ok(bytes) => bytes,
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot read checkpoint");
                    continue;
                }
            };
            match Checkpoint::decode(&bytes) {
                Ok(snapshot) => return Ok(Some(snapshot)),
                Err(why) => {
                    tracing::warn!(path = %path.display(), %why, "skipping a damaged checkpoint");
                }
            }
        }
        Ok(None)
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_ne_bytes());
        out.extend_from_slice(&BYTE_ORDER.to_ne_bytes());
        for value in [self.step, self.position.epoch, self.position.step] {
            out.extend_from_slice(&value.to_ne_bytes());
        }
        out.extend_from_slice(&(self.tensors.len() as u64).to_ne_bytes());
        for tensor in &self.tensors {
            out.extend_from_slice(&(tensor.name.len() as u64).to_ne_bytes());
            out.extend_from_slice(tensor.name.as_bytes());
            out.push(tensor.dtype.code());
            out.extend_from_slice(&(tensor.bytes.len() as u64).to_ne_bytes());
            out.extend_from_slice(&tensor.bytes);
        }
        let sum = fnv1a(&out);
        out.extend_from_slice(&sum.to_ne_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Result<Checkpoint, String> {
        let body_len = bytes
            .len()
            .checked_sub(8)
            .ok_or("shorter than its checksum")?;
        let (body, sum) = bytes.split_at(body_len);
        if fnv1a(body).to_ne_bytes() != sum {
            return Err("checksum mismatch (a torn or damaged file)".into());
        }
        let mut r = Reader(body);
        if r.take(8)? != MAGIC {
            return Err("not a ringccl checkpoint".into());
        }
        if r.u32()? != VERSION {
            return Err("written by another version of the format".into());
        }
        if r.u32()? != BYTE_ORDER {
            return Err("written on a machine with the other byte order".into());
        }
        let step = r.u64()?;
        let position = BatchPosition {
            epoch: r.u64()?,
            step: r.u64()?,
        };
        let count = r.u64()?;
        let mut tensors = Vec::new();
        for _ in 0..count {
            let name_len = r.len()?;
            let name = String::from_utf8(r.take(name_len)?.to_vec())
                .map_err(|_| "a tensor name is not UTF-8")?;
            let code = r.take(1)?[0];
            let dtype = DType::from_code(code).ok_or("unknown element type")?;
            let len = r.len()?;
            if len % dtype.size() != 0 {
                return Err(format!(
                    "tensor {name:?}: {len} bytes is not a whole number of {dtype}"
                ));
            }
            let bytes = r.take(len)?.to_vec();
            tensors.push(Tensor { name, dtype, bytes });
        }
        if !r.0.is_empty() {
            return Err("trailing bytes".into());
        }
        Ok(Checkpoint {
            step,
            position,
            tensors,
        })
    }
}

/// `(step, path)` of every snapshot file in `dir`, newest first.
fn snapshots(dir: &Path) -> Vec<(u64, PathBuf)> {
    let mut found: Vec<(u64, PathBuf)> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name();
            let step = name
                .to_str()?
                .strip_prefix(PREFIX)?
                .strip_suffix(SUFFIX)?
                .parse()
                .ok()?;
            Some((step, entry.path()))
        })
        .collect();
    found.sort_by_key(|(step, _)| std::cmp::Reverse(*step));
    found
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.0.len() {
            return Err("truncated".into());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u32(&mut self) -> Result<u32, String> {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_ne_bytes(b))
    }
    fn u64(&mut self) -> Result<u64, String> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_ne_bytes(b))
    }
    fn len(&mut self) -> Result<usize, String> {
        usize::try_from(self.u64()?).map_err(|_| "a length does not fit in memory".to_string())
    }
}

/// FNV-1a, 64 bits: enough to tell a torn file from a whole one.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ringccl-ckpt-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    fn snapshot(step: u64) -> Checkpoint {
        let mut s = Checkpoint::new(
            step,
            BatchPosition {
                epoch: step / 7,
                step: step % 7,
            },
        );
        s.put("w", &[f32::MIN_POSITIVE, -0.0, f32::NAN, step as f32]);
        s.put("momentum", &[1.0f64 / 3.0; 5]);
        s
    }

    #[test]
    fn round_trips_bit_for_bit_and_keeps_the_newest() {
        let dir = scratch("keep");
        for step in [5, 10, 15] {
            snapshot(step).save(&dir, 2).unwrap();
        }
        let back = Checkpoint::load_latest(&dir).unwrap().unwrap();
        assert_eq!(back.step(), 15);
        assert_eq!(back.position(), BatchPosition { epoch: 2, step: 1 });
        let w: Vec<f32> = back.get("w").unwrap();
        let want: Vec<f32> = snapshot(15).get("w").unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&w), bits(&want));
        assert!(back.get::<f32>("momentum").is_err(), "wrong type");
        assert!(back.get::<f32>("nothing").is_err());
        assert_eq!(snapshots(&dir).len(), 2, "older ones pruned");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_torn_newest_file_falls_back_to_the_previous_one() {
        let dir = scratch("torn");
        snapshot(5).save(&dir, 3).unwrap();
        let newest = snapshot(10).save(&dir, 3).unwrap();
        let bytes = fs::read(&newest).unwrap();
        fs::write(&newest, &bytes[..bytes.len() / 2]).unwrap();
        fs::write(dir.join(".checkpoint-000000000020.ckpt.1.tmp"), b"half").unwrap();
        let back = Checkpoint::load_latest(&dir).unwrap().unwrap();
        assert_eq!(back.step(), 5);
        assert!(!dir.join(".checkpoint-000000000020.ckpt.1.tmp").exists());
        assert!(Checkpoint::load_latest(&dir.join("absent"))
            .unwrap()
            .is_none());
        fs::remove_dir_all(&dir).unwrap();
    }
}
