//! `shoal`: the agent binary and its command-line client.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use serde::Deserialize;
use serde_json::Value;
use shoal_agent::client::ControlClient;
use shoal_agent::config::{AgentConfig, AgentFlags};
use shoal_agent::control::{ApiError, KubeconfigInfo};
use shoal_gossip::{ClusterSecret, Member};

#[derive(Parser)]
#[command(
    name = "shoal",
    version,
    about = "Shoal: a leaderless container orchestrator"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create a new cluster secret (a new cluster). Refuses to overwrite an existing file.
    Init {
        #[arg(long, value_name = "PATH")]
        secret_file: PathBuf,
    },
    /// Run the agent on this node.
    Agent(Box<AgentFlags>),
    /// List the cluster's members as the local agent sees them.
    Members {
        #[command(flatten)]
        target: Target,
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Create or update objects from a YAML or JSON file (several YAML documents allowed).
    Apply {
        #[command(flatten)]
        target: Target,
        #[arg(short = 'f', long = "filename", value_name = "FILE")]
        file: PathBuf,
    },
    /// Show objects of a kind (`pods`, `deploy`, `ConfigMap`, …), or one of them.
    Get {
        #[command(flatten)]
        target: Target,
        kind: String,
        name: Option<String>,
        #[arg(short, long, default_value = "default")]
        namespace: String,
        /// List across all namespaces.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Print a kubeconfig for the local agent's Kubernetes API (started with --api).
    Kubeconfig {
        #[command(flatten)]
        target: Target,
        /// Server URL to put in the kubeconfig instead of the agent's advertised API address.
        #[arg(long, value_name = "URL")]
        server: Option<String>,
    },
    /// Show, or set, this node's membership baseline: the most nodes it has known at once
    /// (persisted). Fenced pods run only with a majority of it, and so do their run leases, so
    /// once nodes are gone for good, lower it on every remaining node (`--set 3` after two of
    /// five were removed); the largest baseline any node reports counts. Refused below the
    /// nodes the membership still lists (the dead are listed until the dead-node grace period).
    Baseline {
        #[command(flatten)]
        target: Target,
        /// Set it to this many nodes.
        #[arg(long, value_name = "NODES")]
        set: Option<u64>,
    },
    /// Manage the node's images (the store in the agent's data dir, shared with a running agent).
    Image {
        #[command(subcommand)]
        command: ImageCommand,
    },
    /// Stop and remove every container and pod sandbox of this node (the agent must be
    /// stopped): processes, mounts, cgroups, network namespaces, pod directories.
    Reset {
        #[command(flatten)]
        target: Target,
    },
    /// Supervise one container (started by the agent; not for interactive use).
    #[command(hide = true)]
    Shim(shoal_agent::runtime::shim::ShimArgs),
    /// Delete an object.
    Delete {
        #[command(flatten)]
        target: Target,
        kind: String,
        name: String,
        #[arg(short, long, default_value = "default")]
        namespace: String,
        /// A pod's grace period in seconds (default: its terminationGracePeriodSeconds; 0
        /// deletes the object at once). A pod on a node is stopped by it within the grace
        /// period, then deleted, as `kubectl delete` does.
        #[arg(long)]
        grace_period: Option<u64>,
    },
}

#[derive(Subcommand)]
enum ImageCommand {
    /// Import the images of an OCI image archive (`skopeo copy … oci-archive:FILE`), an OCI
    /// layout packed with tar, or a `docker save` archive (plain or gzip).
    Import {
        #[command(flatten)]
        target: Target,
        file: PathBuf,
        /// Name the (single) image of the archive instead of using the names it carries.
        #[arg(long, value_name = "NAME")]
        tag: Option<String>,
    },
    /// Pull an image from its registry into the node's store, showing the bytes received
    /// (credentials, mirrors, CAs and insecure registries from a registry config file).
    Pull {
        #[command(flatten)]
        target: Target,
        reference: String,
        /// The registry config (TOML; README's "Registries").
        #[arg(long, value_name = "FILE")]
        registry_config: Option<PathBuf>,
        /// A registry pulled from over plain HTTP besides loopback ones (repeatable).
        #[arg(long = "insecure-registry", value_name = "HOST[:PORT]")]
        insecure_registry: Vec<String>,
        /// A CA certificate (PEM) trusted for registries (repeatable).
        #[arg(long = "registry-ca", value_name = "FILE")]
        registry_ca: Vec<PathBuf>,
    },
    /// List the node's images.
    Ls {
        #[command(flatten)]
        target: Target,
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Remove an image's tag, and its blobs unless another tag still needs them.
    Rm {
        #[command(flatten)]
        target: Target,
        reference: String,
    },
}

/// Which agent a client command talks to.
#[derive(clap::Args)]
struct Target {
    /// Data dir of the local agent to ask.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/shoal")]
    data_dir: PathBuf,
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
    Yaml,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Init { secret_file } => {
            ClusterSecret::create_file(&secret_file)?;
            println!("created cluster secret {}", secret_file.display());
            Ok(())
        }
        Command::Agent(flags) => {
            let config = AgentConfig::resolve(&flags)?;
            if let Err(error) = shoal_agent::host::raise_open_files_limit() {
                tracing::warn!(%error, "could not raise the open files limit");
            }
            runtime()?.block_on(shoal_agent::agent::run(config))?;
            Ok(())
        }
        Command::Members { target, output } => {
            let client = ControlClient::for_data_dir(&target.data_dir);
            let members = runtime()?.block_on(client.members())?;
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&members)?),
                Output::Yaml => print!("{}", serde_yaml_ng::to_string(&members)?),
                Output::Table => print!("{}", members_table(&members)),
            }
            Ok(())
        }
        Command::Apply { target, file } => {
            let client = ControlClient::for_data_dir(&target.data_dir);
            runtime()?.block_on(apply(&client, &file))
        }
        Command::Get {
            target,
            kind,
            name,
            namespace,
            all_namespaces,
            output,
        } => {
            let client = ControlClient::for_data_dir(&target.data_dir);
            let ns = (!all_namespaces).then_some(namespace.as_str());
            runtime()?.block_on(get(&client, &kind, name.as_deref(), ns, output))
        }
        Command::Kubeconfig { target, server } => {
            let client = ControlClient::for_data_dir(&target.data_dir);
            let info: KubeconfigInfo = runtime()?.block_on(async {
                let value = call(&client, hyper::Method::GET, "/v1/kubeconfig", None).await?;
                Ok::<_, anyhow::Error>(serde_json::from_value(value)?)
            })?;
            print!("{}", kubeconfig_yaml(&info, server.as_deref()));
            Ok(())
        }
        Command::Baseline { target, set } => {
            let client = ControlClient::for_data_dir(&target.data_dir);
            let baseline: shoal_agent::replication::Baseline = runtime()?.block_on(async {
                let value = match set {
                    Some(members) => {
                        let body = serde_json::to_vec(&serde_json::json!({"members": members}))?;
                        call(&client, hyper::Method::PUT, "/v1/baseline", Some(body)).await?
                    }
                    None => call(&client, hyper::Method::GET, "/v1/baseline", None).await?,
                };
                Ok::<_, anyhow::Error>(serde_json::from_value(value)?)
            })?;
            println!(
                "baseline: {} nodes (a majority is {}); the membership lists {}: {}",
                baseline.members,
                baseline.members / 2 + 1,
                baseline.listed.len(),
                baseline.listed.join(", ")
            );
            Ok(())
        }
        Command::Image { command } => image(command),
        Command::Shim(args) => Ok(shoal_agent::runtime::shim::main(&args)?),
        Command::Reset { target } => {
            let runtime = shoal_agent::runtime::Runtime::new(&target.data_dir)?;
            let removed = runtime.reset()?;
            println!("removed {removed} pod sandbox(es)");
            shoal_net::linux::BridgeNetwork::new(runtime.scope(), None).cleanup(None)?;
            println!("removed the pod network (bridge and routes)");
            let table = shoal_net::nft::table_name(runtime.scope());
            match shoal_net::nft::delete_table(&table) {
                Ok(()) => println!("removed the service rules (nftables table {table})"),
                Err(e) => eprintln!("service rules (nftables table {table}): {e}"),
            }
            Ok(())
        }
        Command::Delete {
            target,
            kind,
            name,
            namespace,
            grace_period,
        } => {
            let client = ControlClient::for_data_dir(&target.data_dir);
            let mut path = format!("/v1/objects/{kind}/{name}?namespace={namespace}");
            if let Some(seconds) = grace_period {
                path.push_str(&format!("&gracePeriodSeconds={seconds}"));
            }
            let body = runtime()?.block_on(call(&client, hyper::Method::DELETE, &path, None))?;
            use shoal_core::controllers::garbage;
            match garbage::deletion_grace_ms(&body).filter(|_| garbage::deletion_requested(&body)) {
                Some(ms) => println!(
                    "{} terminating (its node stops it within {} s, then deletes it)",
                    display_name(&body),
                    ms / 1000
                ),
                None => println!("{} deleted", display_name(&body)),
            }
            Ok(())
        }
    }
}

/// A pull's progress on stderr, a line per layer and a summary: redrawn in place on a
/// terminal; on anything else (a log), the summary line each time it changes, at most every
/// 5 s.
#[derive(Default)]
struct ProgressView {
    /// Lines drawn last time (a terminal).
    drawn: usize,
    /// The last summary written, and when (not a terminal).
    last: Option<(String, std::time::Instant)>,
}

impl ProgressView {
    fn draw(&mut self, progress: &shoal_agent::images::progress::Progress, last: bool) {
        use shoal_agent::images::progress;
        use std::io::IsTerminal as _;
        let blobs = progress.snapshot();
        let summary = progress::summary(&blobs);
        if !std::io::stderr().is_terminal() {
            let due = match &self.last {
                None => true,
                Some((line, at)) => {
                    *line != summary && (last || at.elapsed() >= std::time::Duration::from_secs(5))
                }
            };
            if due {
                eprintln!("{summary}");
                self.last = Some((summary, std::time::Instant::now()));
            }
            return;
        }
        let mut out = String::new();
        if self.drawn > 0 {
            // Back to the first line drawn last time.
            out.push_str(&format!("\x1b[{}A", self.drawn));
        }
        let lines = progress::lines(&blobs);
        for line in lines.iter().chain([&summary]) {
            out.push_str(&format!("\r\x1b[2K{line}\n"));
        }
        eprint!("{out}");
        self.drawn = lines.len() + 1;
    }
}

fn image(command: ImageCommand) -> anyhow::Result<()> {
    use shoal_agent::images::ImageStore;
    let open = |target: &Target| ImageStore::open(shoal_agent::paths::images(&target.data_dir));
    match command {
        ImageCommand::Import { target, file, tag } => {
            for image in open(&target)?.import(&file, tag.as_deref())? {
                println!("imported {} {}", image.reference, image.digest);
            }
        }
        ImageCommand::Pull {
            target,
            reference,
            registry_config,
            insecure_registry,
            registry_ca,
        } => {
            use shoal_agent::images::registry;
            let mut registries = registry::Registries {
                insecure: insecure_registry,
                ca_files: registry_ca,
                ..Default::default()
            };
            if let Some(path) = &registry_config {
                registries.load_config(path)?;
            }
            let store = open(&target)?;
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let progress = shoal_agent::images::progress::Progress::default();
            let started = std::time::Instant::now();
            let mut view = ProgressView::default();
            let pulled = rt.block_on(async {
                let pull = registry::pull_tracked(
                    &store,
                    &reference,
                    &registries,
                    &[],
                    None,
                    Some(&progress),
                );
                tokio::pin!(pull);
                let mut ticker = tokio::time::interval(std::time::Duration::from_millis(250));
                loop {
                    tokio::select! {
                        result = &mut pull => break result,
                        _ = ticker.tick() => view.draw(&progress, false),
                    }
                }
            });
            view.draw(&progress, true);
            let pulled = pulled?;
            println!(
                "pulled {reference} {} from {} ({:.1} MB in {:.1} s)",
                pulled.digest,
                pulled.host,
                pulled.bytes as f64 / 1e6,
                started.elapsed().as_secs_f64()
            );
        }
        ImageCommand::Ls { target, output } => {
            let images = open(&target)?.list()?;
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&images)?),
                Output::Yaml => print!("{}", serde_yaml_ng::to_string(&images)?),
                Output::Table => {
                    println!("{:<48} {:<19} {:>10}", "IMAGE", "DIGEST", "SIZE");
                    for image in images {
                        let short = image.digest.get(..19).unwrap_or(&image.digest);
                        println!(
                            "{:<48} {:<19} {:>10}",
                            image.reference,
                            short,
                            format!("{:.1}MB", image.size_bytes as f64 / 1e6)
                        );
                    }
                }
            }
        }
        ImageCommand::Rm { target, reference } => {
            let removed = open(&target)?.remove(&reference)?;
            println!("untagged {} {}", removed.reference, removed.digest);
        }
    }
    Ok(())
}

/// Sends a request; a non-2xx answer becomes an error carrying the server's message.
async fn call(
    client: &ControlClient,
    method: hyper::Method,
    path: &str,
    body: Option<Vec<u8>>,
) -> anyhow::Result<Value> {
    let (status, bytes) = client.send(method, path, body).await?;
    if !(200..300).contains(&status) {
        let message = serde_json::from_slice::<ApiError>(&bytes)
            .map(|e| e.message)
            .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
        anyhow::bail!("{message}");
    }
    let value = serde_json::from_slice(&bytes).context("the agent answered with invalid JSON")?;
    Ok(value)
}

/// A kubeconfig with the cluster CA embedded and the cluster's bearer token.
fn kubeconfig_yaml(info: &KubeconfigInfo, server: Option<&str>) -> String {
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.encode(info.ca_pem.as_bytes());
    let server = server.unwrap_or(&info.server);
    let cluster = &info.cluster_id;
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {cluster}\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: {cluster}-admin\n  user:\n    token: {token}\ncontexts:\n- name: {cluster}\n  context:\n    cluster: {cluster}\n    user: {cluster}-admin\n    namespace: default\ncurrent-context: {cluster}\n",
        token = info.token
    )
}

/// `kind.group/name`, as kubectl prints it.
fn display_name(object: &Value) -> String {
    let kind = object["kind"].as_str().unwrap_or("object").to_lowercase();
    let group = object["apiVersion"]
        .as_str()
        .and_then(|v| v.split_once('/'))
        .map(|(g, _)| format!(".{g}"))
        .unwrap_or_default();
    format!(
        "{kind}{group}/{}",
        object["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// Parses YAML (one or more documents) or JSON into objects.
fn parse_manifests(text: &str, file: &std::path::Path) -> anyhow::Result<Vec<Value>> {
    let mut objects = Vec::new();
    for (i, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(document).with_context(|| {
            format!(
                "{}: document {} is not valid YAML or JSON",
                file.display(),
                i + 1
            )
        })?;
        match value {
            Value::Null => {}
            Value::Object(ref map) if map.get("kind").and_then(Value::as_str) == Some("List") => {
                objects.extend(
                    map.get("items")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default(),
                );
            }
            other => objects.push(other),
        }
    }
    Ok(objects)
}

async fn apply(client: &ControlClient, file: &std::path::Path) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    for object in parse_manifests(&text, file)? {
        let (status, bytes) = client
            .send(
                hyper::Method::PUT,
                "/v1/objects",
                Some(serde_json::to_vec(&object)?),
            )
            .await?;
        if !(200..300).contains(&status) {
            let message = serde_json::from_slice::<ApiError>(&bytes)
                .map(|e| e.message)
                .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
            anyhow::bail!("{}: {message}", display_name(&object));
        }
        let stored: Value = serde_json::from_slice(&bytes)?;
        let verb = if status == 201 {
            "created"
        } else {
            "configured"
        };
        println!("{} {verb}", display_name(&stored));
    }
    Ok(())
}

async fn get(
    client: &ControlClient,
    kind: &str,
    name: Option<&str>,
    namespace: Option<&str>,
    output: Output,
) -> anyhow::Result<()> {
    let query = namespace
        .map(|ns| format!("?namespace={ns}"))
        .unwrap_or_default();
    let path = match name {
        Some(name) => format!("/v1/objects/{kind}/{name}{query}"),
        None => format!("/v1/objects/{kind}{query}"),
    };
    let value = call(client, hyper::Method::GET, &path, None).await?;
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&value)?),
        Output::Yaml => print!("{}", serde_yaml_ng::to_string(&value)?),
        Output::Table => {
            let items = match name {
                Some(_) => vec![value],
                None => value["items"].as_array().cloned().unwrap_or_default(),
            };
            if items.is_empty() {
                eprintln!("No resources found.");
                return Ok(());
            }
            let pods = items.iter().all(|i| i["kind"] == "Pod");
            let mut header = vec!["NAMESPACE".to_owned(), "NAME".to_owned()];
            if pods {
                header.extend(["STATUS", "RESTARTS", "NODE"].map(str::to_owned));
            }
            header.push("AGE".to_owned());
            let mut rows = vec![header];
            for item in &items {
                let mut row = vec![
                    item["metadata"]["namespace"]
                        .as_str()
                        .unwrap_or("")
                        .to_owned(),
                    item["metadata"]["name"].as_str().unwrap_or("").to_owned(),
                ];
                if pods {
                    let statuses = item["status"]["containerStatuses"].as_array();
                    let restarts: u64 = statuses
                        .into_iter()
                        .flatten()
                        .filter_map(|c| c["restartCount"].as_u64())
                        .sum();
                    // A waiting reason says more than the phase (CrashLoopBackOff, …).
                    let waiting = statuses
                        .into_iter()
                        .flatten()
                        .find_map(|c| c["state"]["waiting"]["reason"].as_str());
                    let phase = item["status"]["phase"].as_str().unwrap_or("Pending");
                    row.push(waiting.unwrap_or(phase).to_owned());
                    row.push(restarts.to_string());
                    row.push(
                        item["spec"]["nodeName"]
                            .as_str()
                            .unwrap_or("<none>")
                            .to_owned(),
                    );
                }
                row.push(age(item["metadata"]["creationTimestamp"]
                    .as_str()
                    .unwrap_or("")));
                rows.push(row);
            }
            if namespace.is_some() {
                for row in &mut rows {
                    row.remove(0);
                }
            }
            print!("{}", table(&rows));
        }
    }
    Ok(())
}

/// Age in kubectl's short form (`5s`, `3m`, `2h`, `4d`).
fn age(rfc3339: &str) -> String {
    let Ok(t) = humantime::parse_rfc3339(rfc3339) else {
        return "<unknown>".into();
    };
    let secs = std::time::SystemTime::now()
        .duration_since(t)
        .map_or(0, |d| d.as_secs());
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// Left-aligned columns separated by three spaces.
fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(i, cell)| {
                if i + 1 == columns {
                    cell.clone()
                } else {
                    format!("{cell:<w$}", w = widths[i])
                }
            })
            .collect();
        out.push_str(&cells.join("   "));
        out.push('\n');
    }
    out
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        // Bulk store work runs off the async workers (`replication::on_disk` and the blocking
        // pool); a few blocking threads suffice, and each extra one costs a malloc arena.
        .max_blocking_threads(4)
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")
}

fn members_table(members: &[Member]) -> String {
    let mut rows = vec![
        ["NAME", "ID", "ADDRESS", "STATE", "GENERATION", "LABELS"]
            .map(str::to_owned)
            .to_vec(),
    ];
    for m in members {
        let labels = m.meta.as_ref().map_or_else(String::new, |meta| {
            meta.labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        });
        rows.push(vec![
            format!("{}{}", m.name(), if m.is_self { "*" } else { "" }),
            m.node_id.clone(),
            m.gossip_addr.to_string(),
            m.state.to_string(),
            m.generation.to_string(),
            labels,
        ]);
    }
    table(&rows)
}
