//! Records whose result is large, kept out of redb: each in a file of its own beside the
//! database, its entry in redb's records table a marker that says so. redb writes a value
//! through pages it allocates and zero-fills in memory, so a 64 MiB record cost the invoker
//! 128 MiB of its own memory at the flush that moved it there (measured: the store's flush
//! thread held half of a 64 MiB call's peak). A file is written from the record's parts
//! (`invoker_wire::json_parts`) into the page cache, never the process's memory, and is
//! durable before the transaction that points to it commits (the journal's segment holding
//! the record is deleted only after that).

use invoker_wire::json_parts::JsonParts;
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// The records table's value for a record kept in its own file: no record's JSON is one byte.
pub(crate) const OUT_OF_LINE: &[u8] = b"\0";

/// The longest activation id kept out of line (its file's name).
const MAX_ID: usize = 128;

pub(crate) struct LargeRecords {
    dir: PathBuf,
}

impl LargeRecords {
    /// The directory beside the database file `db` (`<db>.records`), the invoker's alone.
    pub(crate) fn open(db: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt as _;
        let dir = db.with_extension("records");
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir)?;
        Ok(LargeRecords { dir })
    }

    /// Whether a record goes into a file: its JSON is in parts (its result is large,
    /// `SHARED_RESULT`), and its id is a plain file name. Any other stays in redb.
    pub(crate) fn takes(id: &str, json: &JsonParts) -> bool {
        !json.parts()[1].is_empty()
            && !id.is_empty()
            && id.len() <= MAX_ID
            && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    }

    /// Writes the record's file from its parts, durable when this returns (a file written
    /// whole under another name, then renamed: a crash leaves the old file or the new one).
    pub(crate) fn write(&self, id: &str, json: &JsonParts) -> std::io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let (path, partial) = (self.path(id), self.dir.join(format!("{id}.partial")));
        let mut file = std::fs::File::options().create(true).truncate(true).write(true).mode(0o600).open(&partial)?;
        json.parts().iter().try_for_each(|part| file.write_all(part))?;
        file.sync_data()?;
        std::fs::rename(&partial, &path)
    }

    pub(crate) fn read(&self, id: &str) -> std::io::Result<Vec<u8>> {
        std::fs::read(self.path(id))
    }

    /// Removes a record's file, if it has one (a record removed or replaced by one in redb).
    pub(crate) fn remove(&self, id: &str) {
        if let Err(e) = std::fs::remove_file(self.path(id)) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(activation = id, "a large record's file could not be removed: {e}");
            }
        }
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn only_a_record_in_parts_with_a_plain_id_goes_to_a_file_and_it_reads_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let large = LargeRecords::open(&dir.path().join("s.redb")).unwrap();
        let parts =
            JsonParts::split(Bytes::from_static(b"{\"r\":"), Bytes::from_static(b"[1]"), Bytes::from_static(b"}"));
        assert!(LargeRecords::takes("0123abcd", &parts));
        assert!(!LargeRecords::takes("0123abcd", &JsonParts::whole(Bytes::from_static(b"{}"))), "one part: in redb");
        for id in ["../x", "a/b", "", ".", "a.b", &"a".repeat(MAX_ID + 1)] {
            assert!(!LargeRecords::takes(id, &parts), "{id:?} is no plain file name");
        }
        large.write("0123abcd", &parts).unwrap();
        assert_eq!(large.read("0123abcd").unwrap(), b"{\"r\":[1]}");
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(dir.path().join("s.records/0123abcd.json")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "records hold results: the invoker's alone");
        large.remove("0123abcd");
        assert!(large.read("0123abcd").is_err());
        large.remove("0123abcd");
    }
}
