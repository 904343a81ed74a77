//! A TCP path that a test can cut: a forwarder on a loopback port in front of one address
//! (etcd, for one process only), so that a partition between two processes can be made while
//! every other path stays. Cut, it forwards nothing and closes nothing, as a network that drops
//! packets: connections made meanwhile are taken and left hanging, and those open stop moving.
//! Healed, new connections go through again and the ones held through the cut are closed.

use std::sync::Arc;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Partition {
    port: u16,
    /// true while cut; every connection's copy loop watches it.
    cut: watch::Sender<bool>,
    /// Bumped at each heal: a connection made before it ends.
    epoch: watch::Sender<u64>,
    _task: tokio::task::JoinHandle<()>,
}

impl Partition {
    /// A path to `target` (`host:port`), open.
    pub async fn to(target: &str) -> Partition {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (cut, _) = watch::channel(false);
        let (epoch, _) = watch::channel(0u64);
        let (cut_rx, epoch_rx) = (cut.subscribe(), epoch.subscribe());
        let target: Arc<str> = target.into();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (cut, epoch, target) = (cut_rx.clone(), epoch_rx.clone(), target.clone());
                tokio::spawn(carry(client, target, cut, epoch));
            }
        });
        Partition { port, cut, epoch, _task: task }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    pub fn heal(&self) {
        self.epoch.send_modify(|e| *e += 1);
        self.cut.send_replace(false);
    }
}

/// Copies both ways while the path is open; holds still while it is cut; ends at a heal that
/// came after it started.
async fn carry(
    mut client: TcpStream,
    target: Arc<str>,
    mut cut: watch::Receiver<bool>,
    mut epoch: watch::Receiver<u64>,
) {
    let born = *epoch.borrow_and_update();
    let healed = async move {
        while epoch.changed().await.is_ok() {
            if *epoch.borrow() != born {
                return;
            }
        }
        std::future::pending::<()>().await
    };
    tokio::pin!(healed);
    if *cut.borrow() {
        // Made while cut: taken and left hanging until the heal.
        healed.await;
        return;
    }
    let Ok(mut server) = TcpStream::connect(&*target).await else { return };
    let (mut client_read, mut client_write) = client.split();
    let (mut server_read, mut server_write) = server.split();
    let mut up = [0u8; 16 * 1024];
    let mut down = [0u8; 16 * 1024];
    loop {
        use tokio::io::AsyncReadExt;
        // While cut, nothing is read, so nothing moves either way.
        let open = async {
            while *cut.borrow_and_update() {
                if cut.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::select! {
            _ = &mut healed => return,
            _ = open => {}
        }
        tokio::select! {
            _ = &mut healed => return,
            _ = cut.changed() => continue,
            n = client_read.read(&mut up) => match n {
                Ok(n) if n > 0 => if server_write.write_all(&up[..n]).await.is_err() { return },
                _ => return,
            },
            n = server_read.read(&mut down) => match n {
                Ok(n) if n > 0 => if client_write.write_all(&down[..n]).await.is_err() { return },
                _ => return,
            },
        }
    }
}
