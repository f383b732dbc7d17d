//! Finding out, before cudarc's loader can panic, whether libcuda and libnccl load; and
//! when they do not, saying exactly what to do.

use std::env;
use std::path::{Path, PathBuf};

use super::ffi;

/// The file pip's `nvidia-nccl-cu*` wheels ship (the loader only looks for `libnccl.so`
/// and a few versioned names, never `.so.2`).
const PIP_NCCL_FILE: &str = "libnccl.so.2";

/// Checks that libcuda loads. The error is the whole user-facing explanation.
pub(crate) fn check_driver_library() -> Result<(), String> {
    if ffi::cuda_driver_loadable() {
        Ok(())
    } else {
        Err(missing_driver_message())
    }
}

/// Checks that libnccl loads. The error is the whole user-facing explanation.
pub(crate) fn check_nccl_library() -> Result<(), String> {
    if ffi::nccl_loadable() {
        Ok(())
    } else {
        Err(missing_nccl_message(&find_pip_nccl(&search_roots())))
    }
}

fn missing_driver_message() -> String {
    "libcuda (the NVIDIA driver library, libcuda.so.1) cannot be loaded: this machine has no \
     NVIDIA driver, or its directory is not on the loader path. Install the driver, or add the \
     directory holding libcuda.so.1 to LD_LIBRARY_PATH before starting the process. \
     Without a GPU, use the \"gloo\" backend."
        .to_string()
}

/// The message for a missing libnccl; `pip_copies` are `libnccl.so.2` files found on this
/// machine (pip's layout), which only need a `libnccl.so` link to be found.
pub(crate) fn missing_nccl_message(pip_copies: &[PathBuf]) -> String {
    let mut message = String::from(
        "libnccl cannot be loaded (looked for libnccl.so, libnccl.so.13, libnccl.so.12, ... on \
         the loader path). Install NCCL (your distribution's libnccl2, NVIDIA's packages, or \
         `pip install nvidia-nccl-cu12`) and add the directory holding it to LD_LIBRARY_PATH \
         before starting the process (the loader reads it only at start-up).",
    );
    if let Some(found) = pip_copies.first() {
        let dir = found.parent().unwrap_or(Path::new("."));
        message.push_str(&format!(
            " Found pip's NCCL at {}: pip ships only libnccl.so.2, which is not a name the \
             loader tries. Make a libnccl.so link to it in a directory on LD_LIBRARY_PATH, e.g. \
             `ln -s {} {}/libnccl.so && export LD_LIBRARY_PATH={}:$LD_LIBRARY_PATH` \
             (or a private directory if that one is read-only).",
            found.display(),
            found.display(),
            dir.display(),
            dir.display(),
        ));
    }
    message
}

/// Where pip's NCCL is commonly installed, starting from the library path and the
/// active Python environments.
fn search_roots() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = env::var_os("LD_LIBRARY_PATH")
        .map(|paths| env::split_paths(&paths).collect())
        .unwrap_or_default();
    let mut prefixes: Vec<PathBuf> = ["VIRTUAL_ENV", "CONDA_PREFIX"]
        .iter()
        .filter_map(|var| env::var_os(var).map(PathBuf::from))
        .collect();
    if let Some(home) = env::var_os("HOME") {
        prefixes.push(Path::new(&home).join(".local"));
    }
    prefixes.extend(["/usr", "/usr/local", "/opt/conda"].map(PathBuf::from));
    for prefix in prefixes {
        let lib = prefix.join("lib");
        let Ok(entries) = lib.read_dir() else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with("python3") {
                for packages in ["site-packages", "dist-packages"] {
                    roots.push(entry.path().join(packages).join("nvidia/nccl/lib"));
                }
            }
        }
    }
    roots
}

/// The `libnccl.so.2` files directly inside `roots`.
pub(crate) fn find_pip_nccl(roots: &[PathBuf]) -> Vec<PathBuf> {
    roots
        .iter()
        .map(|root| root.join(PIP_NCCL_FILE))
        .filter(|file| file.is_file())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_the_library_and_the_variable() {
        let message = missing_nccl_message(&[]);
        assert!(message.contains("libnccl"), "{message}");
        assert!(message.contains("LD_LIBRARY_PATH"), "{message}");
        assert!(!message.contains("pip ships"), "{message}");
    }

    #[test]
    fn a_pip_copy_gets_the_symlink_recipe() {
        let dir = env::temp_dir().join(format!("ringccl-pip-nccl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(PIP_NCCL_FILE), b"not really a library").unwrap();
        let found = find_pip_nccl(&[dir.join("missing"), dir.clone()]);
        assert_eq!(found, vec![dir.join(PIP_NCCL_FILE)]);
        let message = missing_nccl_message(&found);
        assert!(message.contains("ln -s"), "{message}");
        assert!(
            message.contains(&format!("{}/libnccl.so ", dir.display())),
            "{message}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
