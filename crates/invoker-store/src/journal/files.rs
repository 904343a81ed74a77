//! The journal directory's files: its segments (named by number, oldest first), what a restart
//! could not read kept aside as damaged, and the reserve of disk kept for records' lines.

use crate::contract::StoreError;
use crate::segment::Segment;
use std::fs::File;
use std::path::{Path, PathBuf};

/// The reserve's file in the journal directory.
pub(super) const RESERVE: &str = "reserve";

/// What the reserve gives back at least when a line needs room: a few lines' worth.
pub(super) const RESERVE_STEP: u64 = 1024 * 1024;

/// Disk kept for the lines of records, given back a step at a time when the disk is full.
pub(super) struct Reserve {
    file: File,
    /// What is allocated now, and what it should be.
    size: u64,
    target: u64,
}

impl Reserve {
    pub(super) fn open(dir: &Path, target: u64) -> Result<Self, StoreError> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let file = File::options()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .mode(0o600)
            .open(dir.join(RESERVE))
            .map_err(|e| io_err("journal reserve", e))?;
        let size = file.metadata().map_err(|e| io_err("journal reserve", e))?.len();
        Ok(Reserve { file, size, target })
    }

    /// Allocates the reserve whole (real blocks, not a sparse file); `Err` when the disk has
    /// not the room.
    pub(super) fn fill(&mut self) -> Result<(), StoreError> {
        if self.size >= self.target {
            return Ok(());
        }
        let len = i64::try_from(self.target).unwrap_or(i64::MAX);
        nix::fcntl::posix_fallocate(&self.file, 0, len).map_err(|e| io_err("journal reserve", e.into()))?;
        self.size = self.target;
        Ok(())
    }

    /// Gives back at least `need` bytes (a step at least) to the disk; false once it is empty.
    pub(super) fn release(&mut self, need: u64) -> bool {
        if self.size == 0 {
            return false;
        }
        let size = self.size.saturating_sub(need.max(RESERVE_STEP));
        if self.file.set_len(size).is_err() {
            return false;
        }
        self.size = size;
        true
    }
}

pub(super) fn io_err(what: &str, source: std::io::Error) -> StoreError {
    StoreError::Io { what: what.to_string(), source }
}

pub(super) fn segment_path(dir: &Path, n: u64) -> PathBuf {
    dir.join(format!("journal.{n:020}"))
}

/// A segment's number, from its file name (`journal.<n>`).
pub(super) fn segment_number(path: &Path) -> Option<u64> {
    path.file_name()?.to_str()?.strip_prefix("journal.")?.parse().ok()
}

/// The segments in `dir`, oldest first: the regular files named as segments, nothing else.
pub(super) fn segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>, StoreError> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| io_err("journal directory", e))? {
        let entry = entry.map_err(|e| io_err("journal directory", e))?;
        let is_file = entry.file_type().is_ok_and(|t| t.is_file());
        let path = entry.path();
        if let (Some(n), true) = (segment_number(&path), is_file) {
            found.push((n, path));
        }
    }
    found.sort();
    Ok(found)
}

/// The suffix of a segment that could not be read whole, kept aside for inspection.
pub(super) const DAMAGED: &str = "damaged";

/// Looks over the journal directory once at open: says what lies there that is not a segment
/// (a directory named as one, a stray file: skipped, never a reason not to start), and returns
/// the number of the next segment, past every name taken.
pub(super) fn survey(dir: &Path) -> Result<u64, StoreError> {
    let mut next = 0;
    for entry in std::fs::read_dir(dir).map_err(|e| io_err("journal directory", e))?.flatten() {
        let path = entry.path();
        let number = segment_number(&path);
        next = next.max(number.map_or(0, |n| n + 1));
        let is_file = entry.file_type().is_ok_and(|t| t.is_file());
        let kept_aside = path.extension().is_some_and(|e| e == DAMAGED);
        let reserve = path.file_name().is_some_and(|n| n == RESERVE);
        if !(kept_aside || reserve || is_file && number.is_some()) {
            tracing::warn!(path = %path.display(), "skipped an entry of the journal directory that is not a segment");
        }
    }
    Ok(next)
}

pub(super) fn open_segment(dir: &Path, n: u64) -> Result<Segment, StoreError> {
    Segment::create(&segment_path(dir, n)).map_err(|e| io_err("journal segment", e))
}
