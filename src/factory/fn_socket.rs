//! Fn's readiness rule for an http-stream container, as Fn's agent applies it: the function
//! is ready when `lsnr.sock` appears in its socket directory as a socket, or as a *relative*
//! symlink to a socket in that same directory (the FDKs bind a phony socket, serve on it, then
//! link the listener to it). The directory is watched with inotify from before the container
//! starts, so the creation is never missed and nothing polls.

use crate::proxy::protocol::fn_stream::LISTENER;
use futures_util::StreamExt;
use inotify::{EventStream, Inotify, WatchMask};
use std::os::unix::fs::FileTypeExt;
use std::path::{Component, Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ListenerError {
    #[error("watching the socket directory: {0}")]
    Watch(#[from] std::io::Error),
    #[error(
        "{LISTENER} links to '{0}', which is not in its own directory (only a relative link to a sibling is accepted)"
    )]
    LinkOutside(PathBuf),
    #[error("{LISTENER} links to '{0}', which is not there")]
    Dangling(PathBuf),
    #[error("{LISTENER} is not a socket")]
    NotASocket,
}

/// A watch on one container's socket directory, set up before the container starts.
pub struct ListenerWatch {
    events: EventStream<Vec<u8>>,
    listener: PathBuf,
}

impl ListenerWatch {
    pub fn on(dir: &Path) -> Result<Self, ListenerError> {
        let inotify = Inotify::init()?;
        inotify.watches().add(dir, WatchMask::CREATE | WatchMask::MOVED_TO)?;
        Ok(ListenerWatch { events: inotify.into_event_stream(vec![0u8; 4096])?, listener: dir.join(LISTENER) })
    }

    /// The listener's path once it appears and fits the rule; bounded by the caller.
    pub async fn ready(mut self) -> Result<PathBuf, ListenerError> {
        // Whatever came before the watch (nothing, in a fresh directory).
        if self.listener.symlink_metadata().is_ok() {
            return check(&self.listener).map(|()| self.listener);
        }
        while let Some(event) = self.events.next().await {
            if event?.name.is_some_and(|name| name == LISTENER) {
                return check(&self.listener).map(|()| self.listener);
            }
        }
        Err(ListenerError::Watch(std::io::Error::other("the watch ended")))
    }
}

/// Fn's `checkSocketDestination`: a socket, or a link whose target is a bare name (a sibling)
/// that is a socket.
pub fn check(listener: &Path) -> Result<(), ListenerError> {
    let meta = listener.symlink_metadata()?;
    if meta.file_type().is_symlink() {
        let target = std::fs::read_link(listener)?;
        let mut names = target.components().filter(|c| *c != Component::CurDir);
        if !matches!((names.next(), names.next()), (Some(Component::Normal(_)), None)) {
            return Err(ListenerError::LinkOutside(target));
        }
        let followed = listener.metadata().map_err(|_| ListenerError::Dangling(target))?;
        if !followed.file_type().is_socket() {
            return Err(ListenerError::NotASocket);
        }
    } else if !meta.file_type().is_socket() {
        return Err(ListenerError::NotASocket);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use std::os::unix::net::UnixListener;
    use std::time::Duration;

    async fn bounded<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(5), f).await.expect("the watch answered")
    }

    #[tokio::test]
    async fn a_relative_link_to_a_sibling_socket_made_after_the_watch_is_ready() {
        let dir = tempfile::tempdir().unwrap();
        let watch = ListenerWatch::on(dir.path()).unwrap();
        let path = dir.path().to_path_buf();
        let maker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            let socket = UnixListener::bind(path.join("phonylsnr.sock")).unwrap();
            symlink("phonylsnr.sock", path.join(LISTENER)).unwrap();
            socket
        });
        let ready = bounded(watch.ready()).await.unwrap();
        assert_eq!(ready, dir.path().join(LISTENER));
        drop(maker.join());
    }

    #[tokio::test]
    async fn an_absolute_or_dangling_link_or_a_plain_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let _socket = UnixListener::bind(dir.path().join("phony")).unwrap();
        let watch = ListenerWatch::on(dir.path()).unwrap();
        symlink(dir.path().join("phony"), dir.path().join(LISTENER)).unwrap();
        assert!(matches!(bounded(watch.ready()).await, Err(ListenerError::LinkOutside(_))));

        let dir = tempfile::tempdir().unwrap();
        symlink("../elsewhere/phony", dir.path().join(LISTENER)).unwrap();
        assert!(matches!(check(&dir.path().join(LISTENER)), Err(ListenerError::LinkOutside(_))));
        let dir = tempfile::tempdir().unwrap();
        symlink("./phony", dir.path().join(LISTENER)).unwrap();
        assert!(matches!(check(&dir.path().join(LISTENER)), Err(ListenerError::Dangling(_))));
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(LISTENER), "").unwrap();
        assert!(matches!(check(&dir.path().join(LISTENER)), Err(ListenerError::NotASocket)));
        let dir = tempfile::tempdir().unwrap();
        let _socket = UnixListener::bind(dir.path().join(LISTENER)).unwrap();
        assert!(check(&dir.path().join(LISTENER)).is_ok(), "a socket itself");
    }
}
