//! How fast bytes can move from one process's buffer into another's on this host, by
//! each path a shared-memory collective could take:
//!
//! - `memcpy`: one copy inside one process (the physical limit of one copy);
//! - `memcpy+16`: the same with the destination 16 bytes after the source, modulo 4 KiB,
//!   where glibc's `memcpy` is many times slower on some CPUs (why the shared-memory
//!   transport copies such ranges its own way);
//! - `shared`: one copy out of a buffer that lives in shared memory (what a buffer
//!   allocated in shared memory from the start gives its peers);
//! - `cma`: one copy straight out of the peer's private buffer, by the kernel
//!   (`process_vm_readv`, cross-memory attach);
//! - `rings`: two copies through a ring in shared memory (the sender copies chunks in,
//!   the receiver copies them out, in parallel), as the shared-memory transport does.
//!
//! `cargo bench -p ringccl-transports --bench copy_paths` prints GB/s per path and
//! size, median of several runs, and each path's ratio to `memcpy` measured in the same
//! run. `SIZES` (bytes, space-separated) narrows it.

// fork, mmap, process_vm_readv and raw copies between processes: every block says why
// it is sound.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The ring: slots of `CHUNK` bytes, as the transport's rings move data.
const CHUNK: usize = 64 * 1024;
const SLOTS: usize = 16;
const RUNS: usize = 7;

/// A shared anonymous mapping of `len` bytes, inherited across `fork`.
struct Shared {
    at: *mut u8,
    len: usize,
}

impl Shared {
    fn new(len: usize) -> Shared {
        // SAFETY: a fresh anonymous mapping; the result is checked.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(at, libc::MAP_FAILED, "mmap of {len} bytes");
        Shared { at: at.cast(), len }
    }

    fn counter(&self, index: usize) -> &AtomicU64 {
        assert!((index + 1) * 64 <= self.len);
        // SAFETY: inside the mapping, 64-byte aligned (mmap is page-aligned), and only
        // ever accessed as an atomic.
        unsafe { &*self.at.add(index * 64).cast::<AtomicU64>() }
    }

    fn bytes(&self, offset: usize, len: usize) -> *mut u8 {
        assert!(offset + len <= self.len);
        // SAFETY: inside the mapping (checked above).
        unsafe { self.at.add(offset) }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.at.cast(), self.len) };
    }
}

/// Runs `child` in a forked process and `parent` here; returns the seconds the child
/// reports through `sync` (counter 0 holds the child's nanoseconds when it is done).
fn fork_pair(sync: &Shared, child: impl FnOnce(), parent: impl FnOnce()) -> f64 {
    sync.counter(0).store(0, Ordering::SeqCst);
    // SAFETY: the bench is single-threaded here; the child runs only `child`, then
    // leaves with `_exit` (no destructors, no atexit handlers of the parent's).
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        child();
        // SAFETY: ends the child without running the parent's exit handlers.
        unsafe { libc::_exit(0) };
    }
    parent();
    let mut status = 0;
    // SAFETY: waits for the child just forked.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    sync.counter(0).load(Ordering::SeqCst) as f64 / 1e9
}

fn touch(buf: &mut [u8], seed: u8) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31).wrapping_add(seed);
    }
}

fn iterations(size: usize) -> usize {
    ((1usize << 30) / size).clamp(4, 20_000)
}

/// One copy inside this process, from a page-aligned mapping into a `Vec`, as the other
/// paths copy. (Two `Vec`s side by side on the heap can sit a multiple of 4 KiB apart,
/// which some CPUs' `rep movsb` copies many times slower: not the limit this measures.)
fn memcpy_seconds(size: usize) -> f64 {
    let source = Shared::new(size);
    // SAFETY: the whole mapping, used only by this thread while `source` lives.
    let from = unsafe { std::slice::from_raw_parts_mut(source.at, size) };
    touch(from, 1);
    let mut to = vec![0u8; size];
    touch(&mut to, 2);
    let n = iterations(size);
    let started = Instant::now();
    for _ in 0..n {
        to.copy_from_slice(std::hint::black_box(&*from));
        std::hint::black_box(&mut to);
    }
    started.elapsed().as_secs_f64() / n as f64
}

/// [`memcpy_seconds`] with the destination 16 bytes after the source, modulo 4 KiB.
fn memcpy_near_seconds(size: usize) -> f64 {
    let (source, target) = (Shared::new(size), Shared::new(size + 4096));
    // SAFETY: the two whole mappings (the target from byte 16), used only by this thread
    // while `source` and `target` live.
    let (from, to) = unsafe {
        (
            std::slice::from_raw_parts_mut(source.at, size),
            std::slice::from_raw_parts_mut(target.at.add(16), size),
        )
    };
    touch(from, 1);
    touch(to, 2);
    let n = iterations(size);
    let started = Instant::now();
    for _ in 0..n {
        to.copy_from_slice(std::hint::black_box(&*from));
        std::hint::black_box(&mut *to);
    }
    started.elapsed().as_secs_f64() / n as f64
}

/// The child copies out of a buffer in shared memory that the parent filled.
fn shared_seconds(size: usize, sync: &Shared) -> f64 {
    let segment = Shared::new(size);
    // SAFETY: the whole mapping, written only here, before the fork.
    touch(
        unsafe { std::slice::from_raw_parts_mut(segment.at, size) },
        3,
    );
    let n = iterations(size);
    fork_pair(
        sync,
        || {
            let mut to = vec![0u8; size];
            touch(&mut to, 4);
            // SAFETY: the mapping is alive for the child's life; nobody writes it now.
            let from = unsafe { std::slice::from_raw_parts(segment.at, size) };
            let started = Instant::now();
            for _ in 0..n {
                to.copy_from_slice(std::hint::black_box(from));
                std::hint::black_box(&mut to);
            }
            let ns = started.elapsed().as_nanos() as u64 / n as u64;
            sync.counter(0).store(ns.max(1), Ordering::SeqCst);
        },
        || {},
    )
}

/// The child reads the parent's private buffer with `process_vm_readv`.
fn cma_seconds(size: usize, sync: &Shared) -> Option<f64> {
    let mut from = vec![0u8; size];
    touch(&mut from, 5);
    let parent = std::process::id() as libc::pid_t;
    let address = from.as_ptr() as usize;
    let n = iterations(size);
    // Counter 1: the parent may leave (the child is done reading its buffer).
    sync.counter(1).store(0, Ordering::SeqCst);
    let seconds = fork_pair(
        sync,
        || {
            let mut to = vec![0u8; size];
            touch(&mut to, 6);
            let started = Instant::now();
            for _ in 0..n {
                let mut done = 0;
                while done < size {
                    let local = libc::iovec {
                        iov_base: to[done..].as_mut_ptr().cast(),
                        iov_len: size - done,
                    };
                    let remote = libc::iovec {
                        iov_base: (address + done) as *mut libc::c_void,
                        iov_len: size - done,
                    };
                    // SAFETY: `local` is this process's own buffer, `size - done` bytes
                    // from `done`; the kernel checks `remote` against the parent's
                    // mappings (the parent keeps its buffer until counter 1 is set).
                    let got = unsafe { libc::process_vm_readv(parent, &local, 1, &remote, 1, 0) };
                    if got <= 0 {
                        sync.counter(0).store(u64::MAX, Ordering::SeqCst);
                        sync.counter(1).store(1, Ordering::SeqCst);
                        return;
                    }
                    done += got as usize;
                }
                std::hint::black_box(&mut to);
            }
            let ns = started.elapsed().as_nanos() as u64 / n as u64;
            sync.counter(0).store(ns.max(1), Ordering::SeqCst);
            sync.counter(1).store(1, Ordering::SeqCst);
        },
        || {
            while sync.counter(1).load(Ordering::SeqCst) == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            std::hint::black_box(&from);
        },
    );
    (seconds * 1e9 < u64::MAX as f64 / 2.0).then_some(seconds)
}

/// The parent copies its buffer into a ring of `SLOTS` chunks, the child copies each
/// chunk out into its own buffer, both at once (counter 2: chunks written, 3: read).
fn rings_seconds(size: usize, sync: &Shared) -> f64 {
    let ring = Shared::new(CHUNK * SLOTS);
    let n = iterations(size);
    let chunks = size.div_ceil(CHUNK) as u64;
    let (written, read) = (sync.counter(2), sync.counter(3));
    written.store(0, Ordering::SeqCst);
    read.store(0, Ordering::SeqCst);
    let chunk_len = |k: u64| CHUNK.min(size - (k as usize % chunks as usize) * CHUNK);
    fork_pair(
        sync,
        || {
            let mut to = vec![0u8; size];
            touch(&mut to, 7);
            let started = Instant::now();
            for k in 0..n as u64 * chunks {
                while written.load(Ordering::Acquire) <= k {
                    std::hint::spin_loop();
                }
                let len = chunk_len(k);
                let at = (k as usize % chunks as usize) * CHUNK;
                // SAFETY: slot `k % SLOTS` holds chunk `k` (written before `written`
                // passed `k`, Acquire above) and is not rewritten until `read` passes it.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        ring.bytes((k as usize % SLOTS) * CHUNK, len),
                        to.as_mut_ptr().add(at),
                        len,
                    );
                }
                read.store(k + 1, Ordering::Release);
            }
            std::hint::black_box(&mut to);
            let ns = started.elapsed().as_nanos() as u64 / n as u64;
            sync.counter(0).store(ns.max(1), Ordering::SeqCst);
        },
        || {
            let mut from = vec![0u8; size];
            touch(&mut from, 8);
            for k in 0..n as u64 * chunks {
                while k >= read.load(Ordering::Acquire) + SLOTS as u64 {
                    std::hint::spin_loop();
                }
                let len = chunk_len(k);
                let at = (k as usize % chunks as usize) * CHUNK;
                // SAFETY: the reader is done with slot `k % SLOTS` (`read` is past
                // `k - SLOTS`, Acquire above); `from[at..at + len]` is inside `from`.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        from.as_ptr().add(at),
                        ring.bytes((k as usize % SLOTS) * CHUNK, len),
                        len,
                    );
                }
                written.store(k + 1, Ordering::Release);
            }
        },
    )
}

fn median(mut runs: Vec<f64>) -> f64 {
    runs.sort_by(|a, b| a.total_cmp(b));
    runs[runs.len() / 2]
}

fn main() {
    let sizes: Vec<usize> = std::env::var("SIZES")
        .ok()
        .map(|s| {
            s.split_whitespace()
                .filter_map(|v| v.parse().ok())
                .collect()
        })
        .unwrap_or_else(|| vec![64 << 10, 1 << 20, 16 << 20, 64 << 20]);
    let sync = Shared::new(4096);
    println!(
        "{:>10} {:>8} {:>9} {:>8} {:>8} {:>8}   GB/s, median of {RUNS}; ratio to memcpy",
        "bytes", "memcpy", "memcpy+16", "shared", "cma", "rings"
    );
    for size in sizes {
        let (mut m, mut s, mut c, mut r) = (vec![], vec![], vec![], vec![]);
        let mut near = vec![];
        let mut cma_ok = true;
        // Interleaved, so that the machine's drift touches every path alike.
        for _ in 0..RUNS {
            m.push(memcpy_seconds(size));
            near.push(memcpy_near_seconds(size));
            s.push(shared_seconds(size, &sync));
            match cma_seconds(size, &sync) {
                Some(t) => c.push(t),
                None => cma_ok = false,
            }
            r.push(rings_seconds(size, &sync));
        }
        let rate = |t: f64| size as f64 / t / 1e9;
        let memcpy = rate(median(m));
        let cma = if cma_ok && !c.is_empty() {
            rate(median(c))
        } else {
            f64::NAN
        };
        let (shared, rings, near) = (rate(median(s)), rate(median(r)), rate(median(near)));
        println!(
            "{size:>10} {memcpy:>8.2} {near:>9.2} {shared:>8.2} {cma:>8.2} {rings:>8.2}   {:.2} {:.2} {:.2} {:.2}",
            near / memcpy,
            shared / memcpy,
            cma / memcpy,
            rings / memcpy
        );
        if !cma_ok {
            println!("           (process_vm_readv was refused: ptrace permission between the processes)");
        }
    }
}
