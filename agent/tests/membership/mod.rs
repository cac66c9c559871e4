//! Membership and failure detection across real agent processes.

use std::time::Duration;

use shoal_chaos::testkit::{AgentProcess, alive_count, state_of, wait_until};
use shoal_gossip::MemberState;

use crate::Lab;

const CONVERGE: Duration = Duration::from_secs(20);

async fn all_see_alive(agents: &[AgentProcess], n: usize) {
    for agent in agents {
        wait_until(
            &format!("{} to see {n} alive members", agent.name()),
            CONVERGE,
            || async { alive_count(agent).await == n },
        )
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{e}\nmembers: {:?}\nlog:\n{}",
                agent.members_blocking(),
                agent.log()
            )
        });
    }
}

async fn all_see(agents: &[&AgentProcess], name: &str, state: MemberState) {
    for agent in agents {
        wait_until(
            &format!("{} to see {name} {state}", agent.name()),
            CONVERGE,
            || async { state_of(agent, name).await.map(|s| s.0) == Some(state) },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}\nlog:\n{}", agent.log()));
    }
}

trait BlockingMembers {
    fn members_blocking(&self) -> String;
}

impl BlockingMembers for AgentProcess {
    fn members_blocking(&self) -> String {
        let out = std::process::Command::new(crate::shoal_binary())
            .args(["members", "--data-dir"])
            .arg(self.data_dir())
            .output()
            .expect("shoal members runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_agents_join_through_one_seed() {
    let lab = Lab::new();
    let agents = lab.start_cluster(5).await;
    all_see_alive(&agents, 5).await;
    // Every agent knows every other one's metadata, with the well-known labels.
    for agent in &agents {
        let members = agent.members().await.unwrap();
        let mut names: Vec<&str> = members.iter().map(|m| m.name()).collect();
        names.sort();
        assert_eq!(names, ["n0", "n1", "n2", "n3", "n4"]);
        for m in &members {
            let meta = m.meta.as_ref().expect("metadata gossiped");
            assert_eq!(meta.labels["kubernetes.io/hostname"], meta.name);
            assert!(meta.capacity.cpu_millis >= 1000);
        }
        assert_eq!(members.iter().filter(|m| m.is_self).count(), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_agent_is_seen_dead_and_rejoins_with_a_higher_generation() {
    let lab = Lab::new();
    let mut agents = lab.start_cluster(4).await;
    all_see_alive(&agents, 4).await;
    let mut victim = agents.pop().unwrap();
    let before = victim.generation();
    victim.kill().unwrap();
    all_see(&agents.iter().collect::<Vec<_>>(), "n3", MemberState::Dead).await;

    victim.restart().await.unwrap();
    assert!(
        victim.generation() > before,
        "generation must grow across restarts"
    );
    agents.push(victim);
    all_see_alive(&agents, 4).await;
    for agent in &agents {
        let (_, generation) = state_of(agent, "n3").await.unwrap();
        assert_eq!(
            generation,
            before + 1,
            "{} sees the new generation",
            agent.name()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_agent_is_seen_dead_then_alive_after_continue() {
    let lab = Lab::new();
    let agents = lab.start_cluster(4).await;
    all_see_alive(&agents, 4).await;
    let (victim, others) = agents.split_last().unwrap();
    victim.pause().unwrap();
    all_see(&others.iter().collect::<Vec<_>>(), "n3", MemberState::Dead).await;
    victim.resume().unwrap();
    all_see_alive(&agents, 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_with_another_secret_never_gets_in() {
    let lab = Lab::new();
    let agents = lab.start_cluster(3).await;
    all_see_alive(&agents, 3).await;

    let strangers = Lab::new();
    let stranger = AgentProcess::start(strangers.spec("intruder").join(agents[0].gossip_addr()))
        .await
        .unwrap();
    // Evidence that the intruder tried, not a pause: the seed refused its handshake again and
    // again (it retries every gossip round, 200 ms).
    wait_until(
        "the seed to refuse the intruder 5 times",
        Duration::from_secs(30),
        || async {
            agents[0]
                .store_info()
                .await
                .is_ok_and(|info| info.handshakes_refused >= 5)
        },
    )
    .await
    .unwrap();
    for agent in &agents {
        let members = agent.members().await.unwrap();
        assert_eq!(members.len(), 3, "{}: {members:?}", agent.name());
        assert!(members.iter().all(|m| m.name() != "intruder"));
    }
    let seen = stranger.members().await.unwrap();
    assert_eq!(seen.len(), 1, "the intruder learned nothing: {seen:?}");
    assert!(seen[0].is_self);
    // The refusal is logged with the intruder's address.
    let addr = stranger.gossip_addr().to_string();
    wait_until(
        "the seed to log the refusal",
        Duration::from_secs(5),
        || async {
            agents[0]
                .log()
                .lines()
                .any(|l| l.contains("refused peer") && l.contains(&addr))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\nlog:\n{}", agents[0].log()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_outlives_its_seed_and_accepts_joins_through_a_survivor() {
    let lab = Lab::new();
    let mut agents = lab.start_cluster(4).await;
    all_see_alive(&agents, 4).await;
    let mut seed = agents.remove(0);
    seed.kill().unwrap();
    all_see(&agents.iter().collect::<Vec<_>>(), "n0", MemberState::Dead).await;
    all_see_alive(&agents, 3).await;

    let late = AgentProcess::start(lab.spec("late").join(agents[2].gossip_addr()))
        .await
        .unwrap();
    agents.push(late);
    all_see_alive(&agents, 4).await;
    for agent in &agents {
        assert_eq!(
            state_of(agent, "late").await.map(|s| s.0),
            Some(MemberState::Alive)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_shuts_down_cleanly_and_a_data_dir_serves_one_agent() {
    let lab = Lab::new();
    let mut agents = lab.start_cluster(1).await;
    let agent = &mut agents[0];
    // A second agent on the same data dir is refused with a clear error.
    let out = std::process::Command::new(crate::shoal_binary())
        .args([
            "agent",
            "--name",
            "dup",
            "--bind",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(agent.data_dir())
        .arg("--secret-file")
        .arg(&lab.secret)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("another agent is running"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = agent.terminate().unwrap();
    assert!(status.success(), "exit status {status}\n{}", agent.log());
    assert!(
        !agent.data_dir().join("shoal.sock").exists(),
        "control socket removed"
    );
}

/// Issue #13, hole 7: a second agent under a name a live node holds is refused, saying which
/// node holds it (two Nodes of one name would confuse the API and scheduling).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_node_with_a_live_nodes_name_is_refused() {
    let lab = Lab::new();
    let agents = lab.start_cluster(2).await;
    all_see_alive(&agents, 2).await;
    let other_dir = lab.path().join("impostor");
    let mut child = std::process::Command::new(crate::shoal_binary())
        .args([
            "agent",
            "--name",
            "n1",
            "--no-runtime",
            "--bind",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(&other_dir)
        .arg("--secret-file")
        .arg(&lab.secret)
        .args(["--join", &agents[0].gossip_addr().to_string()])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + CONVERGE;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            break None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    let _ = child.wait();
    let status = status.unwrap_or_else(|| panic!("the impostor kept running: {stderr}"));
    assert!(!status.success());
    assert!(
        stderr.contains("name \"n1\" is already held by live node"),
        "{stderr}"
    );
    // The real n1 is untouched.
    all_see_alive(&agents, 2).await;
}

/// `shoal baseline [--set N]` on `agent`: its output, or its error.
fn baseline(agent: &AgentProcess, set: Option<u64>) -> Result<String, String> {
    let mut command = std::process::Command::new(crate::shoal_binary());
    command
        .args(["baseline", "--data-dir"])
        .arg(agent.data_dir());
    if let Some(n) = set {
        command.args(["--set", &n.to_string()]);
    }
    let out = command.output().expect("shoal baseline runs");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_lowers_the_baseline_once_a_node_is_gone_and_it_persists() {
    let lab = Lab::new();
    // Dead members are forgotten 2 s after they are declared dead.
    let config = lab.path().join("agent.toml");
    std::fs::write(&config, "[gossip]\ndead-node-grace-period = \"2s\"\n").unwrap();
    let spec = |name: &str| {
        lab.spec(name)
            .arg("--config")
            .arg(config.to_string_lossy().into_owned())
    };
    let n0 = AgentProcess::start(spec("n0")).await.unwrap();
    let mut agents = vec![n0];
    for name in ["n1", "n2"] {
        let agent = AgentProcess::start(spec(name).join(agents[0].gossip_addr()))
            .await
            .unwrap();
        agents.push(agent);
    }
    all_see_alive(&agents, 3).await;
    let shown = baseline(&agents[0], None).unwrap();
    assert!(
        shown.starts_with("baseline: 3 nodes (a majority is 2)"),
        "{shown}"
    );

    // n2 is gone for good: once n0 and n1 forgot it, the operator lowers their baselines.
    let mut gone = agents.pop().unwrap();
    gone.kill().unwrap();
    for agent in &agents {
        wait_until("n2 forgotten", Duration::from_secs(30), || async {
            agent
                .members()
                .await
                .is_ok_and(|m| m.iter().all(|m| m.name() != "n2"))
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.log()));
    }
    let refused = baseline(&agents[0], Some(1)).unwrap_err();
    assert!(
        refused.contains("members: 1 is below the 2 nodes the membership still lists (n0, n1)"),
        "{refused}"
    );
    for agent in &agents {
        let set = baseline(agent, Some(2)).unwrap();
        assert!(
            set.starts_with("baseline: 2 nodes (a majority is 2)"),
            "{set}"
        );
    }
    // It persists across a restart (two nodes listed do not raise it)...
    agents[0].terminate().unwrap();
    agents[0].restart().await.unwrap();
    all_see_alive(&agents, 2).await;
    let shown = baseline(&agents[0], None).unwrap();
    assert!(shown.starts_with("baseline: 2 nodes"), "{shown}");
    // ...and a third node known again raises it by itself.
    gone.restart().await.unwrap();
    agents.push(gone);
    all_see_alive(&agents, 3).await;
    for agent in &agents[..2] {
        let shown = baseline(agent, None).unwrap();
        assert!(
            shown.starts_with("baseline: 3 nodes"),
            "{}: {shown}",
            agent.name()
        );
    }
}
