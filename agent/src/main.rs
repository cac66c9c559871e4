//! `shoal`: the agent binary and its command-line client.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use shoal_agent::client::ControlClient;
use shoal_agent::config::{AgentConfig, AgentFlags};
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
    Agent(AgentFlags),
    /// List the cluster's members as the local agent sees them.
    Members {
        /// Data dir of the local agent to ask.
        #[arg(long, value_name = "DIR", default_value = "/var/lib/shoal")]
        data_dir: PathBuf,
        #[arg(short, long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
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
            runtime()?.block_on(shoal_agent::agent::run(config))?;
            Ok(())
        }
        Command::Members { data_dir, output } => {
            let members = runtime()?.block_on(ControlClient::for_data_dir(&data_dir).members())?;
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&members)?),
                Output::Table => print!("{}", members_table(&members)),
            }
            Ok(())
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")
}

fn members_table(members: &[Member]) -> String {
    let rows: Vec<[String; 6]> = members
        .iter()
        .map(|m| {
            let labels = m.meta.as_ref().map_or_else(String::new, |meta| {
                meta.labels
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            });
            [
                format!("{}{}", m.name(), if m.is_self { "*" } else { "" }),
                m.node_id.clone(),
                m.gossip_addr.to_string(),
                m.state.to_string(),
                m.generation.to_string(),
                labels,
            ]
        })
        .collect();
    let header = ["NAME", "ID", "ADDRESS", "STATE", "GENERATION", "LABELS"];
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let last = cells.len() - 1;
        for (i, cell) in cells.iter().enumerate() {
            if i == last {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}   ", w = widths[i]));
            }
        }
        out.push('\n');
    };
    line(header.to_vec());
    for row in &rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}
