//! One rank's inbox segment: an unnamed file in `/dev/shm`, fully reserved, that its
//! peers reopen through `/proc/<pid>/fd/<fd>` from a [`Ticket`] and check before mapping.
//!
//! - **No name.** The file is made with `O_TMPFILE | O_EXCL`: it never has a name in
//!   `/dev/shm` (nothing to list, guess, pre-create, replace with a symlink, or leave
//!   behind), and `O_EXCL` keeps it from ever being linked into one. The kernel frees it
//!   when the last descriptor and the last mapping go — a crash included.
//! - **Reserved.** All its bytes are allocated at creation (`posix_fallocate`), so a
//!   full `/dev/shm` is an error here, naming the space, and never a SIGBUS later.
//! - **Owner only.** Mode `0600`. Peers open it through `/proc/<pid>/fd/<fd>`, which the
//!   kernel allows only to processes that may inspect the owner (same user, or root),
//!   and then check the file itself before mapping it: a regular file, exactly the
//!   device and inode the owner published, owned by this job's user, no group or other
//!   permissions, no name, the expected size, every byte allocated.

use std::fmt;
use std::fs::{File, Metadata, Permissions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::mapping::Mapping;
use super::space::{reserve, space};

/// Where inboxes live: the tmpfs whose size containers set (`docker run --shm-size`).
pub(super) const SHM_DIR: &str = "/dev/shm";

/// What a rank publishes so that its peers can open its inbox, and what they must find.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Ticket {
    pid: u32,
    fd: u32,
    dev: u64,
    ino: u64,
    len: u64,
}

impl Ticket {
    /// The ticket as published in the store: five decimal numbers.
    pub(super) fn encode(&self) -> String {
        format!(
            "{} {} {} {} {}",
            self.pid, self.fd, self.dev, self.ino, self.len
        )
    }

    /// Reads a published ticket; `None` unless it is exactly five decimal numbers.
    pub(super) fn decode(text: &str) -> Option<Ticket> {
        let mut fields = text.split(' ');
        let mut next = || fields.next()?.parse::<u64>().ok();
        let ticket = Ticket {
            pid: u32::try_from(next()?).ok()?,
            fd: u32::try_from(next()?).ok()?,
            dev: next()?,
            ino: next()?,
            len: next()?,
        };
        (fields.next().is_none() && ticket.encode() == text).then_some(ticket)
    }

    /// The ticket as [`Ticket::LEN`] bytes: pid, descriptor, device, inode, size,
    /// little-endian.
    pub(super) fn to_bytes(self) -> [u8; Ticket::LEN] {
        let mut out = [0u8; Ticket::LEN];
        out[..4].copy_from_slice(&self.pid.to_le_bytes());
        out[4..8].copy_from_slice(&self.fd.to_le_bytes());
        out[8..16].copy_from_slice(&self.dev.to_le_bytes());
        out[16..24].copy_from_slice(&self.ino.to_le_bytes());
        out[24..].copy_from_slice(&self.len.to_le_bytes());
        out
    }

    /// Reads [`Ticket::to_bytes`]'s bytes back.
    pub(super) fn from_bytes(bytes: &[u8; Ticket::LEN]) -> Ticket {
        let word = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(w)
        };
        let half = |at: usize| {
            let mut w = [0u8; 4];
            w.copy_from_slice(&bytes[at..at + 4]);
            u32::from_le_bytes(w)
        };
        Ticket {
            pid: half(0),
            fd: half(4),
            dev: word(8),
            ino: word(16),
            len: word(24),
        }
    }

    /// Bytes of [`Ticket::to_bytes`].
    pub(super) const LEN: usize = 32;

    /// The size of the file.
    pub(super) fn len(&self) -> u64 {
        self.len
    }

    /// The owner's process.
    pub(super) fn pid(&self) -> u32 {
        self.pid
    }

    /// The owner's descriptor, seen from any process allowed to inspect the owner.
    pub(super) fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/fd/{}", self.pid, self.fd))
    }
}

/// This rank's inbox, open and mapped. While it is alive, peers can open it from its
/// ticket; [`OwnInbox::into_mapping`] closes the file so that nobody else can.
pub(super) struct OwnInbox {
    file: File,
    mapping: Mapping,
    ticket: Ticket,
    owner: u32,
}

impl OwnInbox {
    /// Creates an unnamed, owner-only, fully reserved inbox of `len` bytes in
    /// [`SHM_DIR`]. `world_size` only makes the message for a full `/dev/shm` exact.
    pub(super) fn create(len: usize, world_size: usize) -> Result<OwnInbox, String> {
        OwnInbox::create_as("its inbox", len, |dir, e| {
            cannot_reserve(dir, len, world_size, e)
        })
    }

    /// Creates such a file of `len` bytes for `what` (named in errors); `full` says why
    /// reserving it failed.
    pub(super) fn create_as(
        what: &str,
        len: usize,
        full: impl FnOnce(&Path, &io::Error) -> String,
    ) -> Result<OwnInbox, String> {
        let dir = Path::new(SHM_DIR);
        let file = File::options()
            .read(true)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_TMPFILE | libc::O_EXCL)
            .open(dir)
            .map_err(|e| cannot_create(dir, &e))?;
        // The umask can only have removed bits; make the mode exact.
        file.set_permissions(Permissions::from_mode(0o600))
            .map_err(|e| format!("setting mode 0600 on {what} in {}: {e}", dir.display()))?;
        reserve(&file, len as u64).map_err(|e| full(dir, &e))?;
        let meta = file
            .metadata()
            .map_err(|e| format!("reading back {what} in {}: {e}", dir.display()))?;
        let mapping = Mapping::new(&file, len)
            .map_err(|e| format!("mapping {what} in {}: {e}", dir.display()))?;
        let ticket = Ticket {
            pid: std::process::id(),
            fd: u32::try_from(file.as_raw_fd()).map_err(|_| "negative descriptor".to_string())?,
            dev: meta.dev(),
            ino: meta.ino(),
            len: len as u64,
        };
        Ok(OwnInbox {
            file,
            mapping,
            ticket,
            owner: meta.uid(),
        })
    }

    /// The inbox, mapped.
    pub(super) fn mapping(&self) -> &Mapping {
        &self.mapping
    }

    /// The inbox, mapped, to write.
    pub(super) fn mapping_mut(&mut self) -> &mut Mapping {
        &mut self.mapping
    }

    /// What peers need to open this inbox.
    pub(super) fn ticket(&self) -> Ticket {
        self.ticket
    }

    /// The user this rank runs as (the inbox's owner): every peer's inbox must be his.
    pub(super) fn owner(&self) -> u32 {
        self.owner
    }

    /// Closes the file, keeping the mapping: from now on only processes that mapped the
    /// inbox reach it, and the kernel frees it when the last of them unmaps it.
    pub(super) fn into_mapping(self) -> Mapping {
        drop(self.file);
        self.mapping
    }
}

impl fmt::Debug for OwnInbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnInbox")
            .field("ticket", &self.ticket)
            .finish_non_exhaustive()
    }
}

/// Opens and maps the inbox `ticket` describes, once it has checked that it is the
/// unnamed, owner-only, fully reserved file of `len` bytes that a rank of this job,
/// running as `owner`, created. The reason it refuses says what was wrong.
pub(super) fn open_peer(ticket: &Ticket, len: usize, owner: u32) -> Result<Mapping, String> {
    if ticket.len != len as u64 {
        return Err(format!(
            "it has {} bytes, expected {len} (same ringccl version everywhere?)",
            ticket.len
        ));
    }
    let path = ticket.path();
    // Checked before opening, so that nothing but such a file is ever opened (opening a
    // device or a FIFO can have effects of its own), and again on the open file.
    let before = std::fs::metadata(&path).map_err(|e| cannot_open(&path, &e))?;
    check(&before, ticket, owner)?;
    let file = File::options()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK)
        .open(&path)
        .map_err(|e| cannot_open(&path, &e))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("reading {}: {e}", path.display()))?;
    check(&meta, ticket, owner)?;
    Mapping::new(&file, len).map_err(|e| format!("mapping {}: {e}", path.display()))
}

/// Why `meta` is not the inbox `ticket` promised, if it is not.
fn check(meta: &Metadata, ticket: &Ticket, owner: u32) -> Result<(), String> {
    if !meta.file_type().is_file() {
        return Err("it is not a regular file".into());
    }
    if (meta.dev(), meta.ino()) != (ticket.dev, ticket.ino) {
        return Err(format!(
            "it is not the file that rank published (device {} inode {}, expected {} {}): \
             its process or descriptor changed",
            meta.dev(),
            meta.ino(),
            ticket.dev,
            ticket.ino
        ));
    }
    if meta.uid() != owner {
        return Err(format!(
            "it belongs to uid {}, but this rank runs as uid {owner}: every rank must run as \
             the same user, and a file someone else owns is never mapped",
            meta.uid()
        ));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "its mode is {:o}: group or others could open it",
            meta.mode() & 0o7777
        ));
    }
    if meta.nlink() != 0 {
        return Err(format!(
            "it has a name in the file system ({} links); inboxes never have one",
            meta.nlink()
        ));
    }
    if meta.len() != ticket.len {
        return Err(format!(
            "it has {} bytes, expected {}",
            meta.len(),
            ticket.len
        ));
    }
    if meta.blocks().saturating_mul(512) < ticket.len {
        return Err(format!(
            "only {} of its {} bytes are allocated (touching the rest could fault)",
            meta.blocks().saturating_mul(512),
            ticket.len
        ));
    }
    Ok(())
}

fn cannot_open(path: &Path, e: &io::Error) -> String {
    let hint = match e.kind() {
        io::ErrorKind::NotFound if !Path::new("/proc/self/fd").is_dir() => {
            " (/proc is not mounted here, and shared memory needs it)"
        }
        io::ErrorKind::NotFound => " (that rank's process, or its inbox, is gone)",
        io::ErrorKind::PermissionDenied => {
            " (every rank must run as the same user, in one PID namespace, and must not \
             have made itself undumpable)"
        }
        _ => "",
    };
    format!("opening {}: {e}{hint}", path.display())
}

fn cannot_create(dir: &Path, e: &io::Error) -> String {
    let hint = match e.raw_os_error() {
        Some(libc::ENOENT) => " (this system has no such directory)",
        Some(libc::EISDIR | libc::EOPNOTSUPP) => {
            " (unnamed files need Linux 3.11 or newer and a tmpfs there)"
        }
        _ => "",
    };
    format!("creating an unnamed file in {}: {e}{hint}", dir.display())
}

fn cannot_reserve(dir: &Path, len: usize, world_size: usize, e: &io::Error) -> String {
    if e.raw_os_error() != Some(libc::ENOSPC) {
        return format!("reserving {} in {}: {e}", bytes(len as u64), dir.display());
    }
    let job = (len as u64).saturating_mul(world_size as u64);
    let room = match space(dir) {
        Ok(s) => format!("{} free of {}", bytes(s.free), bytes(s.total)),
        Err(e) => format!("an unknown amount free ({e})"),
    };
    format!(
        "{} is full: this rank's inbox needs {}, the {world_size} ranks {} together, and it \
         has {room}. Give it more room (docker run --shm-size={}m or more; on Kubernetes \
         an emptyDir with medium: Memory mounted there)",
        dir.display(),
        bytes(len as u64),
        bytes(job),
        job.div_ceil(1 << 20) + 16
    )
}

/// `n` bytes, exactly and in MiB.
pub(super) fn bytes(n: u64) -> String {
    format!("{n} bytes ({:.1} MiB)", n as f64 / f64::from(1u32 << 20))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    const LEN: usize = 64 << 10;

    fn have_shm() -> bool {
        let ok = Path::new(SHM_DIR).is_dir();
        if !ok {
            eprintln!("skipped: no {SHM_DIR} on this machine");
        }
        ok
    }

    #[test]
    fn tickets_round_trip_and_garbage_is_refused() {
        let t = Ticket {
            pid: 42,
            fd: 7,
            dev: 23,
            ino: u64::MAX,
            len: 1 << 20,
        };
        assert_eq!(Ticket::decode(&t.encode()), Some(t));
        for bad in [
            "",
            "1 2 3 4",
            "1 2 3 4 5 6",
            "1  2 3 4 5",
            "-1 2 3 4 5",
            "4294967296 2 3 4 5",
            "1 2 3 4 +5",
            "01 2 3 4 5",
            "../../etc/passwd 2 3 4 5",
            "1 2 3 4 5 ",
        ] {
            assert_eq!(Ticket::decode(bad), None, "{bad:?}");
        }
        assert_eq!(t.path(), Path::new("/proc/42/fd/7"));
    }

    #[test]
    fn an_inbox_is_unnamed_owner_only_reserved_and_shared_through_its_ticket() {
        if !have_shm() {
            return;
        }
        let own = OwnInbox::create(LEN, 2).unwrap();
        let meta = own.file.metadata().unwrap();
        assert_eq!(meta.nlink(), 0, "an inbox must have no name");
        assert_eq!(meta.mode() & 0o7777, 0o600);
        assert!(meta.blocks() * 512 >= LEN as u64, "not reserved");
        let link = std::fs::read_link(own.ticket().path()).unwrap();
        assert!(link.starts_with(SHM_DIR), "{link:?}");
        let peer = open_peer(&own.ticket(), LEN, own.owner()).unwrap();
        peer.write(100, b"hello");
        let mut seen = [0u8; 5];
        own.mapping.read(100, &mut seen);
        assert_eq!(&seen, b"hello");
        // Once the owner closes its file, the ticket opens nothing any more (the
        // descriptor number may already name another file, which the checks refuse).
        let ticket = own.ticket();
        let owner = own.owner();
        let _mapping = own.into_mapping();
        assert!(open_peer(&ticket, LEN, owner).is_err());
    }

    #[test]
    fn wrong_size_or_inode_is_refused() {
        if !have_shm() {
            return;
        }
        let a = OwnInbox::create(LEN, 2).unwrap();
        let b = OwnInbox::create(LEN, 2).unwrap();
        let err = open_peer(&a.ticket(), 2 * LEN, a.owner()).unwrap_err();
        assert!(err.contains("same ringccl version"), "{err}");
        // A's descriptor, B's inode: the descriptor now names another file.
        let swapped = Ticket {
            ino: b.ticket().ino,
            ..a.ticket()
        };
        let err = open_peer(&swapped, LEN, a.owner()).unwrap_err();
        assert!(err.contains("not the file that rank published"), "{err}");
    }

    /// A ticket for `file` (opened by this process), claiming `len` bytes.
    fn ticket_of(file: &impl AsRawFd, len: u64) -> Ticket {
        let meta = std::fs::metadata(format!("/proc/self/fd/{}", file.as_raw_fd())).unwrap();
        Ticket {
            pid: std::process::id(),
            fd: file.as_raw_fd() as u32,
            dev: meta.dev(),
            ino: meta.ino(),
            len,
        }
    }

    #[test]
    fn named_files_symlinks_pipes_open_modes_and_sparse_files_are_refused() {
        if !have_shm() {
            return;
        }
        let owner = OwnInbox::create(LEN, 1).unwrap().owner();
        let dir = Path::new(SHM_DIR);
        let unique = format!(
            "ringccl-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        );
        let named = dir.join(format!("{unique}-named"));
        let link = dir.join(format!("{unique}-link"));
        let _ = std::fs::remove_file(&named);
        let _ = std::fs::remove_file(&link);
        let cleanup = || {
            let _ = std::fs::remove_file(&named);
            let _ = std::fs::remove_file(&link);
        };
        let named_file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&named)
            .unwrap();
        reserve(&named_file, LEN as u64).unwrap();
        std::os::unix::fs::symlink(&named, &link).unwrap();
        // An O_PATH descriptor of the symlink itself.
        let link_fd = File::options()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
            .open(&link)
            .unwrap();
        let (socket, _other_end) = std::os::unix::net::UnixStream::pair().unwrap();
        let open_to_all = File::options()
            .read(true)
            .write(true)
            .custom_flags(libc::O_TMPFILE)
            .mode(0o644)
            .open(dir)
            .unwrap();
        open_to_all
            .set_permissions(Permissions::from_mode(0o644))
            .unwrap();
        reserve(&open_to_all, LEN as u64).unwrap();
        let sparse = File::options()
            .read(true)
            .write(true)
            .custom_flags(libc::O_TMPFILE)
            .mode(0o600)
            .open(dir)
            .unwrap();
        sparse.set_len(LEN as u64).unwrap();

        let cases: [(Ticket, &[&str]); 5] = [
            (ticket_of(&named_file, LEN as u64), &["has a name"]),
            // Whether /proc shows the link itself or its target, it is refused.
            (
                ticket_of(&link_fd, LEN as u64),
                &["not a regular file", "has a name"],
            ),
            (ticket_of(&socket, LEN as u64), &["not a regular file"]),
            (ticket_of(&open_to_all, LEN as u64), &["group or others"]),
            (ticket_of(&sparse, LEN as u64), &["are allocated"]),
        ];
        for (ticket, why) in cases {
            let err = open_peer(&ticket, LEN, owner).unwrap_err();
            assert!(why.iter().any(|w| err.contains(w)), "{why:?}: {err}");
        }
        cleanup();
    }

    /// Runs `sh -c script` as uid/gid 65534 (nobody); `None` when this process may not
    /// switch users (not root).
    fn as_stranger(script: &str) -> Option<std::process::Output> {
        use std::os::unix::process::CommandExt;
        let me = std::fs::metadata("/proc/self").map(|m| m.uid());
        if !matches!(me, Ok(0)) {
            eprintln!("skipped: running a process as another user needs root (uid {me:?})");
            return None;
        }
        match Command::new("sh")
            .args(["-c", script])
            .uid(65534)
            .gid(65534)
            .output()
        {
            Ok(out) => Some(out),
            Err(e) => {
                eprintln!("skipped: cannot run a process as another user here: {e}");
                None
            }
        }
    }

    #[test]
    fn another_user_can_neither_open_an_inbox_nor_make_a_peer_map_his_file() {
        if !have_shm() {
            return;
        }
        let own = OwnInbox::create(LEN, 2).unwrap();
        let path = own.ticket().path();
        // The stranger knows exactly where the inbox is, and still cannot open it.
        let Some(out) = as_stranger(&format!(
            "exec 3<>{p} && echo opened-read-write; exec 4<{p} && echo opened-read",
            p = path.display()
        )) else {
            return;
        };
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stdout.contains("opened"), "stranger opened it: {stdout}");
        assert!(stderr.contains("Permission denied"), "{stderr}");

        // A file the stranger owns (here chowned to him) is refused even when a ticket
        // names it exactly.
        let theirs = File::options()
            .read(true)
            .write(true)
            .custom_flags(libc::O_TMPFILE)
            .mode(0o600)
            .open(SHM_DIR)
            .unwrap();
        reserve(&theirs, LEN as u64).unwrap();
        std::os::unix::fs::fchown(&theirs, Some(65534), Some(65534)).unwrap();
        let err = open_peer(&ticket_of(&theirs, LEN as u64), LEN, own.owner()).unwrap_err();
        assert!(err.contains("belongs to uid 65534"), "{err}");
    }

    #[test]
    fn a_full_dev_shm_is_an_error_naming_the_space() {
        // Stand-in for a full /dev/shm: more than its whole size, which tmpfs refuses
        // at once (tests/shm_hostile.rs fills a real, tiny one).
        if !have_shm() {
            return;
        }
        let total = space(Path::new(SHM_DIR)).unwrap().total;
        if total == 0 {
            eprintln!("skipped: {SHM_DIR} has no size limit here");
            return;
        }
        let huge = usize::try_from(total + (1 << 20)).unwrap();
        let err = OwnInbox::create(huge, 4).unwrap_err();
        assert!(err.contains("/dev/shm is full"), "{err}");
        assert!(err.contains(&format!("{huge} bytes")), "{err}");
        assert!(err.contains("free of"), "{err}");
        assert!(err.contains("--shm-size="), "{err}");
    }
}
