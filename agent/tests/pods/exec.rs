//! `kubectl exec`, `kubectl cp` and `kubectl port-forward` against real containers, through
//! an agent that does not run the pod (the session crosses QUIC) and through the one that
//! does: output streams and exit codes, stdin and its close, a terminal with its size, runc's
//! own errors, refusals that survive kubectl's SPDY fallback, a client that leaves killing its
//! process, and HTTP through forwarded pod and Service ports.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use shoal_chaos::testkit::wait_until;

use super::{lab, wait_pod};
use crate::api::which;

const SHELL: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: shell
spec:
  nodeSelector: {kubernetes.io/hostname: n2}
  containers:
  - name: main
    image: shoal.local/busybox:1
    command: [sh, -c, "mkdir -p /data; while true; do sleep 1; done"]
    env: [{name: GREETING, value: "hello from the container's env"}]
    workingDir: /tmp
  - name: side
    image: shoal.local/busybox:1
    command: [sh, -c, "while true; do sleep 1; done"]
---
apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  nodeSelector: {kubernetes.io/hostname: n1}
  containers:
  - name: httpd
    image: shoal.local/httpd:1
---
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
"#;

/// `kubectl port-forward <what> :<port>` through agent `agent`: the child and the local port
/// it listens on.
fn port_forward(
    api: &crate::api::ApiLab,
    agent: usize,
    what: &str,
    port: u16,
) -> (std::process::Child, u16) {
    use std::io::BufRead;
    let mut child = Command::new(which("kubectl"))
        .arg("--kubeconfig")
        .arg(&api.kubeconfigs[agent])
        .args(["port-forward", what, &format!(":{port}")])
        .env("HOME", api.home.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().and_then(Result::ok).unwrap_or_default();
    // "Forwarding from 127.0.0.1:40123 -> 8080"
    let local = first
        .strip_prefix("Forwarding from 127.0.0.1:")
        .and_then(|rest| rest.split(' ').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("kubectl port-forward {what} said {first:?}"));
    std::thread::spawn(move || lines.for_each(drop));
    (child, local)
}

/// An HTTP/1.0 GET of `path` on 127.0.0.1:`port`: the whole answer.
fn http_get(port: u16, path: &str) -> String {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\n\r\n").unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
}

/// Runs kubectl against agent `agent` with `stdin` piped in: (exit code, stdout, stderr).
fn kubectl_with_stdin(
    api: &crate::api::ApiLab,
    agent: usize,
    args: &[&str],
    stdin: &[u8],
) -> (i32, String, String) {
    let mut child = Command::new(which("kubectl"))
        .arg("--kubeconfig")
        .arg(&api.kubeconfigs[agent])
        .args(args)
        .env("HOME", api.home.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_exec_cp_and_port_forward_reach_containers_from_any_agent() {
    let api = lab().await;
    let file = api.manifest("shell.yaml", SHELL);
    api.ok(0, &["apply", "-f", &file]);
    api.ok(
        0,
        &[
            "wait",
            "--for=condition=Ready",
            "pod/shell",
            "--timeout=60s",
        ],
    );
    // Agent 1 (which does not run the pod either) must see it running before exec through it.
    wait_pod(&api, 1, "shell", "agent 1 sees shell Running", |p| {
        p["status"]["containerStatuses"][0]["state"]["running"].is_object()
    })
    .await;

    // Agent 0 does not run the pod: the session crosses to n2 over QUIC. Streams stay apart,
    // the container's env, working directory and exit code come through.
    let script = r#"echo out; echo err >&2; echo "$GREETING"; pwd; exit 3"#;
    let (code, out, err) = kubectl_with_stdin(
        &api,
        0,
        &["exec", "shell", "-c", "main", "--", "sh", "-c", script],
        b"",
    );
    assert_eq!(code, 3, "exit code: stdout {out:?} stderr {err:?}");
    assert_eq!(out, "out\nhello from the container's env\n/tmp\n", "{err}");
    assert!(err.contains("err\n"), "{err}");
    assert!(err.contains("command terminated with exit code 3"), "{err}");

    // stdin is relayed and its end closes the process's stdin (cat exits), on the pod's own
    // node too (an in-memory session, the same code).
    for agent in [0, 2] {
        let (code, out, err) = kubectl_with_stdin(
            &api,
            agent,
            &["exec", "-i", "shell", "-c", "main", "--", "cat"],
            b"abc\nline two\n",
        );
        assert_eq!(
            (code, out.as_str()),
            (0, "abc\nline two\n"),
            "agent {agent}: {err}"
        );
    }
    // A megabyte through stdin and back (many WebSocket messages each way).
    let big: Vec<u8> = (0..1_048_576u32).map(|i| b'a' + (i % 26) as u8).collect();
    let (code, out, err) = kubectl_with_stdin(
        &api,
        1,
        &[
            "exec",
            "-i",
            "shell",
            "-c",
            "main",
            "--",
            "sh",
            "-c",
            "cat | wc -c",
        ],
        &big,
    );
    assert_eq!((code, out.trim()), (0, "1048576"), "{err}");

    // runc failing to start the command is an error, not an exit code of the command.
    let (code, _, err) = kubectl_with_stdin(
        &api,
        0,
        &["exec", "shell", "-c", "main", "--", "/no/such/binary"],
        b"",
    );
    assert_ne!(code, 0);
    assert!(
        err.contains("error executing command in container") && err.contains("no such file"),
        "{err}"
    );

    // Refusals keep their reason through kubectl's fallback to SPDY.
    let (code, _, err) =
        kubectl_with_stdin(&api, 0, &["exec", "shell", "-c", "nosuch", "--", "ls"], b"");
    assert_ne!(code, 0);
    assert!(
        err.contains("container nosuch is not valid for pod shell"),
        "{err}"
    );
    let (code, _, err) = kubectl_with_stdin(&api, 0, &["exec", "nosuch", "--", "ls"], b"");
    assert_ne!(code, 0);
    assert!(err.contains("not found"), "{err}");

    // A terminal: runc runs on our pty, which kubectl sized from its own (script gives kubectl
    // a terminal of 100x30).
    let out = Command::new("script")
        .args(["-qfec"])
        .arg(format!(
            "stty cols 100 rows 30; {} --kubeconfig {} exec -it shell -c main -- stty size",
            which("kubectl").display(),
            api.kubeconfigs[0].display()
        ))
        .arg("/dev/null")
        .env("HOME", api.home.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("30 100"),
        "stty size in the container: {text:?}"
    );

    // kubectl cp both ways (tar through exec's stdin and stdout), a file and a directory.
    let local = api.home.path().join("cp");
    std::fs::create_dir_all(local.join("dir/sub")).unwrap();
    std::fs::write(local.join("file.txt"), "one file\n").unwrap();
    std::fs::write(local.join("dir/sub/deep.txt"), "deep\n").unwrap();
    let local_s = |p: &str| local.join(p).to_str().unwrap().to_owned();
    api.ok(
        1,
        &[
            "cp",
            &local_s("file.txt"),
            "shell:/data/file.txt",
            "-c",
            "main",
        ],
    );
    api.ok(1, &["cp", &local_s("dir"), "shell:/data/dir", "-c", "main"]);
    let listed = api.ok(
        0,
        &[
            "exec",
            "shell",
            "-c",
            "main",
            "--",
            "cat",
            "/data/file.txt",
            "/data/dir/sub/deep.txt",
        ],
    );
    assert_eq!(listed, "one file\ndeep\n");
    // Out of the pod on n2 through agent 0, as into it through agent 1.
    api.ok(
        0,
        &["cp", "shell:/data/dir", &local_s("back"), "-c", "main"],
    );
    assert_eq!(
        std::fs::read_to_string(local.join("back/sub/deep.txt")).unwrap(),
        "deep\n"
    );

    // A client that leaves takes its process with it: no `sleep 4321` stays in the container.
    let mut child = Command::new(which("kubectl"))
        .arg("--kubeconfig")
        .arg(&api.kubeconfigs[0])
        .args(["exec", "shell", "-c", "side", "--", "sleep", "4321"])
        .env("HOME", api.home.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let count = |api: &crate::api::ApiLab| {
        let (_, out, _) = api.kubectl(2, &["exec", "shell", "-c", "side", "--", "ps"]);
        out.lines().filter(|l| l.contains("sleep 4321")).count()
    };
    wait_until("the exec'd sleep runs", Duration::from_secs(30), || {
        let n = count(&api);
        async move { n == 1 }
    })
    .await
    .unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    wait_until("the exec'd sleep is gone", Duration::from_secs(30), || {
        let n = count(&api);
        async move { n == 0 }
    })
    .await
    .unwrap();

    // port-forward to the pod on n1 through agent 0 (SPDY in a WebSocket, relayed over QUIC):
    // two connections (two request ids), each a whole HTTP exchange.
    let (mut forward, local) = port_forward(&api, 0, "pod/web", 8080);
    for _ in 0..2 {
        let answer = http_get(local, "/index.html");
        assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    }
    // kubectl attach follows the container's output (httpd -v logs each answer on stderr; a missing page is a 404),
    // here through agent 2 for the pod on n1; attaching with stdin to a container created
    // without it is refused with a reason.
    let (code, _, err) = kubectl_with_stdin(&api, 2, &["attach", "-i", "web"], b"");
    assert!(code != 0 && err.contains("stdin: true"), "{err}");
    let mut attach = Command::new(which("kubectl"))
        .arg("--kubeconfig")
        .arg(&api.kubeconfigs[2])
        .args(["attach", "web", "-c", "httpd"])
        .env("HOME", api.home.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (seen_tx, seen) = std::sync::mpsc::channel();
    let attach_err = attach.stderr.take().unwrap();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(attach_err)
            .lines()
            .map_while(Result::ok)
        {
            if seen_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut heard = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !heard.iter().any(|l: &String| l.contains("response:404")) {
        assert!(
            std::time::Instant::now() < deadline,
            "kubectl attach never showed the request: {heard:?}"
        );
        let _ = http_get(local, "/attached.html");
        while let Ok(line) = seen.recv_timeout(Duration::from_millis(500)) {
            heard.push(line);
        }
    }
    attach.kill().unwrap();
    attach.wait().unwrap();
    forward.kill().unwrap();
    forward.wait().unwrap();
    // svc/web: kubectl picks a pod behind the Service and its target port, here through
    // agent 2 for the pod on n1.
    let (mut forward, local) = port_forward(&api, 2, "svc/web", 80);
    let answer = http_get(local, "/index.html");
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    forward.kill().unwrap();
    forward.wait().unwrap();
    // Nothing listens on 9999: the kubelet's error reaches kubectl on the error stream.
    let (mut forward, local) = port_forward(&api, 0, "pod/web", 9999);
    let answer = http_get(local, "/");
    assert_eq!(answer, "", "no bytes from a port nothing listens on");
    let mut stderr = forward.stderr.take().unwrap();
    let _ = forward.kill();
    forward.wait().unwrap();
    let mut said = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut said).unwrap();
    assert!(
        said.contains("error forwarding port 9999 to pod web") && said.contains("refused"),
        "{said}"
    );

    // The official Python client's `stream` (exec) and `portforward` (the channel protocol),
    // through agent 0, which runs neither pod.
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pods/python_stream.py");
    let (ok, out) = crate::api::python(&script, &[api.kubeconfigs[0].to_str().unwrap()]);
    assert!(
        ok && out.contains("python streams: all checks passed"),
        "{out}"
    );
}

/// `kubectl run -i` and `kubectl attach -it`: a container created with `stdin` gets what the
/// client sends (here piped, closed with its end: `stdinOnce`), one with `tty` runs on a
/// terminal sized as the client's; both through an agent that does not run the pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_run_and_attach_send_input_and_size_a_terminal() {
    let api = lab().await;
    let on_n1 = r#"{"spec":{"nodeSelector":{"kubernetes.io/hostname":"n1"}}}"#;
    let (code, out, err) = kubectl_with_stdin(
        &api,
        2,
        &[
            "run",
            "reader",
            "-i",
            "--restart=Never",
            "--image=shoal.local/busybox:1",
            "--overrides",
            on_n1,
            "--",
            "sh",
            "-c",
            "read first; read second; echo \"got:$first+$second\"; cat; echo stdin-closed",
        ],
        b"hello\nworld\n",
    );
    assert!(
        code == 0 && out.contains("got:hello+world") && out.contains("stdin-closed"),
        "kubectl run -i: {code}\n{out}\n{err}"
    );
    let pod = super::pod_json(&api, 0, "reader");
    assert_eq!(pod["spec"]["containers"][0]["stdinOnce"], true, "{pod}");

    let file = api.manifest(
        "console.yaml",
        r#"apiVersion: v1
kind: Pod
metadata: {name: console}
spec:
  nodeSelector: {kubernetes.io/hostname: n1}
  restartPolicy: Never
  containers:
  - name: sh
    image: shoal.local/busybox:1
    stdin: true
    tty: true
    command: [sh, -c, "read answer; sleep 0.3; stty size; echo tty-got:$answer; [ -t 0 ] && echo on-a-terminal"]
"#,
    );
    api.ok(0, &["apply", "-f", &file]);
    api.ok(
        0,
        &[
            "wait",
            "--for=condition=Ready",
            "pod/console",
            "--timeout=60s",
        ],
    );
    // script gives kubectl a 90x20 terminal; what script reads from its stdin is typed there.
    let mut child = Command::new("script")
        .args(["-qfec"])
        .arg(format!(
            "stty cols 90 rows 20; {} --kubeconfig {} attach -it console",
            which("kubectl").display(),
            api.kubeconfigs[2].display()
        ))
        .arg("/dev/null")
        .env("HOME", api.home.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    std::thread::sleep(Duration::from_secs(2));
    input.write_all(b"forty-two\r").unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("20 90")
            && text.contains("tty-got:forty-two")
            && text.contains("on-a-terminal"),
        "kubectl attach -it: {text:?} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(input);
    wait_pod(&api, 0, "console", "console ends", |p| {
        p["status"]["phase"] == "Succeeded"
    })
    .await;
}
