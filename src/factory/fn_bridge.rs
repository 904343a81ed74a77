//! `invoker fn-bridge`: an Fn function's unix socket offered on TCP, from a container beside the
//! function in its pod. An FDK serves Fn's http-stream contract on `lsnr.sock` in a directory it
//! shares with its agent; on Kubernetes the invoker is on another machine, so the pod carries
//! this bridge, sharing that directory (an `emptyDir`). It applies Fn's readiness rule
//! ([`ListenerWatch`]) and only then listens, so the pod is Ready exactly when the function is;
//! a listener that breaks the rule, or none within `start_timeout`, ends it with the reason as
//! its last line (the pod's termination message). Then each TCP connection is spliced to a
//! connection of its own to the socket, bytes both ways: HTTP, deadlines and errors stay the
//! invoker's, as with a socket it reaches itself.

use invoker_factory::fn_socket::ListenerWatch;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct FnBridgeArgs {
    /// The socket directory the function shares (Fn's `/tmp/iofs`).
    #[arg(long)]
    pub dir: PathBuf,
    /// Where the invoker reaches the function (the pod's IP and port).
    #[arg(long)]
    pub listen: SocketAddr,
    /// The function must make its listener within this.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    pub start_timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum BridgeError {
    #[error("the function's socket: {0}")]
    Listener(#[from] invoker_factory::fn_socket::ListenerError),
    #[error("the function made no listener within {0:?}")]
    NotReady(Duration),
    #[error("listening on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
}

/// Waits for the function's listener, then bridges until the process is stopped.
pub async fn run(args: FnBridgeArgs) -> Result<(), BridgeError> {
    let watch = ListenerWatch::on(&args.dir)?;
    let listener = tokio::time::timeout(args.start_timeout, watch.ready())
        .await
        .map_err(|_| BridgeError::NotReady(args.start_timeout))??;
    let tcp = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|source| BridgeError::Listen { addr: args.listen, source })?;
    eprintln!("the function is ready: {} on {}", listener.path().display(), args.listen);
    let listener = std::sync::Arc::new(listener);
    loop {
        match tcp.accept().await {
            Ok((conn, _)) => {
                tokio::spawn(splice(conn, listener.clone()));
            }
            // Out of descriptors, say: a pause rather than a spin until some are given back.
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
}

/// One connection, both ways, until either side closes; a function that no longer accepts
/// closes the caller's connection at once.
async fn splice(mut conn: tokio::net::TcpStream, listener: std::sync::Arc<invoker_factory::peer::ContainerSocket>) {
    let _ = conn.set_nodelay(true);
    let Ok(mut function) = listener.connect().await else { return };
    let _ = tokio::io::copy_bidirectional(&mut conn, &mut function).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    fn free_port() -> SocketAddr {
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
    }

    #[tokio::test]
    async fn it_listens_once_the_function_is_ready_and_splices_each_connection() {
        let dir = tempfile::tempdir().unwrap();
        let listen = free_port();
        let bridge = tokio::spawn(run(FnBridgeArgs {
            dir: dir.path().to_path_buf(),
            listen,
            start_timeout: Duration::from_secs(5),
        }));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(tokio::net::TcpStream::connect(listen).await.is_err(), "not listening before the function is");
        // An FDK's way: a phony socket, then a relative link to it.
        let function = tokio::net::UnixListener::bind(dir.path().join("phony.sock")).unwrap();
        symlink("phony.sock", dir.path().join("lsnr.sock")).unwrap();
        let echo = tokio::spawn(async move {
            for _ in 0..2 {
                let (mut s, _) = function.accept().await.unwrap();
                let mut buf = [0u8; 5];
                s.read_exact(&mut buf).await.unwrap();
                s.write_all(&buf.to_ascii_uppercase()).await.unwrap();
            }
        });
        for word in [b"hello", b"again"] {
            let mut conn = loop {
                match tokio::net::TcpStream::connect(listen).await {
                    Ok(c) => break c,
                    Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            };
            conn.write_all(word).await.unwrap();
            let mut back = [0u8; 5];
            conn.read_exact(&mut back).await.unwrap();
            assert_eq!(back.to_vec(), word.to_ascii_uppercase());
        }
        echo.await.unwrap();
        bridge.abort();
    }

    #[tokio::test]
    async fn an_absolute_link_or_no_listener_ends_it_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let _phony = std::os::unix::net::UnixListener::bind(dir.path().join("phony.sock")).unwrap();
        let args =
            FnBridgeArgs { dir: dir.path().to_path_buf(), listen: free_port(), start_timeout: Duration::from_secs(5) };
        let bridge = tokio::spawn(run(args));
        tokio::time::sleep(Duration::from_millis(50)).await;
        symlink(dir.path().join("phony.sock"), dir.path().join("lsnr.sock")).unwrap();
        let error = bridge.await.unwrap().unwrap_err();
        assert!(error.to_string().contains("not in its own directory"), "{error}");

        let empty = tempfile::tempdir().unwrap();
        let args = FnBridgeArgs {
            dir: empty.path().to_path_buf(),
            listen: free_port(),
            start_timeout: Duration::from_millis(200),
        };
        let error = run(args).await.unwrap_err();
        assert!(matches!(error, BridgeError::NotReady(_)), "{error}");
    }
}
