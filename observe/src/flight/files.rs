//! Where the recorder's files go and how they are replaced: `rank-<rank>.json` and
//! `rank-<rank>.beacon` for the group made by `init_process_group`,
//! `rank-<rank>.<group>.json` and `.beacon` for groups formed from it, each written to a
//! hidden temporary file and renamed into place, so a reader never sees half a file.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The group name of the group made by `init_process_group`.
pub const MAIN_GROUP: &str = "main";

/// The group's part of a file name: empty for [`MAIN_GROUP`]; otherwise its letters,
/// digits, `_` and `-`, every run of other characters made one `-` (`"group/0/1/"` gives
/// `"group-0-1"`).
///
/// ```
/// use ringccl_observe::flight::{file_name, group_tag};
///
/// assert_eq!(group_tag("group/0/1/"), "group-0-1");
/// assert_eq!(file_name(3, "group/0/1/", "json"), "rank-3.group-0-1.json");
/// assert_eq!(file_name(3, "main", "beacon"), "rank-3.beacon");
/// ```
pub fn group_tag(group: &str) -> String {
    if group == MAIN_GROUP {
        return String::new();
    }
    let mut tag = String::with_capacity(group.len());
    for c in group.chars() {
        if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
            tag.push(c);
        } else if !tag.is_empty() && !tag.ends_with('-') {
            tag.push('-');
        }
    }
    let trimmed = tag.trim_end_matches('-').len();
    tag.truncate(trimmed);
    if tag.is_empty() {
        tag.push_str("group");
    }
    tag
}

/// `rank-<rank>.<ext>` or `rank-<rank>.<group tag>.<ext>`; see [`group_tag`].
pub fn file_name(rank: usize, group: &str, ext: &str) -> String {
    match group_tag(group).as_str() {
        "" => format!("rank-{rank}.{ext}"),
        tag => format!("rank-{rank}.{tag}.{ext}"),
    }
}

/// A name for a temporary file beside `path`, unique in this process and hidden from
/// readers that look for `rank-*` files.
pub(crate) fn temporary_beside(path: &Path) -> PathBuf {
    static SERIAL: AtomicU64 = AtomicU64::new(0);
    let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.{}.{serial}.tmp", std::process::id()))
}

/// Replaces `path` with `bytes` at once: written to a temporary file beside it, then
/// renamed over it.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let temporary = temporary_beside(path);
    let written = fs::File::create(&temporary).and_then(|mut file| {
        file.write_all(bytes)?;
        file.flush()
    });
    let renamed = written.and_then(|()| fs::rename(&temporary, path));
    if renamed.is_err() {
        let _ = fs::remove_file(&temporary);
    }
    renamed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_names_become_safe_file_names() {
        assert_eq!(group_tag("main"), "");
        assert_eq!(group_tag("group/12/3/"), "group-12-3");
        assert_eq!(group_tag("../../etc"), "etc");
        assert_eq!(group_tag("//"), "group");
        assert_eq!(file_name(0, "a b", "json"), "rank-0.a-b.json");
    }

    #[test]
    fn a_file_is_replaced_whole_and_no_temporary_is_left() {
        let dir = std::env::temp_dir().join(format!("ringccl-files-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("rank-0.json");
        write_atomically(&path, b"first").unwrap();
        write_atomically(&path, b"second").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"second");
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["rank-0.json"]);
        let _ = fs::remove_dir_all(&dir);
        assert!(write_atomically(&dir.join("missing/x.json"), b"x").is_err());
    }
}
