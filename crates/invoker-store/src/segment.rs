//! One journal segment, written through a shared mapping of its file: a line appended is a
//! copy into the page cache, without a syscall. A `write(2)` of a line cost about as much as
//! the rest of the store's work on the warm path (ext4's buffered write: the inode lock, the
//! page's lookup, delayed allocation, for every line; two lines an activation). A copy into a
//! shared mapping survives a SIGKILL as a write does (the kernel holds the pages and writes them
//! back); against a power loss the journal's flush thread syncs its lines (`msync(2)` of them,
//! which writes the pages a `pwrite(2)` of a large line dirtied as well).
//!
//! The file's blocks are allocated before they are mapped (`posix_fallocate`, a step at a
//! time, from the first line), so a full disk is an error of [`Segment::append`] when it needs
//! the next step, never a fault at a copy or at write-back, and never an error of a segment's
//! creation (a start on a full disk makes one). The file is longer than what was written: the
//! rest is zeros, which no line holds (JSON escapes a NUL), so a reader stops at the first one.

use memmap2::MmapMut;
use std::fs::File;
use std::io;
use std::path::Path;

/// Room allocated at a time: a flush's worth of lines under steady load (a segment lives one
/// flush), and what the journal's reserve gives back at a time, so that a release makes room
/// for the next step.
pub const ROOM_STEP: u64 = 1024 * 1024;

/// A line this long or longer (a large call's record) is written with `pwrite(2)` rather than
/// copied through the mapping: the same page cache, but its pages are not made the process's
/// own (resident in it) by the copy, so a 64 MiB record costs the invoker's memory once (its
/// JSON), not twice. Below it the copy's saving (no syscall) is what the mapping is for.
const LARGE_LINE: usize = 256 * 1024;

pub struct Segment {
    file: File,
    /// `None` until room was made.
    map: Option<MmapMut>,
    /// Bytes written, from the start: where the next line goes.
    len: usize,
}

impl Segment {
    /// A new, empty segment at `path`, readable and writable by its owner alone (records hold
    /// results, logs and parameters), without room yet: making one never needs the disk.
    pub fn create(path: &Path) -> io::Result<Segment> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let file = File::options().create(true).truncate(true).read(true).write(true).mode(0o600).open(path)?;
        Ok(Segment { file, map: None, len: 0 })
    }

    /// Bytes written so far.
    pub fn written(&self) -> usize {
        self.len
    }

    /// A handle of the segment's file of its own, to sync it without holding the segment.
    pub fn handle(&self) -> io::Result<File> {
        self.file.try_clone()
    }

    /// Room for `bytes` in all (whole steps), allocated and mapped with its pages made writable
    /// now: done ahead of the lines (the journal's flush does it for the next segment), a line
    /// costs a copy and no page fault. `Err` (the room as it was) when the disk has none.
    pub fn make_room(&mut self, bytes: usize) -> io::Result<&mut MmapMut> {
        self.make_room_after(bytes, self.len)
    }

    /// As [`Self::make_room`], the pages made writable ahead from `populated_from` on (after a
    /// large line, which does not go through them).
    fn make_room_after(&mut self, bytes: usize, populated_from: usize) -> io::Result<&mut MmapMut> {
        match self.map.take() {
            Some(map) if bytes <= map.len() => Ok(self.map.insert(map)),
            kept => {
                let size = (bytes as u64).div_ceil(ROOM_STEP) * ROOM_STEP;
                match allocate_and_map(&self.file, size) {
                    Ok(map) => {
                        // The pages not written yet, writable in one call, not by a fault each.
                        let from = (populated_from / 4096 * 4096).min(map.len());
                        let _ = map.advise_range(memmap2::Advice::PopulateWrite, from, map.len() - from);
                        Ok(self.map.insert(map))
                    }
                    Err(e) => {
                        self.map = kept;
                        Err(e)
                    }
                }
            }
        }
    }

    /// Copies `line` after the lines before it. `Err` (and nothing written) when the segment
    /// needed more room and the disk has none.
    pub fn append(&mut self, line: &[u8]) -> io::Result<()> {
        self.append_parts(&[line])
    }

    /// As [`Self::append`], the line given as its parts, written one after another (a large
    /// record's line is never joined into one buffer first).
    pub fn append_parts(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        let length: usize = parts.iter().map(|part| part.len()).sum();
        let (mut at, end) = (self.len, self.len + length);
        if length < LARGE_LINE {
            let map = self.make_room(end)?;
            for part in parts {
                map[at..at + part.len()].copy_from_slice(part);
                at += part.len();
            }
        } else {
            use std::os::unix::fs::FileExt as _;
            // Allocated and mapped as any line's room (a full disk is an error here, not at
            // write-back); the line goes into the file past the mapping's pages.
            self.make_room_after(end, end)?;
            for part in parts {
                self.file.write_all_at(part, at as u64)?;
                at += part.len();
            }
        }
        self.len = end;
        Ok(())
    }
}

/// Allocates `size` bytes of `file` (real blocks, the file's length with them) and maps them all.
fn allocate_and_map(file: &File, size: u64) -> io::Result<MmapMut> {
    let len = i64::try_from(size).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    nix::fcntl::posix_fallocate(file, 0, len).map_err(io::Error::from)?;
    // SAFETY: the file is the journal's own segment, created by this store in its own
    // directory (0600) and written only through this mapping; it is never truncated while
    // mapped (a segment is removed once a flush moved it into redb and its `Segment` is
    // dropped), and every byte mapped is allocated and within the file, so no access faults.
    #[allow(unsafe_code)]
    unsafe {
        MmapMut::map_mut(file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines of a segment's bytes: up to the first NUL, the unwritten rest of its room.
    fn written(bytes: &[u8]) -> &[u8] {
        match bytes.iter().position(|&b| b == 0) {
            Some(end) => &bytes[..end],
            None => bytes,
        }
    }

    #[test]
    fn lines_land_in_the_file_as_written_and_the_room_grows_a_step_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let mut segment = Segment::create(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0, "no room before the first line");
        segment.append(b"one\n").unwrap();
        // Read by another handle while the segment is open: what a SIGKILL would leave.
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, ROOM_STEP);
        assert_eq!(written(&bytes), b"one\n");
        let long = vec![b'x'; ROOM_STEP as usize];
        segment.append(&long).unwrap();
        segment.append(b"\n").unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, 2 * ROOM_STEP);
        assert_eq!(written(&bytes).len(), 4 + long.len() + 1);
        assert!(written(&bytes).ends_with(b"x\n"));
        // The long line went in by pwrite(2), the short ones through the mapping: the mapping
        // sees all of them where they were written (one page cache).
        let map = segment.map.as_ref().unwrap();
        assert_eq!(&map[..4], b"one\n");
        assert!(map[4..4 + long.len()] == long[..], "the pwritten line, seen through the mapping");
        assert_eq!(map[4 + long.len()], b'\n');
    }
}
