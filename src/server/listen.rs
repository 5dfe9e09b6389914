//! The connection layer: accepting TCP connections under a cap, serving each with hyper under a
//! header-read timer, and a graceful shutdown that waits a bounded time.
//!
//! `axum::serve` has neither a header-read timer nor a cap, so a client that sends nothing (or its
//! headers a byte at a time) held a socket forever and enough of them exhausted the file
//! descriptors. hyper's `header_read_timeout` runs from the moment a connection is ready to read a
//! request head, which covers a new connection that sends nothing, a slowly sent head, and an
//! idle keep-alive connection between requests.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// Connection limits (see `ServeOptions`).
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    pub header_timeout: Duration,
    pub shutdown_timeout: Duration,
}

/// Refusals being written at once.
const MAX_REFUSING: usize = 32;

/// How long the accept loop waits for a refusal to end before closing a connection unanswered.
const REFUSAL_WAIT: Duration = Duration::from_millis(200);

/// How long a refusal waits for the rest of a request the client already sent.
const REFUSAL_DRAIN: Duration = Duration::from_millis(50);

/// File descriptors kept free beside the connections: refusals, the model file, stdio, the
/// runtime's own.
pub const FD_RESERVE: usize = MAX_REFUSING + 32;

/// Open connections (for `/health`).
pub struct ConnCount {
    open: Arc<Semaphore>,
    max: usize,
}

impl ConnCount {
    pub fn new(max: usize) -> ConnCount {
        ConnCount {
            open: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    pub fn open(&self) -> usize {
        self.max - self.open.available_permits()
    }
}

/// Serve `app` on `listener` until `stop` resolves; then stop accepting, let open connections
/// finish (idle ones close at once) for at most `shutdown_timeout`, and return.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnLimits,
    conns: &ConnCount,
    stop: impl Future<Output = ()>,
) {
    let graceful = GracefulShutdown::new();
    let refusing = Arc::new(Semaphore::new(MAX_REFUSING));
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout);
    tokio::pin!(stop);
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    // Out of file descriptors (EMFILE) and the like: wait for some to be freed
                    // rather than spin; nothing here is fatal to the server.
                    eprintln!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let Ok(permit) = Arc::clone(&conns.open).try_acquire_owned() else {
            // Refusals are quick; when many are under way, wait a moment for one to end (new
            // connections queue in the listen backlog meanwhile) before just closing this one.
            let wait = tokio::time::timeout(REFUSAL_WAIT, Arc::clone(&refusing).acquire_owned()).await;
            if let Ok(Ok(p)) = wait {
                tokio::spawn(async move {
                    refuse(stream).await;
                    drop(p);
                });
            }
            continue;
        };
        let _ = stream.set_nodelay(true);
        let conn = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(limits.shutdown_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        eprintln!(
            "connections still open after {:.1} s; closing them",
            limits.shutdown_timeout.as_secs_f64()
        );
    }
}

/// Tell a connection over the cap why it is closed: a 503 with `Connection: close`, then a short
/// read of whatever request it sent (closing a socket with unread input resets it, and the reset
/// can destroy the response before the client reads it). Bounded in time and bytes: a client
/// that sends nothing more is closed after `REFUSAL_DRAIN`.
async fn refuse(mut stream: TcpStream) {
    const BODY: &str = r#"{"error":{"message":"the server has too many open connections; retry later","type":"server_error","param":null,"code":"too_many_connections"}}"#;
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n{BODY}",
        BODY.len()
    );
    let written = tokio::time::timeout(Duration::from_millis(500), async {
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await
    })
    .await;
    if !matches!(written, Ok(Ok(()))) {
        return;
    }
    let _ = tokio::time::timeout(REFUSAL_DRAIN, async {
        let mut buf = [0u8; 4096];
        let mut left = 64usize << 10;
        while left > 0 {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            left = left.saturating_sub(n);
        }
        Ok::<(), std::io::Error>(())
    })
    .await;
}

/// Raise the soft open-file limit to the hard one and return it (`None` where unknown).
#[cfg(unix)]
pub fn raise_fd_limit() -> Option<usize> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return None;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
    }
    usize::try_from(lim.rlim_cur).ok()
}

#[cfg(not(unix))]
pub fn raise_fd_limit() -> Option<usize> {
    None
}
