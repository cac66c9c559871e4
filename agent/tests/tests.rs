//! Integration tests of the `shoal` binary: real processes, real QUIC with mutual TLS on
//! 127.0.0.1, queried through the real control socket.

mod api;
mod cli;
mod membership;
mod pods;
mod runtime;
mod scheduling;
mod state;

use std::path::{Path, PathBuf};

use shoal_chaos::testkit::{AgentProcess, AgentSpec, init_secret};

pub fn shoal_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_shoal"))
}

/// A temporary directory holding one cluster's secret and its agents' data dirs.
pub struct Lab {
    pub root: tempfile::TempDir,
    pub secret: PathBuf,
}

impl Lab {
    /// A fresh cluster secret in a fresh temporary directory.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        let root = tempfile::tempdir().expect("tempdir");
        let secret = root.path().join("cluster.secret");
        init_secret(&shoal_binary(), &secret).expect("shoal init");
        Self { root, secret }
    }

    pub fn spec(&self, name: &str) -> AgentSpec {
        AgentSpec::new(&shoal_binary(), self.root.path(), name, &self.secret)
    }

    pub fn path(&self) -> &Path {
        self.root.path()
    }

    /// Starts `n` agents named n0..n{n-1}, all joining through n0.
    pub async fn start_cluster(&self, n: usize) -> Vec<AgentProcess> {
        let seed = AgentProcess::start(self.spec("n0"))
            .await
            .expect("seed starts");
        let seed_addr = seed.gossip_addr();
        let mut agents = vec![seed];
        for i in 1..n {
            let agent = AgentProcess::start(self.spec(&format!("n{i}")).join(seed_addr))
                .await
                .expect("agent starts");
            agents.push(agent);
        }
        agents
    }
}
