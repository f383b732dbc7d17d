//! Reading a flight directory: the `rank-*.json` dumps and `rank-*.beacon` beacons the
//! recorder writes, each checked; files that cannot be used are reported and skipped.

use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use ringccl::flight::beacon::{Beacon, BEACON_LEN};
use ringccl::flight::dump::{FlightDump, FORMAT_VERSION, OLDEST_FORMAT_READ};

use super::evidence::{BeaconReading, Evidence};

/// Larger dump files are refused (a full ring of 2,000 calls is a few MiB).
const MAX_DUMP_BYTES: u64 = 64 << 20;
/// Larger world sizes are taken for a damaged file.
const MAX_WORLD_SIZE: usize = 1 << 24;

/// What a flight file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlightFileKind {
    /// `rank-<r>[.<group tag>].json`: a [`FlightDump`].
    Dump,
    /// `rank-<r>[.<group tag>].beacon`: a [`Beacon`].
    Beacon,
}

/// One recorder file in a flight directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlightFile {
    /// Where it is.
    pub path: PathBuf,
    /// The rank, from its name.
    pub rank: usize,
    /// The group's tag, from its name (empty for the group made by `init_process_group`).
    pub group_tag: String,
    /// Dump or beacon.
    pub kind: FlightFileKind,
}

impl FlightFile {
    /// Recognises `rank-<r>.json`, `rank-<r>.<tag>.json` and the same with `.beacon`.
    ///
    /// ```
    /// use ringccl_tools::diagnose::{FlightFile, FlightFileKind};
    ///
    /// let file = FlightFile::parse("/d/rank-3.group-0-1.beacon".as_ref()).unwrap();
    /// assert_eq!((file.rank, file.group_tag.as_str(), file.kind), (3, "group-0-1", FlightFileKind::Beacon));
    /// assert!(FlightFile::parse("/d/.rank-3.json.77.0.tmp".as_ref()).is_none());
    /// assert!(FlightFile::parse("/d/trace.json".as_ref()).is_none());
    /// ```
    pub fn parse(path: &Path) -> Option<FlightFile> {
        let name = path.file_name()?.to_str()?;
        let rest = name.strip_prefix("rank-")?;
        let (stem, kind) = if let Some(stem) = rest.strip_suffix(".json") {
            (stem, FlightFileKind::Dump)
        } else {
            (rest.strip_suffix(".beacon")?, FlightFileKind::Beacon)
        };
        let (digits, tag) = stem.split_once('.').unwrap_or((stem, ""));
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(FlightFile {
            path: path.to_path_buf(),
            rank: digits.parse().ok()?,
            group_tag: tag.to_string(),
            kind,
        })
    }
}

/// The recorder files in `dir`, sorted by name; other files are ignored.
///
/// ```
/// let dir = std::env::temp_dir().join(format!("flight-scan-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// std::fs::write(dir.join("rank-0.beacon"), [0u8; 64]).unwrap();
/// std::fs::write(dir.join("notes.txt"), "x").unwrap();
/// let files = ringccl_tools::diagnose::scan(&dir).unwrap();
/// assert_eq!(files.len(), 1);
/// std::fs::remove_dir_all(&dir).unwrap();
/// ```
pub fn scan(dir: &Path) -> io::Result<Vec<FlightFile>> {
    let mut files: Vec<FlightFile> = fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter_map(|entry| FlightFile::parse(&entry.path()))
        .collect();
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(files)
}

/// Reads a beacon file: `None` if it is not one (wrong size or magic) or unreadable.
///
/// ```
/// use ringccl::flight::beacon::Beacon;
/// use ringccl_tools::diagnose::read_beacon;
///
/// let path = std::env::temp_dir().join(format!("beacon-doc-{}", std::process::id()));
/// let beacon = Beacon { pid: 9, issued: 2, finished: 1, ..Beacon::default() };
/// std::fs::write(&path, beacon.encode()).unwrap();
/// assert_eq!(read_beacon(&path), Some(beacon));
/// std::fs::remove_file(&path).unwrap();
/// ```
pub fn read_beacon(path: &Path) -> Option<Beacon> {
    let mut bytes = Vec::with_capacity(BEACON_LEN + 1);
    fs::File::open(path)
        .ok()?
        .take(BEACON_LEN as u64 + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    if bytes.len() != BEACON_LEN {
        return None;
    }
    Beacon::decode(&bytes)
}

/// Reads and checks one dump file; the error says what is wrong with it.
///
/// ```
/// use ringccl_tools::diagnose::read_dump;
///
/// let path = std::env::temp_dir().join(format!("dump-doc-{}.json", std::process::id()));
/// std::fs::write(&path, r#"{"format": 99}"#).unwrap();
/// assert!(read_dump(&path).unwrap_err().contains("format 99"));
/// std::fs::remove_file(&path).unwrap();
/// ```
pub fn read_dump(path: &Path) -> Result<FlightDump, String> {
    let file = fs::File::open(path).map_err(|e| format!("cannot be read ({e})"))?;
    let mut text = Vec::new();
    file.take(MAX_DUMP_BYTES + 1)
        .read_to_end(&mut text)
        .map_err(|e| format!("cannot be read ({e})"))?;
    if text.len() as u64 > MAX_DUMP_BYTES {
        return Err(format!("is larger than {} MiB", MAX_DUMP_BYTES >> 20));
    }
    let value: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| format!("is not JSON ({e})"))?;
    match value.get("format").and_then(serde_json::Value::as_u64) {
        Some(format)
            if (u64::from(OLDEST_FORMAT_READ)..=u64::from(FORMAT_VERSION)).contains(&format) => {}
        Some(other) => {
            return Err(format!(
                "has dump format {other}, this reader knows formats \
                 {OLDEST_FORMAT_READ} to {FORMAT_VERSION}"
            ))
        }
        None => return Err("is not a flight dump (no \"format\" field)".into()),
    }
    let dump: FlightDump =
        serde_json::from_value(value).map_err(|e| format!("is not a valid flight dump ({e})"))?;
    if dump.world_size == 0 || dump.world_size > MAX_WORLD_SIZE || dump.rank >= dump.world_size {
        return Err(format!(
            "names rank {} of a group of {} ranks",
            dump.rank, dump.world_size
        ));
    }
    Ok(dump)
}

/// Reads every dump and main-group beacon in `dir` into an [`Evidence`] (with no
/// launcher view). Files written before `not_before_us` (an earlier run's) and files that
/// cannot be used are skipped, each with a note saying why.
///
/// ```
/// use ringccl_tools::diagnose::load_dir;
///
/// let dir = std::env::temp_dir().join(format!("flight-load-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// std::fs::write(dir.join("rank-0.json"), "not json").unwrap();
/// let evidence = load_dir(&dir, 0, 0).unwrap();
/// assert!(evidence.dumps.is_empty());
/// assert!(evidence.notes[0].contains("rank-0.json"));
/// std::fs::remove_dir_all(&dir).unwrap();
/// ```
pub fn load_dir(dir: &Path, now_us: u64, not_before_us: u64) -> io::Result<Evidence> {
    let mut evidence = Evidence::at(now_us);
    for file in scan(dir)? {
        let name = file
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        match file.kind {
            FlightFileKind::Dump => match read_dump(&file.path) {
                Ok(dump) if dump.rank != file.rank => evidence.notes.push(format!(
                    "{name} holds the dump of rank {}; skipped",
                    dump.rank
                )),
                Ok(dump) if dump.dumped_at_us < not_before_us => evidence.notes.push(format!(
                    "{name} was written before this run started; skipped"
                )),
                Ok(dump) => evidence.dumps.push(dump),
                Err(why) => evidence.notes.push(format!("{name} {why}; skipped")),
            },
            FlightFileKind::Beacon if file.group_tag.is_empty() => {
                if modified_us(&file.path).is_some_and(|at| at < not_before_us) {
                    continue; // an earlier run's beacon: no note, beacons are ephemeral
                }
                match read_beacon(&file.path) {
                    Some(beacon) => evidence.beacons.push(BeaconReading {
                        rank: file.rank,
                        beacon,
                    }),
                    None => evidence
                        .notes
                        .push(format!("{name} is not a readable beacon; skipped")),
                }
            }
            FlightFileKind::Beacon => {}
        }
    }
    Ok(evidence)
}

/// A file's modification time in µs since the Unix epoch (`None` if it cannot be read).
///
/// ```
/// use ringccl_tools::diagnose::modified_us;
///
/// assert!(modified_us(&std::env::temp_dir()).is_some_and(|t| t > 0));
/// assert_eq!(modified_us("/no/such/file".as_ref()), None);
/// ```
pub fn modified_us(path: &Path) -> Option<u64> {
    let modified = fs::metadata(path).ok()?.modified().ok()?;
    let since = modified.duration_since(UNIX_EPOCH).ok()?;
    u64::try_from(since.as_micros()).ok()
}
