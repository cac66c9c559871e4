//! Processes run in a running container with `runc exec`: CRI's ExecSync (probes and hooks,
//! output captured and bounded, killed at a timeout) and Exec (a process whose standard
//! streams, or terminal, the caller gives: `kubectl exec`). The process gets the container's
//! namespaces, cgroup, environment, user and working directory: runc starts from the
//! container's own process spec and replaces only the arguments.

use std::io;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::{ContainerMeta, Runtime, RuntimeError, check_id};

/// At most this much of an ExecSync's output is kept (a probe's message, a hook's).
const SYNC_OUTPUT_MAX: usize = 1024;

/// A process ready to run in a container (CRI's Exec): spawn [`ExecProcess::command`] with
/// the standard streams or terminal wanted. The scratch files that tell the process's own end
/// from the runtime's failure live as long as this value.
#[derive(Debug)]
pub struct ExecProcess {
    pub command: Command,
    /// runc writes the process's host pid here (to kill the process, not only runc).
    pid_file: Option<PathBuf>,
    /// runc's own log (JSON lines), kept apart from the process's stderr.
    error_log: Option<PathBuf>,
    _scratch: Option<tempfile::TempDir>,
}

impl ExecProcess {
    /// A process with no runtime bookkeeping (a simulated runtime's): killing it is killing
    /// the child, and it never fails to start but by its exit code.
    pub fn plain(command: Command) -> Self {
        Self {
            command,
            pid_file: None,
            error_log: None,
            _scratch: None,
        }
    }

    /// Kills the process in the container by the host pid the runtime recorded (runc then
    /// exits with it). Nothing to do when the process never started.
    pub fn kill(&self) {
        if let Some(pid) = self
            .pid_file
            .as_ref()
            .and_then(|f| std::fs::read_to_string(f).ok())
            .and_then(|s| s.trim().parse::<i32>().ok())
            .filter(|pid| *pid > 1)
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }

    /// Why the runtime could not run the process (no such binary in the image, say), read
    /// once it ended; `None` when the exit code is the process's own.
    pub fn failure(&self) -> Option<String> {
        runc_error(&std::fs::read_to_string(self.error_log.as_ref()?).unwrap_or_default())
    }
}

/// The error runc logged (JSON lines, `--log-format json`), if any.
fn runc_error(log: &str) -> Option<String> {
    log.lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["level"] == "error" || v["level"] == "fatal")
        .find_map(|v| v["msg"].as_str().map(str::to_owned))
}

impl Runtime {
    /// `runc exec` of `command` in a running container. `options` go between `exec` and the
    /// container id (`--process F`, `--pid-file F`).
    fn exec_command(
        &self,
        meta: &ContainerMeta,
        command: &[String],
        options: &[&std::ffi::OsStr],
    ) -> Command {
        let mut runc = Command::new(&self.runc);
        runc.arg("--root")
            .arg(&self.runc_root)
            .arg("exec")
            .args(options)
            .arg(&meta.runtime_id)
            .args(command);
        runc
    }

    /// The process spec (runc's `exec --process`) of a command run in a container of pod
    /// `uid`: the container's own process (environment, user, working directory,
    /// capabilities, limits) with `command` as its arguments and, with a terminal, the
    /// terminal's size (columns, rows) set when runc makes it, so the command never sees 0x0.
    pub fn exec_process(
        &self,
        uid: &str,
        meta: &ContainerMeta,
        command: &[String],
        terminal: Option<Option<(u16, u16)>>,
    ) -> Result<serde_json::Value, RuntimeError> {
        check_id("pod uid", uid)?;
        check_id("container name", &meta.name)?;
        let path = self
            .bundle(uid, &meta.name, meta.attempt)
            .join("config.json");
        let at = |source: io::Error| RuntimeError::Io {
            path: path.clone(),
            source,
        };
        let config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).map_err(at)?).map_err(|e| at(e.into()))?;
        let mut process = config
            .get("process")
            .filter(|p| p.is_object())
            .cloned()
            .ok_or_else(|| at(io::Error::new(io::ErrorKind::InvalidData, "no process")))?;
        process["args"] = serde_json::json!(command);
        process["terminal"] = serde_json::json!(terminal.is_some());
        if let Some(Some((cols, rows))) = terminal {
            process["consoleSize"] = serde_json::json!({"height": rows, "width": cols});
        } else if let Some(p) = process.as_object_mut() {
            p.remove("consoleSize");
        }
        Ok(process)
    }

    /// CRI's Exec: `command` ready to run in the container, with a terminal of the given size
    /// (`Some(None)`: size unknown) or without one (`None`).
    pub fn exec_stream(
        &self,
        uid: &str,
        meta: &ContainerMeta,
        command: &[String],
        terminal: Option<Option<(u16, u16)>>,
    ) -> Result<ExecProcess, RuntimeError> {
        let process = self.exec_process(uid, meta, command, terminal)?;
        let scratch = tempfile::Builder::new()
            .prefix("shoal-exec-")
            .tempdir()
            .map_err(|source| RuntimeError::Io {
                path: std::env::temp_dir(),
                source,
            })?;
        let (log, pid_file) = (scratch.path().join("runc.log"), scratch.path().join("pid"));
        let process_file = scratch.path().join("process.json");
        std::fs::write(&process_file, process.to_string()).map_err(|source| RuntimeError::Io {
            path: process_file.clone(),
            source,
        })?;
        let options: [&std::ffi::OsStr; 4] = [
            "--process".as_ref(),
            process_file.as_os_str(),
            "--pid-file".as_ref(),
            pid_file.as_os_str(),
        ];
        let exec = self.exec_command(meta, &[], &options);
        // Global options come before the subcommand.
        let mut command = Command::new(exec.get_program());
        command
            .arg("--log")
            .arg(&log)
            .args(["--log-format", "json"])
            .args(exec.get_args());
        Ok(ExecProcess {
            command,
            pid_file: Some(pid_file),
            error_log: Some(log),
            _scratch: Some(scratch),
        })
    }

    /// CRI's ExecSync: runs `command` in a running container (exec probes, hooks) and returns
    /// its exit code and the first KiB of its output, killing it after `timeout`.
    pub fn exec_sync(
        &self,
        meta: &ContainerMeta,
        command: &[String],
        timeout: Duration,
    ) -> Result<(i32, String), RuntimeError> {
        let failed = |message: String| RuntimeError::Exec {
            container: meta.runtime_id.clone(),
            message,
        };
        let mut child = self
            .exec_command(meta, command, &[])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| failed(format!("runc exec: {e}")))?;
        let deadline = std::time::Instant::now() + timeout;
        loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    let mut output = String::new();
                    if let Some(mut out) = child.stdout.take() {
                        let _ = io::Read::read_to_string(&mut out, &mut output);
                    }
                    if let Some(mut err) = child.stderr.take() {
                        let _ = io::Read::read_to_string(&mut err, &mut output);
                    }
                    truncate(&mut output, SYNC_OUTPUT_MAX);
                    return Ok((status.code().unwrap_or(128), output));
                }
                Ok(None) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(failed(format!("command timed out after {timeout:?}")));
                }
                Err(e) => return Err(failed(format!("runc exec: {e}"))),
            }
        }
    }

    /// Connects to the shim's attach socket of a container created with stdin or a tty.
    pub fn attach_input(
        &self,
        uid: &str,
        meta: &ContainerMeta,
    ) -> io::Result<std::os::unix::net::UnixStream> {
        if check_id("pod uid", uid).is_err() || check_id("container name", &meta.name).is_err() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not an identifier",
            ));
        }
        super::shim::connect_attach(&self.bundle(uid, &meta.name, meta.attempt))
    }
}

/// Cuts `text` to at most `max` bytes, on a character boundary.
fn truncate(text: &mut String, max: usize) {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runc_errors_are_read_from_its_json_log() {
        let log = "{\"level\":\"info\",\"msg\":\"starting\"}\n\
                   {\"level\":\"error\",\"msg\":\"exec failed: unable to start container process: exec: \\\"nope\\\": executable file not found in $PATH\"}\n";
        assert!(
            runc_error(log)
                .unwrap()
                .contains("executable file not found")
        );
        assert_eq!(runc_error("{\"level\":\"info\",\"msg\":\"ok\"}\n"), None);
        assert_eq!(runc_error("not json"), None);
        assert_eq!(runc_error(""), None);
        assert_eq!(runc_error("not json\n{\"level\":\"info\"}"), None);
    }

    #[test]
    fn sync_output_is_cut_on_a_character_boundary() {
        let mut text = "é".repeat(600);
        truncate(&mut text, SYNC_OUTPUT_MAX);
        assert!(text.len() <= SYNC_OUTPUT_MAX);
        assert!(text.chars().all(|c| c == 'é'));
        let mut short = "ok".to_owned();
        truncate(&mut short, SYNC_OUTPUT_MAX);
        assert_eq!(short, "ok");
    }

    #[test]
    fn a_plain_process_has_no_runtime_files_and_never_failed_to_start() {
        let process = ExecProcess::plain(Command::new("true"));
        assert_eq!((&process.pid_file, &process.error_log), (&None, &None));
        assert_eq!(process.failure(), None);
        process.kill();
    }
}
