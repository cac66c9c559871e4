//! The embedded DNS server every node runs for its pods (DESIGN.md §9), answering
//! Kubernetes' DNS schema for Services and pods from a record set the agent rebuilds whenever
//! Services or endpoints change, and forwarding every other name to the node's own resolvers.
//!
//! - `<svc>.<ns>.svc.<domain>`: A = the ClusterIP; for a headless Service (`clusterIP: None`)
//!   one A per ready endpoint;
//! - `<hostname>.<svc>.<ns>.svc.<domain>`: A for pods of a headless Service that set
//!   `hostname` and `subdomain`;
//! - `_<port>._<proto>.<svc>.<ns>.svc.<domain>`: SRV for named ports (the Service's name as
//!   target, or each endpoint's name for a headless Service), with the targets' A records as
//!   additional answers;
//! - `<a-b-c-d>.<ns>.pod.<domain>`: A = a.b.c.d;
//! - any other name in the domain: NXDOMAIN (NODATA for names that exist with other types);
//!   names outside it are forwarded.
//!
//! TTL 5 s. Wire format through `hickory-proto`; the lookup ([`Records::answer`]) is pure.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Edns, Message, MessageType, Metadata, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, SRV};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::debug;

/// Seconds clients may cache an answer.
pub const TTL: u32 = 5;

/// One endpoint of a Service, as DNS sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsEndpoint {
    pub ip: Ipv4Addr,
    pub hostname: Option<String>,
    pub ready: bool,
}

/// One port of a Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsPort {
    pub name: String,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    pub port: u16,
}

/// A Service, as DNS sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsService {
    pub namespace: String,
    pub name: String,
    /// `None` for headless Services (and ones without an address yet).
    pub cluster_ip: Option<Ipv4Addr>,
    pub headless: bool,
    pub ports: Vec<DnsPort>,
    pub endpoints: Vec<DnsEndpoint>,
}

/// What to do with a query.
#[derive(Debug, PartialEq)]
pub enum Reply {
    /// Send this message.
    Answer(Box<Message>),
    /// Not a cluster name: ask the node's resolvers.
    Forward,
}

/// The cluster's names.
#[derive(Debug, Default)]
pub struct Records {
    domain: Option<Name>,
    // Hash maps: names are stored and looked up lowercased, and hashing beats a tree's
    // label-by-label comparisons on the query path.
    a: HashMap<Name, Vec<Ipv4Addr>>,
    srv: HashMap<Name, Vec<(u16, Name)>>,
    /// Every name that exists (with its ancestors below the domain), for NODATA vs NXDOMAIN.
    names: HashSet<Name>,
}

fn lower(name: &Name) -> Name {
    let mut n = name.to_lowercase();
    n.set_fqdn(true);
    n
}

fn name_of(text: &str) -> Option<Name> {
    let mut name = Name::from_ascii(text).ok()?;
    name.set_fqdn(true);
    Some(lower(&name))
}

impl Records {
    /// Builds the record set of `domain` (e.g. `cluster.local`) from `services`.
    pub fn build(domain: &str, services: &[DnsService]) -> Self {
        let mut records = Self {
            domain: name_of(domain),
            ..Default::default()
        };
        for svc in services {
            records.add_service(domain, svc);
        }
        records
    }

    fn add_name(&mut self, name: &Name) {
        let Some(domain) = self.domain.clone() else {
            return;
        };
        let mut n = name.clone();
        while domain.zone_of(&n) && n != domain {
            self.names.insert(n.clone());
            n = n.base_name();
        }
    }

    fn add_a(&mut self, name: Name, ip: Ipv4Addr) {
        self.add_name(&name);
        let ips = self.a.entry(name).or_default();
        if !ips.contains(&ip) {
            ips.push(ip);
        }
    }

    fn add_service(&mut self, domain: &str, svc: &DnsService) {
        let base = format!("{}.{}.svc.{domain}", svc.name, svc.namespace);
        let Some(service_name) = name_of(&base) else {
            return;
        };
        self.add_name(&service_name);
        // Endpoint names of a headless Service: its hostname, or its dashed address.
        let endpoint_names: Vec<(Name, Ipv4Addr)> = svc
            .endpoints
            .iter()
            .filter(|e| e.ready)
            .filter_map(|e| {
                let label = e
                    .hostname
                    .clone()
                    .unwrap_or_else(|| e.ip.to_string().replace('.', "-"));
                Some((name_of(&format!("{label}.{base}"))?, e.ip))
            })
            .collect();
        if svc.headless {
            for e in svc.endpoints.iter().filter(|e| e.ready) {
                self.add_a(service_name.clone(), e.ip);
            }
            for (name, ip) in &endpoint_names {
                self.add_a(name.clone(), *ip);
            }
        } else if let Some(ip) = svc.cluster_ip {
            self.add_a(service_name.clone(), ip);
        }
        for port in svc.ports.iter().filter(|p| !p.name.is_empty()) {
            let Some(srv_name) = name_of(&format!(
                "_{}._{}.{base}",
                port.name,
                port.protocol.to_ascii_lowercase()
            )) else {
                continue;
            };
            self.add_name(&srv_name);
            let targets: Vec<(u16, Name)> = if svc.headless {
                endpoint_names
                    .iter()
                    .map(|(n, _)| (port.port, n.clone()))
                    .collect()
            } else if svc.cluster_ip.is_some() {
                vec![(port.port, service_name.clone())]
            } else {
                Vec::new()
            };
            self.srv.entry(srv_name).or_default().extend(targets);
        }
    }

    /// `<a-b-c-d>.<ns>.pod.<domain>` → a.b.c.d.
    fn pod_address(&self, name: &Name) -> Option<Ipv4Addr> {
        let domain = self.domain.as_ref()?;
        if name.num_labels() != domain.num_labels() + 3 {
            return None;
        }
        let mut labels = name.iter();
        let first = std::str::from_utf8(labels.next()?).ok()?;
        labels.next()?;
        if labels.next()? != b"pod" {
            return None;
        }
        let octets: Vec<u8> = first
            .split('-')
            .map(|o| o.parse::<u8>().ok().filter(|n| n.to_string() == o))
            .collect::<Option<_>>()?;
        let [a, b, c, d] = octets.as_slice() else {
            return None;
        };
        Some(Ipv4Addr::new(*a, *b, *c, *d))
    }

    /// The answer to `request`, or [`Reply::Forward`] for a name outside the cluster domain.
    pub fn answer(&self, request: &Message) -> Reply {
        let mut response = Message::new(request.metadata.id, MessageType::Response, OpCode::Query);
        response.metadata = Metadata::response_from_request(&request.metadata);
        response.metadata.recursion_available = true;
        if request.edns.is_some() {
            let mut edns = Edns::new();
            edns.set_max_payload(1232);
            response.set_edns(edns);
        }
        let [query] = request.queries.as_slice() else {
            response.metadata.response_code = ResponseCode::FormErr;
            return Reply::Answer(Box::new(response));
        };
        if request.metadata.op_code != OpCode::Query {
            response.metadata.response_code = ResponseCode::NotImp;
            return Reply::Answer(Box::new(response));
        }
        let name = lower(query.name());
        let Some(domain) = &self.domain else {
            return Reply::Forward;
        };
        if !domain.zone_of(&name) {
            return Reply::Forward;
        }
        response.add_query(query.clone());
        response.metadata.authoritative = true;
        let qtype = query.query_type();
        let a_records = |name: &Name, ips: &[Ipv4Addr]| -> Vec<Record> {
            ips.iter()
                .map(|ip| Record::from_rdata(name.clone(), TTL, RData::A(A(*ip))))
                .collect()
        };
        let known = self.names.contains(&name);
        let pod = if known { None } else { self.pod_address(&name) };
        let exists = known || pod.is_some();
        match qtype {
            RecordType::A | RecordType::ANY => {
                if let Some(ips) = self.a.get(&name) {
                    response.add_answers(a_records(&name, ips));
                } else if let Some(ip) = pod {
                    response.add_answers(a_records(&name, &[ip]));
                }
            }
            RecordType::SRV => {
                for (port, target) in self.srv.get(&name).into_iter().flatten() {
                    response.add_answer(Record::from_rdata(
                        name.clone(),
                        TTL,
                        RData::SRV(SRV::new(0, 100, *port, target.clone())),
                    ));
                    if let Some(ips) = self.a.get(target) {
                        response.add_additionals(a_records(target, ips));
                    }
                }
            }
            _ => {}
        }
        if !exists {
            response.metadata.response_code = ResponseCode::NXDomain;
        }
        Reply::Answer(Box::new(response))
    }
}

/// Serves DNS on `addr` (UDP and TCP) from the latest record set in `records`, forwarding other
/// names to `upstreams` (tried in order, 2 s each). Runs until the task is dropped.
pub async fn serve(
    addr: SocketAddr,
    records: tokio::sync::watch::Receiver<Arc<Records>>,
    upstreams: Vec<SocketAddr>,
) -> std::io::Result<()> {
    let udp = Arc::new(tokio::net::UdpSocket::bind(addr).await?);
    let tcp = tokio::net::TcpListener::bind(addr).await?;
    let upstreams = Arc::new(upstreams);
    let tcp_task = {
        let records = records.clone();
        let upstreams = upstreams.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = tcp.accept().await else {
                    continue;
                };
                let records = records.clone();
                let upstreams = upstreams.clone();
                tokio::spawn(async move {
                    // One query after another on a connection, each length-prefixed.
                    loop {
                        let mut len = [0u8; 2];
                        match tokio::time::timeout(
                            Duration::from_secs(10),
                            stream.read_exact(&mut len),
                        )
                        .await
                        {
                            Ok(Ok(_)) => {}
                            _ => return,
                        }
                        let mut buf = vec![0; u16::from_be_bytes(len) as usize];
                        if stream.read_exact(&mut buf).await.is_err() {
                            return;
                        }
                        let Some(reply) = respond(&buf, &records, &upstreams, true).await else {
                            return;
                        };
                        let Ok(n) = u16::try_from(reply.len()) else {
                            return;
                        };
                        if stream.write_all(&n.to_be_bytes()).await.is_err()
                            || stream.write_all(&reply).await.is_err()
                        {
                            return;
                        }
                    }
                });
            }
        })
    };
    let _abort = AbortOnDrop(tcp_task);
    // One receive loop per core on the shared socket; cluster names are answered in the loop
    // (no task per query), forwarded ones in a task of their own (they wait for the upstream).
    let loops = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, 8);
    let mut receivers = tokio::task::JoinSet::new();
    for _ in 0..loops {
        let udp = udp.clone();
        let records = records.clone();
        let upstreams = upstreams.clone();
        receivers.spawn(async move {
            let mut buf = vec![0u8; 4096];
            loop {
                let (n, peer) = udp.recv_from(&mut buf).await?;
                let query = &buf[..n];
                match respond_local(query, &records) {
                    Local::Reply(Some(reply)) => {
                        let _ = udp.send_to(&reply, peer).await;
                    }
                    Local::Reply(None) => {}
                    Local::Forward => {
                        let query = query.to_vec();
                        let udp = udp.clone();
                        let records = records.clone();
                        let upstreams = upstreams.clone();
                        tokio::spawn(async move {
                            if let Some(reply) = respond(&query, &records, &upstreams, false).await
                            {
                                let _ = udp.send_to(&reply, peer).await;
                            }
                        });
                    }
                }
            }
        });
    }
    match receivers.join_next().await {
        Some(Ok(result)) => result,
        Some(Err(e)) => Err(std::io::Error::other(e)),
        None => Ok(()),
    }
}

enum Local {
    Reply(Option<Vec<u8>>),
    Forward,
}

/// Answers a UDP query from the record set without waiting on anything.
fn respond_local(bytes: &[u8], records: &tokio::sync::watch::Receiver<Arc<Records>>) -> Local {
    let request = match Message::from_vec(bytes) {
        Ok(m) if m.metadata.message_type == MessageType::Query => m,
        Ok(_) => return Local::Reply(None),
        Err(_) => {
            let (Some(a), Some(b)) = (bytes.first(), bytes.get(1)) else {
                return Local::Reply(None);
            };
            let id = u16::from_be_bytes([*a, *b]);
            return Local::Reply(
                Message::error_msg(id, OpCode::Query, ResponseCode::FormErr)
                    .to_vec()
                    .ok(),
            );
        }
    };
    let reply = records.borrow().answer(&request);
    match reply {
        Reply::Forward => Local::Forward,
        Reply::Answer(message) => Local::Reply(encode(&request, &message, false)),
    }
}

/// The reply's bytes, truncated (TC) when they exceed what the client takes over UDP.
fn encode(request: &Message, message: &Message, tcp: bool) -> Option<Vec<u8>> {
    let limit = if tcp {
        usize::from(u16::MAX)
    } else {
        request
            .edns
            .as_ref()
            .map_or(512, |e| usize::from(e.max_payload().clamp(512, 1232)))
    };
    let bytes = message.to_vec().ok()?;
    if bytes.len() <= limit {
        return Some(bytes);
    }
    let mut truncated = message.truncate();
    truncated.metadata.truncation = true;
    truncated.to_vec().ok()
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The bytes to send back for query `bytes` (`None`: not even a DNS header; dropped).
async fn respond(
    bytes: &[u8],
    records: &tokio::sync::watch::Receiver<Arc<Records>>,
    upstreams: &[SocketAddr],
    tcp: bool,
) -> Option<Vec<u8>> {
    let request = match Message::from_vec(bytes) {
        Ok(m) if m.metadata.message_type == MessageType::Query => m,
        Ok(_) => return None,
        Err(_) => {
            // Answer FORMERR when at least the id is there.
            let id = u16::from_be_bytes([*bytes.first()?, *bytes.get(1)?]);
            return Message::error_msg(id, OpCode::Query, ResponseCode::FormErr)
                .to_vec()
                .ok();
        }
    };
    let reply = records.borrow().answer(&request);
    match reply {
        Reply::Answer(message) => encode(&request, &message, tcp),
        Reply::Forward => match forward(bytes, upstreams, tcp).await {
            Some(reply) => Some(reply),
            None => {
                debug!(name = ?request.queries.first().map(|q| q.name().to_ascii()), "no upstream answered");
                let mut fail =
                    Message::new(request.metadata.id, MessageType::Response, OpCode::Query);
                fail.metadata = Metadata::response_from_request(&request.metadata);
                fail.metadata.recursion_available = true;
                fail.metadata.response_code = ResponseCode::ServFail;
                fail.add_queries(request.queries.clone());
                fail.to_vec().ok()
            }
        },
    }
}

/// Relays the query to the first upstream that answers.
async fn forward(query: &[u8], upstreams: &[SocketAddr], tcp: bool) -> Option<Vec<u8>> {
    for upstream in upstreams {
        let attempt = async {
            if tcp {
                let mut stream = tokio::net::TcpStream::connect(upstream).await.ok()?;
                let len = u16::try_from(query.len()).ok()?;
                stream.write_all(&len.to_be_bytes()).await.ok()?;
                stream.write_all(query).await.ok()?;
                let mut len = [0u8; 2];
                stream.read_exact(&mut len).await.ok()?;
                let mut buf = vec![0; u16::from_be_bytes(len) as usize];
                stream.read_exact(&mut buf).await.ok()?;
                Some(buf)
            } else {
                let bind: SocketAddr = if upstream.is_ipv4() {
                    "0.0.0.0:0".parse().expect("literal")
                } else {
                    "[::]:0".parse().expect("literal")
                };
                let socket = tokio::net::UdpSocket::bind(bind).await.ok()?;
                socket.send_to(query, upstream).await.ok()?;
                let mut buf = vec![0u8; 4096];
                loop {
                    let (n, from) = socket.recv_from(&mut buf).await.ok()?;
                    // Only the upstream's answer to this query (same id).
                    if from == *upstream && n >= 2 && buf[..2] == query[..2] {
                        return Some(buf[..n].to_vec());
                    }
                }
            }
        };
        if let Ok(Some(reply)) = tokio::time::timeout(Duration::from_secs(2), attempt).await {
            return Some(reply);
        }
    }
    None
}

/// The node's resolvers (`nameserver` lines of a resolv.conf), port 53.
pub fn upstreams(resolv_conf: &str) -> Vec<SocketAddr> {
    resolv_conf
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|ip| ip.trim().parse::<std::net::IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

/// How a pod resolves names (`dnsPolicy`, `dnsConfig`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PodDns {
    /// `ClusterFirst` (default), `Default`, `None` (or `ClusterFirstWithHostNet`).
    pub policy: String,
    pub nameservers: Vec<String>,
    pub searches: Vec<String>,
    /// `name` or `name:value`.
    pub options: Vec<String>,
}

/// A pod's resolv.conf: the node's DNS server (`cluster_dns`) and the cluster search path
/// under ClusterFirst; the node's own resolv.conf under Default; only dnsConfig under None.
/// A pod in the node's network namespace (`host_network`) gets the cluster's only with
/// ClusterFirstWithHostNet, and the node's under ClusterFirst, as the kubelet does.
/// dnsConfig's entries are appended as Kubernetes does (at most 3 nameservers, 32 searches).
pub fn resolv_conf(
    dns: &PodDns,
    namespace: &str,
    domain: &str,
    cluster_dns: Option<Ipv4Addr>,
    host_network: bool,
    node_resolv_conf: &str,
) -> String {
    let cluster_dns = match (dns.policy.as_str(), host_network) {
        ("ClusterFirstWithHostNet", _) | (_, false) => cluster_dns,
        (_, true) => None,
    };
    let mut nameservers: Vec<String> = Vec::new();
    let mut searches: Vec<String> = Vec::new();
    let mut options: Vec<String> = Vec::new();
    let node = || {
        let mut ns = Vec::new();
        let mut search = Vec::new();
        let mut opts = Vec::new();
        for line in node_resolv_conf.lines() {
            let mut words = line.split_whitespace();
            match words.next() {
                Some("nameserver") => ns.extend(words.next().map(str::to_owned)),
                Some("search" | "domain") => search.extend(words.map(str::to_owned)),
                Some("options") => opts.extend(words.map(str::to_owned)),
                _ => {}
            }
        }
        (ns, search, opts)
    };
    match (dns.policy.as_str(), cluster_dns) {
        ("None", _) => {}
        ("Default", _) | (_, None) => {
            (nameservers, searches, options) = node();
        }
        (_, Some(ip)) => {
            nameservers.push(ip.to_string());
            searches = vec![
                format!("{namespace}.svc.{domain}"),
                format!("svc.{domain}"),
                domain.to_owned(),
            ];
            searches.extend(node().1);
            options.push("ndots:5".to_owned());
        }
    }
    nameservers.extend(dns.nameservers.iter().cloned());
    searches.extend(dns.searches.iter().cloned());
    for o in &dns.options {
        let key = o.split(':').next().unwrap_or_default();
        options.retain(|x| x.split(':').next() != Some(key));
        options.push(o.clone());
    }
    let mut seen = BTreeSet::new();
    nameservers.retain(|n| seen.insert(n.clone()));
    nameservers.truncate(3);
    let mut seen = BTreeSet::new();
    searches.retain(|s| seen.insert(s.clone()));
    searches.truncate(32);
    let mut out = String::new();
    for n in &nameservers {
        out.push_str(&format!("nameserver {n}\n"));
    }
    if !searches.is_empty() {
        out.push_str(&format!("search {}\n", searches.join(" ")));
    }
    if !options.is_empty() {
        out.push_str(&format!("options {}\n", options.join(" ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::Query;

    fn records() -> Records {
        Records::build(
            "cluster.local",
            &[
                DnsService {
                    namespace: "default".into(),
                    name: "web".into(),
                    cluster_ip: Some("10.96.0.20".parse().unwrap()),
                    headless: false,
                    ports: vec![DnsPort {
                        name: "http".into(),
                        protocol: "TCP".into(),
                        port: 80,
                    }],
                    endpoints: vec![DnsEndpoint {
                        ip: "10.88.1.2".parse().unwrap(),
                        hostname: None,
                        ready: true,
                    }],
                },
                DnsService {
                    namespace: "db".into(),
                    name: "pg".into(),
                    cluster_ip: None,
                    headless: true,
                    ports: vec![DnsPort {
                        name: "sql".into(),
                        protocol: "TCP".into(),
                        port: 5432,
                    }],
                    endpoints: vec![
                        DnsEndpoint {
                            ip: "10.88.1.5".parse().unwrap(),
                            hostname: Some("pg-0".into()),
                            ready: true,
                        },
                        DnsEndpoint {
                            ip: "10.88.2.6".parse().unwrap(),
                            hostname: None,
                            ready: true,
                        },
                        DnsEndpoint {
                            ip: "10.88.2.7".parse().unwrap(),
                            hostname: None,
                            ready: false,
                        },
                    ],
                },
            ],
        )
    }

    fn ask(records: &Records, name: &str, qtype: RecordType) -> Message {
        let mut m = Message::query();
        m.metadata.id = 7;
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
        // Through the wire format both ways, as a client would send and read it.
        let m = Message::from_vec(&m.to_vec().unwrap()).unwrap();
        match records.answer(&m) {
            Reply::Answer(r) => Message::from_vec(&r.to_vec().unwrap()).unwrap(),
            Reply::Forward => panic!("{name} forwarded"),
        }
    }

    fn a_of(m: &Message) -> Vec<String> {
        m.answers
            .iter()
            .filter_map(|r| match &r.data {
                RData::A(a) => Some(a.0.to_string()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn services_answer_with_their_cluster_ip_or_ready_endpoints() {
        let r = records();
        let m = ask(&r, "web.default.svc.cluster.local.", RecordType::A);
        assert_eq!(a_of(&m), ["10.96.0.20"]);
        assert_eq!(m.metadata.id, 7);
        assert!(m.metadata.authoritative);
        assert_eq!(m.answers[0].ttl, TTL);
        let m = ask(&r, "WEB.Default.svc.cluster.local.", RecordType::A);
        assert_eq!(a_of(&m), ["10.96.0.20"], "names are case-insensitive");
        let m = ask(&r, "pg.db.svc.cluster.local.", RecordType::A);
        assert_eq!(
            a_of(&m),
            ["10.88.1.5", "10.88.2.6"],
            "headless: ready endpoints only"
        );
        let m = ask(&r, "pg-0.pg.db.svc.cluster.local.", RecordType::A);
        assert_eq!(a_of(&m), ["10.88.1.5"]);
    }

    #[test]
    fn srv_records_name_ports_and_targets() {
        let r = records();
        let m = ask(
            &r,
            "_http._tcp.web.default.svc.cluster.local.",
            RecordType::SRV,
        );
        let RData::SRV(srv) = &m.answers[0].data else {
            panic!("{m:?}")
        };
        assert_eq!(srv.port, 80);
        assert_eq!(srv.target.to_ascii(), "web.default.svc.cluster.local.");
        let mut extra = m.clone();
        extra.answers = m.additionals.clone();
        assert_eq!(a_of(&extra), ["10.96.0.20"]);
        let m = ask(&r, "_sql._tcp.pg.db.svc.cluster.local.", RecordType::SRV);
        let targets: Vec<String> = m
            .answers
            .iter()
            .filter_map(|a| match &a.data {
                RData::SRV(s) => Some(s.target.to_ascii()),
                _ => None,
            })
            .collect();
        assert_eq!(
            targets,
            [
                "pg-0.pg.db.svc.cluster.local.",
                "10-88-2-6.pg.db.svc.cluster.local."
            ]
        );
        assert_eq!(m.additionals.len(), 2);
    }

    #[test]
    fn pods_unknown_names_other_types_and_other_domains() {
        let r = records();
        let m = ask(&r, "10-88-3-4.default.pod.cluster.local.", RecordType::A);
        assert_eq!(a_of(&m), ["10.88.3.4"]);
        for bad in [
            "10-88-3-400.default.pod.cluster.local.",
            "nope.default.svc.cluster.local.",
            "x.cluster.local.",
        ] {
            let m = ask(&r, bad, RecordType::A);
            assert_eq!(m.metadata.response_code, ResponseCode::NXDomain, "{bad}");
            assert!(m.answers.is_empty());
        }
        let m = ask(&r, "web.default.svc.cluster.local.", RecordType::AAAA);
        assert_eq!(m.metadata.response_code, ResponseCode::NoError, "NODATA");
        assert!(m.answers.is_empty());
        let m = ask(&r, "default.svc.cluster.local.", RecordType::A);
        assert_eq!(
            m.metadata.response_code,
            ResponseCode::NoError,
            "a parent of a name exists"
        );
        let mut q = Message::query();
        q.add_query(Query::query(
            Name::from_ascii("example.com.").unwrap(),
            RecordType::A,
        ));
        assert_eq!(r.answer(&q), Reply::Forward);
    }

    #[test]
    fn resolv_conf_follows_the_dns_policy() {
        let node = "nameserver 192.0.2.53\nsearch corp.example\noptions timeout:2\n";
        let gw = Some("10.88.1.1".parse().unwrap());
        let first = resolv_conf(
            &PodDns {
                policy: "ClusterFirst".into(),
                ..Default::default()
            },
            "shop",
            "cluster.local",
            gw,
            false,
            node,
        );
        assert_eq!(
            first,
            "nameserver 10.88.1.1\nsearch shop.svc.cluster.local svc.cluster.local cluster.local corp.example\noptions ndots:5\n"
        );
        let default = resolv_conf(
            &PodDns {
                policy: "Default".into(),
                ..Default::default()
            },
            "shop",
            "cluster.local",
            gw,
            false,
            node,
        );
        assert_eq!(
            default,
            "nameserver 192.0.2.53\nsearch corp.example\noptions timeout:2\n"
        );
        let none = resolv_conf(
            &PodDns {
                policy: "None".into(),
                nameservers: vec!["1.1.1.1".into()],
                searches: vec!["a.b".into()],
                options: vec!["ndots:2".into()],
            },
            "shop",
            "cluster.local",
            gw,
            false,
            node,
        );
        assert_eq!(none, "nameserver 1.1.1.1\nsearch a.b\noptions ndots:2\n");
        let merged = resolv_conf(
            &PodDns {
                policy: "ClusterFirst".into(),
                options: vec!["ndots:1".into()],
                ..Default::default()
            },
            "shop",
            "cluster.local",
            gw,
            false,
            node,
        );
        assert!(merged.ends_with("options ndots:1\n"), "{merged}");
        // In the node's network namespace: the cluster's resolver only when asked for.
        let host = |policy: &str| {
            resolv_conf(
                &PodDns {
                    policy: policy.into(),
                    ..Default::default()
                },
                "shop",
                "cluster.local",
                gw,
                true,
                node,
            )
        };
        assert_eq!(host("ClusterFirst"), default);
        assert_eq!(host("ClusterFirstWithHostNet"), first);
        // Outside it, ClusterFirstWithHostNet is ClusterFirst.
        let with_host_net = resolv_conf(
            &PodDns {
                policy: "ClusterFirstWithHostNet".into(),
                ..Default::default()
            },
            "shop",
            "cluster.local",
            gw,
            false,
            node,
        );
        assert_eq!(with_host_net, first);
        assert_eq!(
            upstreams(node),
            ["192.0.2.53:53".parse::<SocketAddr>().unwrap()]
        );
    }
}
