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
//!
//! Every pod can reach the server, so what it spends is bounded ([`DnsLimits`]): TCP
//! connections and their timeouts, UDP queries being forwarded, and each source's query rate
//! ([`SourceRateLimiter`]); UDP answers, local or relayed, never exceed the client's size.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use hickory_proto::op::{Edns, Message, MessageType, Metadata, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, SRV};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;
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
            edns.set_max_payload(MAX_UDP_PAYLOAD_BYTES);
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

/// The most a UDP answer may hold when the client advertises more (EDNS): the size DNS Flag Day
/// 2020 settled on, which fits an IPv6 packet on a 1280-byte link without fragmenting, and the
/// size this server advertises. Without EDNS a UDP answer holds at most 512 bytes.
pub const MAX_UDP_PAYLOAD_BYTES: u16 = 1232;

/// What the DNS server spends on its clients at most. Every pod can reach the server, so no
/// client, however many connections or queries it sends, gets more than these.
#[derive(Debug, Clone, PartialEq)]
pub struct DnsLimits {
    /// TCP connections served at once; a connection beyond them is accepted and closed at once.
    /// Default 256.
    pub tcp_connections: usize,
    /// Time a TCP client has, from the first byte of a query, to send all of it (the 2-byte
    /// length and the body), and then to take the reply. Default 5 s.
    pub tcp_query_timeout: Duration,
    /// Time a TCP connection may wait for its next query before it is closed. Default 10 s.
    pub tcp_idle_timeout: Duration,
    /// Pause before accepting again after accept failed for want of resources (EMFILE, ENFILE,
    /// ENOBUFS…), instead of retrying at once. Default 100 ms.
    pub accept_backoff: Duration,
    /// UDP queries being forwarded to the node's resolvers at once (each holds a task and a
    /// socket for at most 2 s per resolver). A query beyond them is answered SERVFAIL at once,
    /// so the client moves on to its next nameserver instead of waiting. Default 512.
    pub udp_forwards: usize,
    /// Queries each source address may send, over UDP and TCP together; `None`: unlimited.
    /// Default 1,000 a second, bursts of 2,000, 4,096 sources tracked (a pod resolving
    /// through five search domains asks up to ten questions a name: well under it).
    pub per_source: Option<RateLimit>,
}

impl Default for DnsLimits {
    fn default() -> Self {
        Self {
            tcp_connections: 256,
            tcp_query_timeout: Duration::from_secs(5),
            tcp_idle_timeout: Duration::from_secs(10),
            accept_backoff: Duration::from_millis(100),
            udp_forwards: 512,
            per_source: Some(RateLimit::default()),
        }
    }
}

/// A per-source query rate: a token bucket per source address.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Queries a second a source may send for ever. Default 1,000.
    pub queries_per_second: u32,
    /// Queries a source may send at once after a quiet spell. Default 2,000.
    pub burst: u32,
    /// Sources tracked at once; a new source beyond them makes the one heard from least
    /// recently forgotten (it starts again with a full burst). Default 4,096.
    pub max_sources: usize,
}

impl Default for RateLimit {
    fn default() -> Self {
        Self {
            queries_per_second: 1_000,
            burst: 2_000,
            max_sources: 4096,
        }
    }
}

/// Response-rate limiting per source address, like BIND's RRL but keyed on the client alone:
/// each source earns [`RateLimit::queries_per_second`] tokens a second up to
/// [`RateLimit::burst`], and each query spends one; a query without a token is dropped.
/// Memory is bounded by [`RateLimit::max_sources`]. Pure: the caller passes the time.
#[derive(Debug)]
pub struct SourceRateLimiter {
    limit: RateLimit,
    buckets: HashMap<IpAddr, Bucket>,
    /// (last heard from, source) of every bucket, the stalest first.
    by_age: BTreeSet<(Instant, IpAddr)>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

impl SourceRateLimiter {
    /// A limiter that tracks no source yet.
    pub fn new(limit: RateLimit) -> Self {
        Self {
            limit,
            buckets: HashMap::new(),
            by_age: BTreeSet::new(),
        }
    }

    /// Whether a query from `source` at `now` may be answered (spending one of its tokens).
    pub fn allow(&mut self, source: IpAddr, now: Instant) -> bool {
        let burst = f64::from(self.limit.burst);
        let (tokens, last) = match self.buckets.remove(&source) {
            Some(bucket) => {
                self.by_age.remove(&(bucket.last, source));
                let earned = now.saturating_duration_since(bucket.last).as_secs_f64()
                    * f64::from(self.limit.queries_per_second);
                // A time before the last one (never from a monotonic clock) earns nothing.
                ((bucket.tokens + earned).min(burst), bucket.last.max(now))
            }
            None => {
                while self.buckets.len() >= self.limit.max_sources {
                    let Some((_, stalest)) = self.by_age.pop_first() else {
                        break;
                    };
                    self.buckets.remove(&stalest);
                }
                (burst, now)
            }
        };
        let allowed = tokens >= 1.0;
        let tokens = if allowed { tokens - 1.0 } else { tokens };
        self.buckets.insert(source, Bucket { tokens, last });
        self.by_age.insert((last, source));
        allowed
    }

    /// How many sources are tracked.
    pub fn sources(&self) -> usize {
        self.buckets.len()
    }
}

/// Serves DNS on `addr` (UDP and TCP) from the latest record set in `records`, forwarding other
/// names to `upstreams` (tried in order, 2 s each), within the default [`DnsLimits`]. Runs until
/// the task is dropped.
pub async fn serve(
    addr: SocketAddr,
    records: tokio::sync::watch::Receiver<Arc<Records>>,
    upstreams: Vec<SocketAddr>,
) -> std::io::Result<()> {
    let udp = tokio::net::UdpSocket::bind(addr).await?;
    let tcp = tokio::net::TcpListener::bind(addr).await?;
    serve_on(udp, tcp, records, upstreams, DnsLimits::default()).await
}

/// Serves DNS on the bound sockets `udp` and `tcp` as [`serve`] does, within `limits`. Runs
/// until the task is dropped (which ends its connections and forwarded queries too).
pub async fn serve_on(
    udp: tokio::net::UdpSocket,
    tcp: tokio::net::TcpListener,
    records: tokio::sync::watch::Receiver<Arc<Records>>,
    upstreams: Vec<SocketAddr>,
    limits: DnsLimits,
) -> std::io::Result<()> {
    let udp = Arc::new(udp);
    let server = Arc::new(Server {
        records,
        upstreams,
        rate: limits
            .per_source
            .map(|limit| Mutex::new(SourceRateLimiter::new(limit))),
        udp_forwards: Arc::new(Semaphore::new(limits.udp_forwards)),
        limits,
    });
    let _abort = AbortOnDrop(tokio::spawn(accept_tcp(tcp, server.clone())));
    // One receive loop per core on the shared socket; cluster names are answered in the loop
    // (no task per query), forwarded ones in a task of their own (they wait for the upstream).
    let loops = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, 8);
    let mut receivers = tokio::task::JoinSet::new();
    for _ in 0..loops {
        receivers.spawn(receive_udp(udp.clone(), server.clone()));
    }
    match receivers.join_next().await {
        Some(Ok(result)) => result,
        Some(Err(e)) => Err(std::io::Error::other(e)),
        None => Ok(()),
    }
}

/// What every query of a running server shares.
struct Server {
    records: tokio::sync::watch::Receiver<Arc<Records>>,
    upstreams: Vec<SocketAddr>,
    limits: DnsLimits,
    rate: Option<Mutex<SourceRateLimiter>>,
    /// One permit per UDP query being forwarded.
    udp_forwards: Arc<Semaphore>,
}

impl Server {
    /// Whether a query from `source` is within its rate now.
    fn admit(&self, source: IpAddr) -> bool {
        self.rate.as_ref().is_none_or(|rate| {
            rate.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .allow(source, Instant::now())
        })
    }
}

/// Answers UDP queries on `udp` until receiving fails.
async fn receive_udp(udp: Arc<tokio::net::UdpSocket>, server: Arc<Server>) -> std::io::Result<()> {
    let mut buf = vec![0u8; 4096];
    // Dropped with the loop, which ends the queries it is forwarding.
    let mut forwards = tokio::task::JoinSet::new();
    loop {
        let (n, peer) = udp.recv_from(&mut buf).await?;
        while forwards.try_join_next().is_some() {}
        if !server.admit(peer.ip()) {
            continue;
        }
        let query = &buf[..n];
        match respond_local(query, &server.records, false) {
            Local::Reply(Some(reply)) => {
                let _ = udp.send_to(&reply, peer).await;
            }
            Local::Reply(None) => {}
            Local::Forward(request) => {
                let Ok(slot) = server.udp_forwards.clone().try_acquire_owned() else {
                    debug!(%peer, "too many queries being forwarded; SERVFAIL");
                    if let Some(fail) = servfail(&request) {
                        let _ = udp.send_to(&fail, peer).await;
                    }
                    continue;
                };
                let query = query.to_vec();
                let udp = udp.clone();
                let server = server.clone();
                forwards.spawn(async move {
                    let _slot = slot;
                    if let Some(reply) =
                        forward_reply(&request, &query, &server.upstreams, false).await
                    {
                        let _ = udp.send_to(&reply, peer).await;
                    }
                });
            }
        }
    }
}

/// Accepts TCP connections on `tcp` for ever, serving at most [`DnsLimits::tcp_connections`]
/// at once.
async fn accept_tcp(tcp: tokio::net::TcpListener, server: Arc<Server>) {
    let slots = Arc::new(Semaphore::new(server.limits.tcp_connections));
    // Dropped with the loop, which closes its connections.
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let accepted = tcp.accept().await;
        while connections.try_join_next().is_some() {}
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) if accept_error_is_per_connection(&e) => continue,
            Err(e) => {
                debug!(error = %e, "DNS accept failed; pausing");
                tokio::time::sleep(server.limits.accept_backoff).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            debug!(%peer, "too many DNS connections; closing");
            drop(stream);
            continue;
        };
        let server = server.clone();
        connections.spawn(async move {
            let _slot = slot;
            serve_tcp_connection(stream, peer.ip(), &server).await;
        });
    }
}

/// Whether a failed accept concerned only the connection being accepted, so that accepting
/// again at once is right (rather than after [`DnsLimits::accept_backoff`]).
fn accept_error_is_per_connection(e: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(
        e.kind(),
        ErrorKind::ConnectionAborted
            | ErrorKind::ConnectionReset
            | ErrorKind::Interrupted
            | ErrorKind::WouldBlock
    )
}

/// Answers the queries on one TCP connection, each length-prefixed, one after another, until
/// the client closes it, idles or dawdles past the limits, or goes over its rate (that query
/// is dropped and the connection closed).
async fn serve_tcp_connection(mut stream: tokio::net::TcpStream, source: IpAddr, server: &Server) {
    let limits = &server.limits;
    let mut query = Vec::new();
    loop {
        let mut len = [0u8; 2];
        match tokio::time::timeout(limits.tcp_idle_timeout, stream.read(&mut len[..1])).await {
            Ok(Ok(1)) => {}
            _ => return,
        }
        let read = async {
            stream.read_exact(&mut len[1..]).await?;
            query.resize(usize::from(u16::from_be_bytes(len)), 0);
            stream.read_exact(&mut query).await
        };
        if !matches!(
            tokio::time::timeout(limits.tcp_query_timeout, read).await,
            Ok(Ok(_))
        ) {
            return;
        }
        if !server.admit(source) {
            return;
        }
        let reply = match respond_local(&query, &server.records, true) {
            Local::Reply(reply) => reply,
            Local::Forward(request) => {
                forward_reply(&request, &query, &server.upstreams, true).await
            }
        };
        let Some(reply) = reply else {
            return;
        };
        let Ok(n) = u16::try_from(reply.len()) else {
            return;
        };
        let mut framed = Vec::with_capacity(2 + reply.len());
        framed.extend_from_slice(&n.to_be_bytes());
        framed.extend_from_slice(&reply);
        if !matches!(
            tokio::time::timeout(limits.tcp_query_timeout, stream.write_all(&framed)).await,
            Ok(Ok(()))
        ) {
            return;
        }
    }
}

enum Local {
    /// Send these bytes (`None`: nothing).
    Reply(Option<Vec<u8>>),
    /// Not a cluster name: ask the upstreams.
    Forward(Box<Message>),
}

/// Answers query `bytes` from the record set without waiting on anything: the bytes to send
/// back (`None` when it is not even a DNS header, or not a query), or the parsed query to
/// forward.
fn respond_local(
    bytes: &[u8],
    records: &tokio::sync::watch::Receiver<Arc<Records>>,
    tcp: bool,
) -> Local {
    let request = match Message::from_vec(bytes) {
        Ok(m) if m.metadata.message_type == MessageType::Query => m,
        Ok(_) => return Local::Reply(None),
        Err(_) => {
            // Answer FORMERR when at least the id is there.
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
        Reply::Forward => Local::Forward(Box::new(request)),
        Reply::Answer(message) => Local::Reply(encode(&request, &message, tcp)),
    }
}

/// The reply's bytes, truncated (TC) when they exceed what the client takes.
fn encode(request: &Message, message: &Message, tcp: bool) -> Option<Vec<u8>> {
    let limit = if tcp {
        usize::from(u16::MAX)
    } else {
        udp_payload_limit(request)
    };
    fit(message, limit)
}

/// The bytes a UDP reply to `request` may have: 512 without EDNS, else the client's advertised
/// size up to [`MAX_UDP_PAYLOAD_BYTES`].
fn udp_payload_limit(request: &Message) -> usize {
    request.edns.as_ref().map_or(512, |e| {
        usize::from(e.max_payload().clamp(512, MAX_UDP_PAYLOAD_BYTES))
    })
}

/// `message`'s bytes if they fit in `limit`, else those of its truncated form (TC set; no
/// answer, authority or additional records) so that the client asks again over TCP; `None`
/// when not even that fits.
fn fit(message: &Message, limit: usize) -> Option<Vec<u8>> {
    let bytes = message.to_vec().ok()?;
    if bytes.len() <= limit {
        return Some(bytes);
    }
    let truncated = message.truncate().to_vec().ok()?;
    (truncated.len() <= limit).then_some(truncated)
}

/// An upstream's `reply` to `request` as relayed to a UDP client: unchanged when it fits the
/// client's size, else truncated as [`fit`] does; `None` (dropped) when it is not a DNS
/// response.
fn relay_udp(request: &Message, reply: &[u8]) -> Option<Vec<u8>> {
    let message = Message::from_vec(reply)
        .ok()
        .filter(|m| m.metadata.message_type == MessageType::Response)?;
    let limit = udp_payload_limit(request);
    if reply.len() <= limit {
        return Some(reply.to_vec());
    }
    fit(&message, limit)
}

/// SERVFAIL for `request`.
fn servfail(request: &Message) -> Option<Vec<u8>> {
    let mut fail = Message::new(request.metadata.id, MessageType::Response, OpCode::Query);
    fail.metadata = Metadata::response_from_request(&request.metadata);
    fail.metadata.recursion_available = true;
    fail.metadata.response_code = ResponseCode::ServFail;
    fail.add_queries(request.queries.clone());
    fail.to_vec().ok()
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The reply to `request` (`bytes` on the wire), which is not a cluster name: the first
/// upstream's answer (fitted to the client's size over UDP), or SERVFAIL when none answered.
async fn forward_reply(
    request: &Message,
    bytes: &[u8],
    upstreams: &[SocketAddr],
    tcp: bool,
) -> Option<Vec<u8>> {
    match forward(bytes, upstreams, tcp).await {
        Some(reply) if tcp => Some(reply),
        Some(reply) => relay_udp(request, &reply),
        None => {
            debug!(name = ?request.queries.first().map(|q| q.name().to_ascii()), "no upstream answered");
            servfail(request)
        }
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

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn each_source_gets_a_burst_then_its_rate() {
        let mut limiter = SourceRateLimiter::new(RateLimit {
            queries_per_second: 10,
            burst: 20,
            max_sources: 16,
        });
        let t0 = Instant::now();
        let (pod, other) = (ip("10.88.1.2"), ip("10.88.1.3"));
        for i in 0..20 {
            assert!(limiter.allow(pod, t0), "query {i} of the burst");
        }
        assert!(!limiter.allow(pod, t0), "past the burst");
        assert!(limiter.allow(other, t0), "sources are limited apart");
        // 10 a second: one more query after 100 ms, and only one.
        let t1 = t0 + Duration::from_millis(100);
        assert!(limiter.allow(pod, t1));
        assert!(!limiter.allow(pod, t1));
        // Refused queries spend nothing: 100 ms later there is one again.
        assert!(limiter.allow(pod, t1 + Duration::from_millis(100)));
        // A time before the last one earns nothing (and does not panic).
        assert!(!limiter.allow(pod, t0));
        // A quiet hour refills up to the burst, not beyond.
        let later = t0 + Duration::from_secs(3600);
        let allowed = (0..100).filter(|_| limiter.allow(pod, later)).count();
        assert_eq!(allowed, 20);
    }

    #[test]
    fn the_limiter_tracks_a_bounded_number_of_sources_forgetting_the_stalest() {
        let mut limiter = SourceRateLimiter::new(RateLimit {
            queries_per_second: 1,
            burst: 1,
            max_sources: 3,
        });
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let (a, b, c, d) = (
            ip("10.88.1.1"),
            ip("10.88.1.2"),
            ip("10.88.1.3"),
            ip("10.88.1.4"),
        );
        assert!(limiter.allow(a, at(0)));
        assert!(limiter.allow(b, at(1)));
        assert!(limiter.allow(c, at(2)));
        assert!(
            !limiter.allow(a, at(3)),
            "a is out of tokens (and heard from last)"
        );
        assert!(
            limiter.allow(d, at(4)),
            "a new source, b the stalest forgotten"
        );
        assert_eq!(limiter.sources(), 3);
        assert!(!limiter.allow(a, at(5)), "a was kept, still without tokens");
        assert!(!limiter.allow(c, at(6)), "c was kept");
        assert!(limiter.allow(b, at(7)), "b starts again with a full burst");
        // A flood of new (say, spoofed) sources keeps memory at the bound.
        for i in 0..1000u32 {
            limiter.allow(IpAddr::from(Ipv4Addr::from(i)), at(10));
            assert!(limiter.sources() <= 3);
        }
    }

    /// A query for `name` as a client sends it, advertising `edns` bytes if any.
    fn query(name: &str, qtype: RecordType, edns: Option<u16>) -> Message {
        let mut m = Message::query();
        m.metadata.id = 9;
        m.metadata.recursion_desired = true;
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
        if let Some(size) = edns {
            let mut e = Edns::new();
            e.set_max_payload(size);
            m.set_edns(e);
        }
        Message::from_vec(&m.to_vec().unwrap()).unwrap()
    }

    /// A headless Service with `n` ready endpoints (an A answer of about 16 bytes each).
    fn wide(n: u8) -> Records {
        Records::build(
            "cluster.local",
            &[DnsService {
                namespace: "default".into(),
                name: "wide".into(),
                cluster_ip: None,
                headless: true,
                ports: Vec::new(),
                endpoints: (0..n)
                    .map(|i| DnsEndpoint {
                        ip: Ipv4Addr::new(10, 88, 1, i),
                        hostname: None,
                        ready: true,
                    })
                    .collect(),
            }],
        )
    }

    #[test]
    fn udp_sizes_are_512_without_edns_and_the_clients_up_to_the_cap() {
        let q = |edns| query("example.com.", RecordType::A, edns);
        assert_eq!(udp_payload_limit(&q(None)), 512);
        assert_eq!(udp_payload_limit(&q(Some(512))), 512);
        assert_eq!(udp_payload_limit(&q(Some(1000))), 1000);
        assert_eq!(udp_payload_limit(&q(Some(4096))), 1232);
        assert_eq!(udp_payload_limit(&q(Some(u16::MAX))), 1232);
    }

    #[test]
    fn udp_answers_past_the_clients_size_are_truncated() {
        let records = wide(60); // about 1 KB of A records
        let name = "wide.default.svc.cluster.local.";
        let reply = |edns, tcp| {
            let request = query(name, RecordType::A, edns);
            let Reply::Answer(answer) = records.answer(&request) else {
                panic!("forwarded")
            };
            Message::from_vec(&encode(&request, &answer, tcp).unwrap()).unwrap()
        };
        let small = reply(None, false);
        assert!(small.metadata.truncation, "512 bytes without EDNS");
        assert!(small.answers.is_empty() && small.additionals.is_empty());
        assert_eq!(small.metadata.id, 9);
        assert_eq!(small.queries.len(), 1, "the question stays");
        assert!(small.to_vec().unwrap().len() <= 512);
        let edns = reply(Some(4096), false);
        assert!(!edns.metadata.truncation);
        assert_eq!(edns.answers.len(), 60, "fits in 1232 bytes");
        let tcp = reply(None, true);
        assert!(!tcp.metadata.truncation);
        assert_eq!(tcp.answers.len(), 60);
        // Past the cap whatever the client advertises.
        let records = wide(100);
        let request = query(name, RecordType::A, Some(4096));
        let Reply::Answer(answer) = records.answer(&request) else {
            panic!("forwarded")
        };
        let bytes = encode(&request, &answer, false).unwrap();
        assert!(bytes.len() <= 1232);
        assert!(Message::from_vec(&bytes).unwrap().metadata.truncation);
    }

    #[test]
    fn relayed_udp_replies_are_fitted_to_the_client_or_dropped() {
        let request = query("example.com.", RecordType::A, None);
        let upstream = |n: u8| {
            let mut m = Message::new(9, MessageType::Response, OpCode::Query);
            m.metadata = Metadata::response_from_request(&request.metadata);
            m.add_queries(request.queries.clone());
            for i in 0..n {
                m.add_answer(Record::from_rdata(
                    request.queries[0].name().clone(),
                    60,
                    RData::A(A(Ipv4Addr::new(192, 0, 2, i))),
                ));
            }
            m.to_vec().unwrap()
        };
        let fits = upstream(2);
        assert_eq!(relay_udp(&request, &fits), Some(fits), "relayed unchanged");
        let big = upstream(60);
        assert!(big.len() > 512);
        let relayed = relay_udp(&request, &big).unwrap();
        assert!(relayed.len() <= 512);
        let relayed = Message::from_vec(&relayed).unwrap();
        assert!(relayed.metadata.truncation);
        assert!(relayed.answers.is_empty());
        assert_eq!(relayed.metadata.id, 9);
        assert_eq!(relay_udp(&request, b"\x00\x09garbage"), None, "not DNS");
        assert_eq!(
            relay_udp(&request, &request.to_vec().unwrap()),
            None,
            "not a response"
        );
    }

    /// Flood the TCP side with more connections than it serves, each sending only a length
    /// (`\xff\xff`) and no body: the server closes them (at once past the cap, after the query
    /// timeout within it) and, all the while, answers UDP; afterwards TCP serves again.
    #[tokio::test]
    async fn a_tcp_flood_is_bounded_and_udp_still_answers() {
        let limits = DnsLimits {
            tcp_connections: 4,
            tcp_query_timeout: Duration::from_secs(2),
            ..DnsLimits::default()
        };
        let udp = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (udp_addr, tcp_addr) = (udp.local_addr().unwrap(), tcp.local_addr().unwrap());
        let (_tx, rx) = tokio::sync::watch::channel(Arc::new(records()));
        let server = tokio::spawn(serve_on(udp, tcp, rx, Vec::new(), limits.clone()));

        let flood = 3 * limits.tcp_connections;
        let start = tokio::time::Instant::now();
        let (closed_tx, mut closed) = tokio::sync::mpsc::unbounded_channel();
        for _ in 0..flood {
            let mut stream = tokio::net::TcpStream::connect(tcp_addr).await.unwrap();
            stream.write_all(b"\xff\xff").await.unwrap();
            let closed_tx = closed_tx.clone();
            tokio::spawn(async move {
                // Returns on EOF or reset: the server closed the connection.
                let _ = stream.read(&mut [0u8; 16]).await;
                let _ = closed_tx.send(tokio::time::Instant::now());
            });
        }
        let deadline = start + Duration::from_secs(30);
        let next_close = async |closed: &mut tokio::sync::mpsc::UnboundedReceiver<_>| {
            tokio::time::timeout_at(deadline, closed.recv())
                .await
                .expect("the server closes the connection")
                .unwrap()
        };
        // Past the cap: closed at once.
        for _ in limits.tcp_connections..flood {
            next_close(&mut closed).await;
        }

        // While the flood holds every connection slot, UDP answers.
        let client = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let ask = query("web.default.svc.cluster.local.", RecordType::A, None);
        client
            .send_to(&ask.to_vec().unwrap(), udp_addr)
            .await
            .unwrap();
        let mut buf = [0u8; 512];
        let (n, _) = tokio::time::timeout(Duration::from_secs(5), client.recv_from(&mut buf))
            .await
            .expect("UDP answered during the flood")
            .unwrap();
        assert_eq!(a_of(&Message::from_vec(&buf[..n]).unwrap()), ["10.96.0.20"]);
        assert!(
            closed.try_recv().is_err(),
            "the connections within the cap were still held"
        );

        // Within the cap: closed after the query timeout.
        for _ in 0..limits.tcp_connections {
            let at = next_close(&mut closed).await;
            assert!(
                at >= start + limits.tcp_query_timeout,
                "closed after the timeout"
            );
        }

        // The slots are free again: a whole query over TCP is answered.
        let mut stream = tokio::net::TcpStream::connect(tcp_addr).await.unwrap();
        let bytes = ask.to_vec().unwrap();
        let mut framed = u16::try_from(bytes.len()).unwrap().to_be_bytes().to_vec();
        framed.extend_from_slice(&bytes);
        stream.write_all(&framed).await.unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(5), async {
            let mut len = [0u8; 2];
            stream.read_exact(&mut len).await?;
            let mut body = vec![0u8; usize::from(u16::from_be_bytes(len))];
            stream.read_exact(&mut body).await?;
            std::io::Result::Ok(body)
        })
        .await
        .expect("TCP answered after the flood")
        .unwrap();
        assert_eq!(a_of(&Message::from_vec(&answer).unwrap()), ["10.96.0.20"]);
        server.abort();
    }
}
