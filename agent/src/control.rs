//! The local control API: HTTP on a Unix socket (mode 0600) in the data dir. The CLI
//! (`shoal members`) and the test harness read the node's view through it; only local root (or
//! the data dir's owner) can reach it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use shoal_gossip::{Member, Membership};

/// Who this agent is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SelfInfo {
    pub node_id: String,
    pub name: String,
    pub generation: u64,
    pub gossip_addr: std::net::SocketAddr,
    pub cluster_id: String,
    pub agent_version: String,
    pub pid: u32,
}

#[derive(Clone)]
struct ControlState {
    membership: Arc<Membership>,
    self_info: Arc<SelfInfo>,
}

pub fn router(membership: Arc<Membership>, self_info: SelfInfo) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/v1/self", get(self_info_handler))
        .route("/v1/members", get(members_handler))
        .with_state(ControlState {
            membership,
            self_info: Arc::new(self_info),
        })
}

async fn self_info_handler(State(state): State<ControlState>) -> Json<SelfInfo> {
    Json((*state.self_info).clone())
}

async fn members_handler(State(state): State<ControlState>) -> Json<Vec<Member>> {
    Json(state.membership.members().await)
}

/// A bound control socket; the file is removed when this is dropped.
pub struct ControlSocket {
    path: PathBuf,
    listener: Option<tokio::net::UnixListener>,
}

impl ControlSocket {
    /// Binds `path`, replacing a stale socket left by a crashed agent (the caller holds the
    /// data-dir lock, so no live agent owns it).
    pub fn bind(path: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::PermissionsExt;
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = tokio::net::UnixListener::bind(path)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        Ok(Self {
            path: path.to_owned(),
            listener: Some(listener),
        })
    }

    /// Serves `router` until `shutdown` completes.
    pub async fn serve(
        mut self,
        router: Router,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let listener = self.listener.take().expect("serve is called once");
        axum::serve(listener, router)
            .with_graceful_shutdown(shutdown)
            .await
    }
}

impl Drop for ControlSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
