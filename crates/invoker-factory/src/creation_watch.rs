//! A directory watched (inotify) for one name's creation, from before whatever makes it starts:
//! a runtime's socket is connected to when it appears, not looked for every millisecond (each
//! look a `connect(2)` and a timer on the invoker's one thread, and half a millisecond late on
//! average).

use futures_util::StreamExt;
use inotify::{EventStream, Inotify, WatchMask};
use std::ffi::OsString;
use std::path::Path;

pub struct CreationWatch {
    events: EventStream<Vec<u8>>,
    name: OsString,
}

impl CreationWatch {
    /// Watches `dir` for `name`: call before anything can make it.
    pub fn on(dir: &Path, name: &str) -> std::io::Result<Self> {
        let inotify = Inotify::init()?;
        inotify.watches().add(dir, WatchMask::CREATE | WatchMask::MOVED_TO)?;
        Ok(CreationWatch { events: inotify.into_event_stream(vec![0u8; 1024])?, name: name.into() })
    }

    /// Waits until `name` is made (or renamed into place) in the directory; bounded by the
    /// caller. `Err` when the watch fails (the caller looks for it itself then).
    pub async fn created(&mut self) -> std::io::Result<()> {
        while let Some(event) = self.events.next().await {
            if event?.name.is_some_and(|name| name == self.name) {
                return Ok(());
            }
        }
        Err(std::io::Error::other("the watch ended"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_name_made_after_the_watch_is_seen_and_others_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let mut watch = CreationWatch::on(dir.path(), "sock").unwrap();
        std::fs::write(dir.path().join("other"), b"").unwrap();
        let early = tokio::time::timeout(Duration::from_millis(100), watch.created()).await;
        assert!(early.is_err(), "another name is not the one watched for");
        let _listener = std::os::unix::net::UnixListener::bind(dir.path().join("sock")).unwrap();
        let seen = tokio::time::timeout(Duration::from_secs(10), watch.created()).await;
        assert!(matches!(seen, Ok(Ok(()))), "{seen:?}");
    }
}
