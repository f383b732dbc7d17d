//! The directory the ranks' flight recorders write to (RINGCCL_FLIGHT_DIR) while ringrun
//! watches for hangs: the user's, or a fresh one under the system's temporary directory.

use std::fs::{self, DirBuilder};
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

/// The flight directory of this ringrun.
#[derive(Debug)]
pub(crate) struct FlightDir {
    /// Where it is.
    pub(crate) path: PathBuf,
    /// Whether ringrun made it (and may remove it when nothing in it is needed).
    made_here: bool,
}

impl FlightDir {
    /// The user's RINGCCL_FLIGHT_DIR (created if missing), or a fresh private directory.
    pub(crate) fn prepare() -> Result<FlightDir, String> {
        if let Some(dir) = std::env::var_os("RINGCCL_FLIGHT_DIR").filter(|d| !d.is_empty()) {
            let path = PathBuf::from(dir);
            fs::create_dir_all(&path).map_err(|e| {
                format!(
                    "RINGCCL_FLIGHT_DIR={}: cannot create it ({e}); set it to a writable \
                     directory or unset it",
                    path.display()
                )
            })?;
            return Ok(FlightDir {
                path,
                made_here: false,
            });
        }
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path =
            std::env::temp_dir().join(format!("ringrun-flight-{}-{stamp:x}", std::process::id()));
        DirBuilder::new().mode(0o700).create(&path).map_err(|e| {
            format!(
                "cannot create a flight directory at {} ({e}); set RINGCCL_FLIGHT_DIR to a \
                 writable directory",
                path.display()
            )
        })?;
        Ok(FlightDir {
            path,
            made_here: true,
        })
    }

    /// Removes the directory if ringrun made it and `keep` is false (the job went well)
    /// or nothing was written in it; otherwise says where the files are.
    pub(crate) fn finish(self, keep: bool) {
        let empty = fs::read_dir(&self.path).is_ok_and(|mut entries| entries.next().is_none());
        let keep = keep && !empty;
        if self.made_here && !keep {
            if let Err(e) = fs::remove_dir_all(&self.path) {
                crate::say!("could not remove {} ({e})", self.path.display());
            }
        } else if keep {
            crate::say!(
                "flight records kept in {} (read them with `ringrun diagnose {}`)",
                self.path.display(),
                self.path.display()
            );
        }
    }
}
