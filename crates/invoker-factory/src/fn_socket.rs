//! Fn's readiness rule for an http-stream container, as Fn's agent applies it: the function
//! is ready when `lsnr.sock` appears in its socket directory as a socket, or as a *relative*
//! symlink to a socket in that same directory (the FDKs bind a phony socket, serve on it, then
//! link the listener to it). The directory is watched with inotify from before the container
//! starts, so the creation is never missed and nothing polls.
//!
//! The directory is the function's to write, so the rule is checked without following anything
//! (one link to a sibling that is itself a socket: never a chain), and what was verified is what
//! the invoker connects to from then on: the sibling, in the directory opened before the
//! function started ([`ContainerSocket`]), whatever the function does to `lsnr.sock` later.

use super::peer::ContainerSocket;
use futures_util::StreamExt;
use inotify::{EventStream, Inotify, WatchMask};
use invoker_wire::runtime::FN_LISTENER as LISTENER;
use nix::sys::stat::SFlag;
use std::ffi::OsStr;
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
    #[error("{LISTENER} links to '{0}', which is not a socket itself (a chain of links is refused)")]
    Chain(PathBuf),
}

/// A watch on one container's socket directory, set up before the container starts.
pub struct ListenerWatch {
    events: EventStream<Vec<u8>>,
    dir: ContainerSocket,
}

impl ListenerWatch {
    /// Opens `dir` and watches it: call before the function can touch it.
    pub fn on(dir: &Path) -> Result<Self, ListenerError> {
        let inotify = Inotify::init()?;
        inotify.watches().add(dir, WatchMask::CREATE | WatchMask::MOVED_TO)?;
        let dir = ContainerSocket::in_dir(dir, LISTENER)?;
        Ok(ListenerWatch { events: inotify.into_event_stream(vec![0u8; 4096])?, dir })
    }

    /// The socket to connect to once the listener appears and fits the rule; bounded by the
    /// caller.
    pub async fn ready(mut self) -> Result<ContainerSocket, ListenerError> {
        // Whatever came before the watch (nothing, in a fresh directory).
        if self.dir.kind_of(OsStr::new(LISTENER)).is_ok() {
            return check(&self.dir);
        }
        while let Some(event) = self.events.next().await {
            if event?.name.is_some_and(|name| name == LISTENER) {
                return check(&self.dir);
            }
        }
        Err(ListenerError::Watch(std::io::Error::other("the watch ended")))
    }
}

/// Fn's `checkSocketDestination`, on the directory as opened: `lsnr.sock` is a socket, or a
/// link whose target is a bare name (a sibling) that is a socket itself, not another link.
/// Returns the socket that was verified.
pub fn check(dir: &ContainerSocket) -> Result<ContainerSocket, ListenerError> {
    let listener = OsStr::new(LISTENER);
    match dir.kind_of(listener)? {
        SFlag::S_IFSOCK => Ok(dir.sibling(listener)),
        SFlag::S_IFLNK => {
            let target = dir.link_target(listener)?;
            let mut names = target.components().filter(|c| *c != Component::CurDir);
            let (Some(Component::Normal(sibling)), None) = (names.next(), names.next()) else {
                return Err(ListenerError::LinkOutside(target));
            };
            match dir.kind_of(sibling) {
                Ok(SFlag::S_IFSOCK) => Ok(dir.sibling(sibling)),
                Ok(SFlag::S_IFLNK) => Err(ListenerError::Chain(target)),
                Ok(_) => Err(ListenerError::NotASocket),
                Err(_) => Err(ListenerError::Dangling(target)),
            }
        }
        _ => Err(ListenerError::NotASocket),
    }
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

    fn checked(dir: &Path) -> Result<ContainerSocket, ListenerError> {
        check(&ContainerSocket::in_dir(dir, LISTENER).unwrap())
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
        assert_eq!(ready.path(), dir.path().join("phonylsnr.sock"), "the sibling that was verified");
        drop(maker.join());
    }

    #[tokio::test]
    async fn an_absolute_or_dangling_or_chained_link_or_a_plain_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let _socket = UnixListener::bind(dir.path().join("phony")).unwrap();
        let watch = ListenerWatch::on(dir.path()).unwrap();
        symlink(dir.path().join("phony"), dir.path().join(LISTENER)).unwrap();
        assert!(matches!(bounded(watch.ready()).await, Err(ListenerError::LinkOutside(_))));

        let dir = tempfile::tempdir().unwrap();
        symlink("../elsewhere/phony", dir.path().join(LISTENER)).unwrap();
        assert!(matches!(checked(dir.path()), Err(ListenerError::LinkOutside(_))));
        let dir = tempfile::tempdir().unwrap();
        symlink("./phony", dir.path().join(LISTENER)).unwrap();
        assert!(matches!(checked(dir.path()), Err(ListenerError::Dangling(_))));
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(LISTENER), "").unwrap();
        assert!(matches!(checked(dir.path()), Err(ListenerError::NotASocket)));
        let dir = tempfile::tempdir().unwrap();
        let _socket = UnixListener::bind(dir.path().join(LISTENER)).unwrap();
        assert!(checked(dir.path()).is_ok(), "a socket itself");

        // lsnr.sock -> phony.sock -> another tenant's socket: each link alone looks harmless.
        let (dir, elsewhere) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let _theirs = UnixListener::bind(elsewhere.path().join("lsnr.sock")).unwrap();
        symlink(elsewhere.path().join("lsnr.sock"), dir.path().join("phony.sock")).unwrap();
        symlink("phony.sock", dir.path().join(LISTENER)).unwrap();
        assert!(matches!(checked(dir.path()), Err(ListenerError::Chain(_))));
    }

    #[tokio::test]
    async fn a_listener_swapped_after_it_was_verified_is_not_followed() {
        let (dir, elsewhere) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let _mine = UnixListener::bind(dir.path().join("phony.sock")).unwrap();
        symlink("phony.sock", dir.path().join(LISTENER)).unwrap();
        let verified = checked(dir.path()).unwrap();
        let theirs = UnixListener::bind(elsewhere.path().join("lsnr.sock")).unwrap();
        std::fs::remove_file(dir.path().join(LISTENER)).unwrap();
        symlink(elsewhere.path().join("lsnr.sock"), dir.path().join(LISTENER)).unwrap();
        let _stream = verified.connect().await.unwrap();
        theirs.set_nonblocking(true).unwrap();
        assert!(theirs.accept().is_err(), "the other tenant's socket got no connection");
    }
}
