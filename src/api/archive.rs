//! A zip action's archive checked at `PUT`, before anything of it is written anywhere: every
//! entry stays inside the action's directory (no absolute path, no `..` that climbs out of it,
//! no symlink that points out of it), and what the entries hold unpacked stays within a bound.
//! A bad archive is the developer's error at `PUT`, named by its entry, not a failure at the
//! first invoke, nor a gigabyte under `data_dir`.
//!
//! The sizes are those the archive declares: the extractors that unpack actions (python's
//! `zipfile` in our runtime and OpenWhisk's) stop each entry at its declared size.

use std::io::Read;
use std::path::{Component, Path};

/// How much of a symlink entry is read as its target at most.
const MAX_LINK: u64 = 4096;

/// What is wrong with an archive, for a 400 naming `exec.code`.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ArchiveError {
    #[error("not a zip archive that can be read: {0}")]
    Unreadable(String),
    #[error("archive entry '{entry}': {reason}")]
    Entry { entry: String, reason: &'static str },
    #[error("the archive holds {size} bytes unpacked, more than the {max} bytes allowed")]
    TooLarge { size: u64, max: u64 },
}

/// Whether `bytes` begin as a zip archive does (a local file header, or the end record of an
/// empty one).
pub fn is_zip(bytes: &[u8]) -> bool {
    bytes.starts_with(b"PK\x03\x04") || bytes.starts_with(b"PK\x05\x06")
}

/// What an archive takes of a disk once unpacked.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Unpacked {
    /// Files, links and directories (those its paths imply included): one inode each.
    pub files: u64,
    /// Its files' sizes in whole 4 KiB pages, as a tmpfs keeps them.
    pub disk_bytes: u64,
}

/// Checks every entry of the zip archive in `bytes`; `max_unpacked` bounds the sum of their
/// sizes. Returns what it takes of a disk.
pub fn check_zip(bytes: &[u8], max_unpacked: u64) -> Result<Unpacked, ArchiveError> {
    let unreadable = |e: zip::result::ZipError| ArchiveError::Unreadable(e.to_string());
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes)).map_err(unreadable)?;
    let mut total: u64 = 0;
    let mut unpacked = Unpacked::default();
    let mut dirs = std::collections::HashSet::new();
    for index in 0..archive.len() {
        let mut entry = archive.by_index(index).map_err(unreadable)?;
        let name = entry.name().map_err(unreadable)?.into_owned();
        let bad = |reason| ArchiveError::Entry { entry: name.chars().take(200).collect(), reason };
        let depth = inside_depth(Path::new(&name)).map_err(bad)?;
        total = total.saturating_add(entry.size());
        unpacked.disk_bytes = unpacked.disk_bytes.saturating_add(crate::config::disk_bytes_of(entry.size()));
        let path = Path::new(&name);
        if entry.is_dir() {
            dirs.insert(path.to_path_buf());
        } else {
            unpacked.files += 1;
        }
        dirs.extend(path.ancestors().skip(1).filter(|p| !p.as_os_str().is_empty()).map(Path::to_path_buf));
        if total > max_unpacked {
            return Err(ArchiveError::TooLarge { size: total, max: max_unpacked });
        }
        if entry.is_symlink() {
            let mut target = String::new();
            (&mut entry)
                .take(MAX_LINK)
                .read_to_string(&mut target)
                .map_err(|_| bad("a symlink whose target cannot be read"))?;
            // The link resolves from the directory holding it.
            if escapes_from(Path::new(&target), depth.saturating_sub(1)) {
                return Err(bad("a symlink that points outside the action's directory"));
            }
        }
    }
    unpacked.files += dirs.len() as u64;
    Ok(unpacked)
}

/// How many directories deep `path` lies inside the directory it is unpacked in, or why it
/// does not lie inside it at all.
fn inside_depth(path: &Path) -> Result<usize, &'static str> {
    let mut depth: usize = 0;
    for component in path.components() {
        match component {
            Component::RootDir | Component::Prefix(_) => return Err("an absolute path"),
            Component::ParentDir => {
                depth = depth.checked_sub(1).ok_or("a path that climbs out of the action's directory (..)")?
            }
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
        }
    }
    Ok(depth)
}

/// Whether a relative `target`, followed from a directory `from` levels deep, climbs above the
/// top.
fn escapes_from(target: &Path, from: usize) -> bool {
    let mut depth = from as i64;
    for component in target.components() {
        match component {
            Component::RootDir | Component::Prefix(_) => return true,
            Component::ParentDir => depth -= 1,
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
        }
        if depth < 0 {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use zip::write::SimpleFileOptions;

    fn zip_of(entries: &[(&str, &[u8])], links: &[(&str, &str)]) -> Vec<u8> {
        let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let options = SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
        for (name, data) in entries {
            writer.start_file(*name, options).unwrap();
            writer.write_all(data).unwrap();
        }
        for (name, target) in links {
            writer.add_symlink(*name, *target, options).unwrap();
        }
        writer.finish().unwrap().into_inner()
    }

    #[test]
    fn what_an_archive_takes_of_a_disk_counts_implied_directories_and_whole_pages() {
        let zip = zip_of(&[("a/b/c.txt", b"x"), ("a/d.txt", &[0u8; 5000]), ("e", b"")], &[]);
        let unpacked = check_zip(&zip, 1 << 20).unwrap();
        assert_eq!(unpacked, Unpacked { files: 5, disk_bytes: 4096 + 8192 }, "3 files, a/ and a/b/");
    }

    #[test]
    fn entries_stay_inside_and_within_the_bound() {
        let good = zip_of(&[("__main__.py", b"def main(a): return a"), ("lib/x.py", b"")], &[("lib/y", "x.py")]);
        assert!(is_zip(&good));
        assert_eq!(check_zip(&good, 1 << 20).map(|u| u.files > 0), Ok(true));
        let reason = |bytes: Vec<u8>| check_zip(&bytes, 1 << 20).unwrap_err().to_string();
        assert!(reason(zip_of(&[("../evil.py", b"x")], &[])).contains("'../evil.py': a path that climbs out"));
        assert!(reason(zip_of(&[("a/../../evil.py", b"x")], &[])).contains("climbs out"));
        assert!(reason(zip_of(&[("/etc/evil", b"x")], &[])).contains("'/etc/evil': an absolute path"));
        assert!(reason(zip_of(&[], &[("link", "/etc/passwd")])).contains("'link': a symlink that points outside"));
        assert!(reason(zip_of(&[], &[("lib/link", "../../x")])).contains("points outside"));
        assert!(check_zip(&zip_of(&[], &[("lib/link", "../x")]), 1 << 20).is_ok(), "up one from lib/ is the top");
        let bomb = zip_of(&[("zeros", &vec![0u8; 2 << 20])], &[]);
        assert!(bomb.len() < 64 * 1024, "it packs small");
        assert_eq!(check_zip(&bomb, 1 << 20), Err(ArchiveError::TooLarge { size: 2 << 20, max: 1 << 20 }));
        assert!(matches!(check_zip(b"PK\x03\x04 not really", 1 << 20), Err(ArchiveError::Unreadable(_))));
    }
}
