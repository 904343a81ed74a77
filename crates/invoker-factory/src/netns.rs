//! Connections into a container's own network namespace, for runtimes that listen on a port
//! of their own loopback (OpenWhisk's images and runtimes serve on `:8080`) and must not get a
//! bridge, an iptables rule or a host port.
//!
//! A socket belongs to the network namespace it was created in, whichever thread later uses
//! it. So a short-lived thread enters the container's namespace (`setns`), creates an unbound
//! TCP socket and hands it back; the connect to `127.0.0.1:<port>` and every byte after run on
//! the invoker's own threads as on any socket. The thread is a fresh one each time and ends
//! right after: `setns` changes the calling thread only, and no thread of the invoker's pools
//! may ever be left in a container's namespace.

use nix::sched::CloneFlags;
use std::fs::File;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt as _;

/// A container's network namespace, held open: it stays the same namespace however long the
/// handle lives (no pid to be reused), and a container that is gone only refuses connections.
pub struct NetNs {
    file: File,
    inode: u64,
}

impl std::fmt::Debug for NetNs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "net:[{}]", self.inode)
    }
}

impl PartialEq for NetNs {
    fn eq(&self, other: &Self) -> bool {
        self.inode == other.inode
    }
}

impl Eq for NetNs {}

impl NetNs {
    /// The network namespace process `pid` is in now.
    pub fn of_process(pid: u32) -> io::Result<NetNs> {
        let file = File::open(format!("/proc/{pid}/ns/net"))?;
        let inode = file.metadata()?.ino();
        Ok(NetNs { file, inode })
    }

    /// True when this is the invoker's own namespace (a sandbox that has not unshared yet).
    pub fn is_invokers(&self) -> bool {
        std::fs::metadata("/proc/self/ns/net").is_ok_and(|m| m.ino() == self.inode)
    }

    /// A TCP connection to `127.0.0.1:port` inside the namespace.
    pub async fn connect(&self, port: u16) -> io::Result<tokio::net::TcpStream> {
        let socket = self.socket()?;
        let socket = tokio::net::TcpSocket::from_std_stream(socket.into());
        let stream = socket.connect(SocketAddr::from(([127, 0, 0, 1], port))).await?;
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }

    /// A non-blocking, unconnected TCP socket created inside the namespace.
    fn socket(&self) -> io::Result<socket2::Socket> {
        let file = self.file.try_clone()?;
        let made = std::thread::Builder::new().name("netns-socket".into()).spawn(move || {
            nix::sched::setns(&file, CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
            let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
            socket.set_nonblocking(true)?;
            Ok::<_, io::Error>(socket)
        })?;
        // Creating a socket blocks for microseconds; not worth a wake-up across threads.
        made.join().map_err(|_| io::Error::other("the namespace thread panicked"))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_invokers_own_namespace_is_recognised() {
        let own = NetNs::of_process(std::process::id()).unwrap();
        assert!(own.is_invokers());
        assert_eq!(own, NetNs::of_process(std::process::id()).unwrap());
    }

    #[tokio::test]
    async fn a_socket_made_in_the_own_namespace_connects_like_any() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let own = NetNs::of_process(std::process::id()).unwrap();
        let (connected, accepted) = tokio::join!(own.connect(port), listener.accept());
        assert_eq!(connected.unwrap().local_addr().unwrap(), accepted.unwrap().1);
    }
}
