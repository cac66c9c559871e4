//! Forgetting UDP flows whose NAT target is gone, as kube-proxy and CNI's portmap do.
//!
//! A UDP "connection" through a host port or a Service is a conntrack entry made by its first
//! packet: the DNAT chosen then is reused by every later packet with the same addresses and
//! ports, and the entry lives as long as packets keep coming (30 s unreplied, 120 s once
//! replied, refreshed by each packet). When the pod behind it goes away and another takes the
//! port, a client that keeps sending (a DNS resolver, a syslog or statsd agent, a game client)
//! would keep reaching the old pod's address for as long as it sends. So when the node's
//! rules stop leading somewhere, the entries that lead there are deleted ([`stale`] decides
//! which, pure; [`delete`] deletes them over ctnetlink): the client's next packet makes a new
//! entry through the current rules. TCP needs none of this: a connection to a pod that is gone
//! is reset.
//!
//! Deleting is a dump of the namespace's IPv4 conntrack table and one `IPCTNL_MSG_CT_DELETE`
//! per matching entry, which is what `conntrack -D -p udp …` does (no tool needed on the
//! node). The kernel's messages are parsed defensively: a short or malformed attribute ends
//! that message's parse, never the process.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};

use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, sendto,
    setsockopt, socket, sockopt,
};

use crate::NetError;
use crate::nft::{HostPortRule, ServicePort};

/// UDP flows to delete: those whose original destination is `dst` (any address when `None`)
/// port `port`, and which lead to `target`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct StaleFlows {
    pub dst: Option<Ipv4Addr>,
    pub port: u16,
    pub target: Target,
}

/// Where a stale flow leads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    /// DNATed to this pod address and port, which the rules no longer lead to.
    Pod(Ipv4Addr, u16),
    /// Not translated at all: made while nothing served the port (the node answered it
    /// itself, with an ICMP error), so a mapping made since would never apply to it.
    Unserved,
}

/// What the rules lead where for UDP: (destination, port) → target, as [`StaleFlows`] reads
/// them. A Service leads only where it has endpoints (without, its ClusterIP rejects, which
/// leaves no entry behind).
fn served<'a>(
    services: &'a [ServicePort],
    host_ports: &'a [HostPortRule],
) -> BTreeSet<(Option<Ipv4Addr>, u16, (Ipv4Addr, u16))> {
    let mut out = BTreeSet::new();
    for p in services.iter().filter(|p| p.protocol == "udp") {
        for endpoint in &p.endpoints {
            out.insert((Some(p.cluster_ip), p.port, *endpoint));
            if let Some(node_port) = p.node_port {
                out.insert((None, node_port, *endpoint));
            }
        }
    }
    for h in host_ports.iter().filter(|h| h.protocol == "udp") {
        out.insert((h.host_ip, h.port, (h.pod_ip, h.container_port)));
    }
    out
}

/// The UDP flows a change of the rules (`services`, `host_ports`) from `before` to `after`
/// leaves stale, as kube-proxy and the kubelet's host-port manager clear them: those leading
/// to a target the rules no longer lead to (an endpoint a Service lost, on its ClusterIP or
/// its NodePort; a host port now leading elsewhere or nowhere), and, on a port the rules
/// serve now and did not before (a new host port, a NodePort whose Service got its first
/// endpoint), those made untranslated. Flows still leading where the rules lead are kept: a
/// Service that only gained endpoints keeps every client where it is.
pub fn stale(
    before: (&[ServicePort], &[HostPortRule]),
    after: (&[ServicePort], &[HostPortRule]),
) -> Vec<StaleFlows> {
    let (before, after) = (served(before.0, before.1), served(after.0, after.1));
    let ports = |set: &BTreeSet<(Option<Ipv4Addr>, u16, (Ipv4Addr, u16))>| {
        set.iter()
            .map(|(dst, port, _)| (*dst, *port))
            .collect::<BTreeSet<_>>()
    };
    let mut out: Vec<StaleFlows> = before
        .difference(&after)
        .map(|&(dst, port, (ip, target_port))| StaleFlows {
            dst,
            port,
            target: Target::Pod(ip, target_port),
        })
        .collect();
    out.extend(
        ports(&after)
            .difference(&ports(&before))
            .map(|&(dst, port)| StaleFlows {
                dst,
                port,
                target: Target::Unserved,
            }),
    );
    out.sort();
    out
}

/// One conntrack tuple (one direction of a flow).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tuple {
    src: Ipv4Addr,
    dst: Ipv4Addr,
    protocol: u8,
    sport: u16,
    dport: u16,
}

/// One conntrack entry as the dump describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    orig: Tuple,
    reply: Tuple,
    zone: Option<u16>,
}

const UDP: u8 = 17;

impl StaleFlows {
    fn matches(&self, e: &Entry) -> bool {
        e.orig.protocol == UDP
            && e.orig.dport == self.port
            && self.dst.is_none_or(|d| e.orig.dst == d)
            && match self.target {
                Target::Pod(ip, port) => (e.reply.src, e.reply.sport) == (ip, port),
                // Neither destination nor source translated (a pod's flow out of the node is
                // masqueraded: not one of these).
                Target::Unserved => {
                    (e.reply.src, e.reply.sport, e.reply.dst, e.reply.dport)
                        == (e.orig.dst, e.orig.dport, e.orig.src, e.orig.sport)
                }
            }
    }
}

// Netlink and ctnetlink constants (linux/netlink.h, linux/netfilter/nfnetlink*.h).
const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLM_F_DUMP: u16 = 0x300;
const NLA_F_NESTED: u16 = 0x8000;
const NLA_TYPE_MASK: u16 = 0x3fff;
const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;
const AF_INET: u8 = 2;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_ZONE: u16 = 18;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;

/// A netlink message being built: header, nfgenmsg, attributes.
struct Message(Vec<u8>);

impl Message {
    fn new(kind: u16, flags: u16, seq: u32) -> Self {
        let mut b = Vec::with_capacity(128);
        b.extend_from_slice(&0u32.to_ne_bytes()); // length, set by `finish`
        b.extend_from_slice(&((NFNL_SUBSYS_CTNETLINK << 8) | kind).to_ne_bytes());
        b.extend_from_slice(&flags.to_ne_bytes());
        b.extend_from_slice(&seq.to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it in
        b.extend_from_slice(&[AF_INET, 0, 0, 0]); // nfgenmsg: family, version 0, res_id 0
        Message(b)
    }

    fn attr(&mut self, kind: u16, payload: &[u8]) {
        let len = 4 + payload.len();
        self.0.extend_from_slice(&(len as u16).to_ne_bytes());
        self.0.extend_from_slice(&kind.to_ne_bytes());
        self.0.extend_from_slice(payload);
        self.pad();
    }

    /// Opens a nested attribute; `end` closes it.
    fn begin(&mut self, kind: u16) -> usize {
        let at = self.0.len();
        self.0.extend_from_slice(&0u16.to_ne_bytes());
        self.0
            .extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        at
    }

    fn end(&mut self, at: usize) {
        let len = (self.0.len() - at) as u16;
        self.0[at..at + 2].copy_from_slice(&len.to_ne_bytes());
    }

    fn pad(&mut self) {
        while !self.0.len().is_multiple_of(4) {
            self.0.push(0);
        }
    }

    fn finish(mut self) -> Vec<u8> {
        let len = self.0.len() as u32;
        self.0[0..4].copy_from_slice(&len.to_ne_bytes());
        self.0
    }
}

/// The request deleting `e` (found by its original tuple, in its zone).
fn delete_request(e: &Entry, seq: u32) -> Vec<u8> {
    let mut m = Message::new(IPCTNL_MSG_CT_DELETE, NLM_F_REQUEST | NLM_F_ACK, seq);
    let tuple = m.begin(CTA_TUPLE_ORIG);
    let ip = m.begin(CTA_TUPLE_IP);
    m.attr(CTA_IP_V4_SRC, &e.orig.src.octets());
    m.attr(CTA_IP_V4_DST, &e.orig.dst.octets());
    m.end(ip);
    let proto = m.begin(CTA_TUPLE_PROTO);
    m.attr(CTA_PROTO_NUM, &[e.orig.protocol]);
    m.attr(CTA_PROTO_SRC_PORT, &e.orig.sport.to_be_bytes());
    m.attr(CTA_PROTO_DST_PORT, &e.orig.dport.to_be_bytes());
    m.end(proto);
    m.end(tuple);
    if let Some(zone) = e.zone {
        m.attr(CTA_ZONE, &zone.to_be_bytes());
    }
    m.finish()
}

/// The attributes in `b`, as (type without flags, payload); stops at the first malformed one.
fn attrs(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
        let kind = u16::from_ne_bytes([b[2], b[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > b.len() {
            return None;
        }
        let payload = &b[4..len];
        b = &b[len.next_multiple_of(4).min(b.len())..];
        Some((kind, payload))
    })
}

fn tuple(b: &[u8]) -> Option<Tuple> {
    let (mut src, mut dst, mut protocol, mut sport, mut dport) = (None, None, None, 0, 0);
    for (kind, payload) in attrs(b) {
        match kind {
            CTA_TUPLE_IP => {
                for (kind, p) in attrs(payload) {
                    let ip = <[u8; 4]>::try_from(p).ok().map(Ipv4Addr::from);
                    match kind {
                        CTA_IP_V4_SRC => src = ip,
                        CTA_IP_V4_DST => dst = ip,
                        _ => {}
                    }
                }
            }
            CTA_TUPLE_PROTO => {
                for (kind, p) in attrs(payload) {
                    let port = <[u8; 2]>::try_from(p).ok().map(u16::from_be_bytes);
                    match kind {
                        CTA_PROTO_NUM => protocol = p.first().copied(),
                        CTA_PROTO_SRC_PORT => sport = port.unwrap_or(0),
                        CTA_PROTO_DST_PORT => dport = port.unwrap_or(0),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Some(Tuple {
        src: src?,
        dst: dst?,
        protocol: protocol?,
        sport,
        dport,
    })
}

/// The entry a ctnetlink message's body (after the nfgenmsg) describes, if it is IPv4.
fn entry(body: &[u8]) -> Option<Entry> {
    let (mut orig, mut reply, mut zone) = (None, None, None);
    for (kind, payload) in attrs(body) {
        match kind {
            CTA_TUPLE_ORIG => orig = tuple(payload),
            CTA_TUPLE_REPLY => reply = tuple(payload),
            CTA_ZONE => zone = <[u8; 2]>::try_from(payload).ok().map(u16::from_be_bytes),
            _ => {}
        }
    }
    Some(Entry {
        orig: orig?,
        reply: reply?,
        zone,
    })
}

/// What one datagram from the kernel holds.
#[derive(Debug, Default, PartialEq)]
struct Batch {
    entries: Vec<Entry>,
    /// The dump or request is over (NLMSG_DONE, or an error message: 0 is an ack).
    done: Option<i32>,
}

fn parse(mut b: &[u8]) -> Batch {
    let mut batch = Batch::default();
    while b.len() >= NLMSG_HDRLEN {
        let len = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]) as usize;
        let kind = u16::from_ne_bytes([b[4], b[5]]);
        if len < NLMSG_HDRLEN || len > b.len() {
            break;
        }
        let body = &b[NLMSG_HDRLEN..len];
        match kind {
            NLMSG_DONE => batch.done = Some(0),
            NLMSG_ERROR => {
                batch.done = Some(
                    <[u8; 4]>::try_from(body.get(..4).unwrap_or_default())
                        .map(i32::from_ne_bytes)
                        .unwrap_or(-(nix::errno::Errno::EPROTO as i32)),
                )
            }
            _ => {
                if let Some(e) = body.get(4..).and_then(entry) {
                    batch.entries.push(e);
                }
            }
        }
        b = &b[len.next_multiple_of(4).min(b.len())..];
    }
    batch
}

fn netlink_error(op: &str, message: impl std::fmt::Display) -> NetError {
    NetError::Netlink {
        op: op.to_owned(),
        message: message.to_string(),
    }
}

fn open() -> Result<OwnedFd, NetError> {
    let fd = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkNetFilter,
    )
    .map_err(|e| netlink_error("conntrack socket", e))?;
    bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0))
        .map_err(|e| netlink_error("conntrack bind", e))?;
    // A kernel that never answers must not hold the caller forever.
    setsockopt(
        &fd,
        sockopt::ReceiveTimeout,
        &nix::sys::time::TimeVal::new(5, 0),
    )
    .map_err(|e| netlink_error("conntrack timeout", e))?;
    Ok(fd)
}

fn send(fd: &OwnedFd, message: &[u8]) -> Result<(), NetError> {
    sendto(
        fd.as_raw_fd(),
        message,
        &NetlinkAddr::new(0, 0),
        MsgFlags::empty(),
    )
    .map_err(|e| netlink_error("conntrack send", e))?;
    Ok(())
}

/// Reads datagrams until the request ends; the entries they list go to `each`. Returns the
/// request's outcome: 0, or the kernel's negative errno.
fn receive(fd: &OwnedFd, op: &str, mut each: impl FnMut(Entry)) -> Result<i32, NetError> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n =
            recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()).map_err(|e| netlink_error(op, e))?;
        let batch = parse(&buf[..n]);
        batch.entries.into_iter().for_each(&mut each);
        if let Some(code) = batch.done {
            return Ok(code);
        }
    }
}

fn refused(op: &str, code: i32) -> NetError {
    netlink_error(op, nix::errno::Errno::from_raw(code.saturating_neg()))
}

/// Deletes the conntrack entries of this network namespace that `stale` describes; returns
/// how many were deleted (an entry that expired meanwhile is not an error).
pub fn delete(stale: &[StaleFlows]) -> Result<usize, NetError> {
    if stale.is_empty() {
        return Ok(0);
    }
    let fd = open()?;
    let mut doomed = Vec::new();
    send(
        &fd,
        &Message::new(IPCTNL_MSG_CT_GET, NLM_F_REQUEST | NLM_F_DUMP, 1).finish(),
    )?;
    let code = receive(&fd, "conntrack dump", |e| {
        if stale.iter().any(|s| s.matches(&e)) {
            doomed.push(e);
        }
    })?;
    if code != 0 {
        return Err(refused("conntrack dump", code));
    }
    let mut deleted = 0;
    for (seq, e) in (2..).zip(&doomed) {
        send(&fd, &delete_request(e, seq))?;
        match receive(&fd, "conntrack delete", |_| {})? {
            0 => deleted += 1,
            code if code == -(nix::errno::Errno::ENOENT as i32) => {}
            code => return Err(refused("conntrack delete", code)),
        }
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    fn service(endpoints: &[(&str, u16)], node_port: Option<u16>) -> ServicePort {
        ServicePort {
            cluster_ip: ip("10.96.0.10"),
            port: 53,
            protocol: "udp".into(),
            endpoints: endpoints.iter().map(|(a, p)| (ip(a), *p)).collect(),
            node_port,
            affinity_seconds: None,
        }
    }

    fn host_port(pod: &str, protocol: &str) -> HostPortRule {
        HostPortRule {
            host_ip: None,
            port: 5353,
            protocol: protocol.into(),
            pod_ip: ip(pod),
            container_port: 53,
        }
    }

    /// One change of the rules and the flows it leaves stale.
    struct Case {
        before: (Vec<ServicePort>, Vec<HostPortRule>),
        after: (Vec<ServicePort>, Vec<HostPortRule>),
        stale: Vec<StaleFlows>,
    }

    #[test]
    fn flows_to_targets_the_rules_left_are_stale_and_no_others() {
        let pod = |dst: Option<&str>, port, target: &str| StaleFlows {
            dst: dst.map(ip),
            port,
            target: Target::Pod(ip(target), 53),
        };
        let unserved = |dst: Option<&str>, port| StaleFlows {
            dst: dst.map(ip),
            port,
            target: Target::Unserved,
        };
        let one = || service(&[("10.1.0.5", 53)], None);
        let tcp = ServicePort {
            protocol: "tcp".into(),
            ..one()
        };
        let cases = [
            // Nothing changed.
            Case {
                before: (vec![one()], vec![]),
                after: (vec![one()], vec![]),
                stale: vec![],
            },
            // An endpoint gained: every client keeps its endpoint.
            Case {
                before: (vec![one()], vec![]),
                after: (
                    vec![service(&[("10.1.0.5", 53), ("10.1.0.6", 53)], None)],
                    vec![],
                ),
                stale: vec![],
            },
            // An endpoint lost: its ClusterIP flows and its NodePort flows.
            Case {
                before: (
                    vec![service(&[("10.1.0.5", 53), ("10.1.0.6", 53)], Some(30053))],
                    vec![],
                ),
                after: (vec![service(&[("10.1.0.6", 53)], Some(30053))], vec![]),
                stale: vec![
                    pod(None, 30053, "10.1.0.5"),
                    pod(Some("10.96.0.10"), 53, "10.1.0.5"),
                ],
            },
            // The Service gone.
            Case {
                before: (vec![one()], vec![]),
                after: (vec![], vec![]),
                stale: vec![pod(Some("10.96.0.10"), 53, "10.1.0.5")],
            },
            // Its NodePort gone, its endpoints kept.
            Case {
                before: (vec![service(&[("10.1.0.5", 53)], Some(30053))], vec![]),
                after: (vec![one()], vec![]),
                stale: vec![pod(None, 30053, "10.1.0.5")],
            },
            // A NodePort Service's first endpoint: flows the node answered itself go, and
            // flows to its ClusterIP that went untranslated (while it had none).
            Case {
                before: (vec![service(&[], Some(30053))], vec![]),
                after: (vec![service(&[("10.1.0.5", 53)], Some(30053))], vec![]),
                stale: vec![unserved(None, 30053), unserved(Some("10.96.0.10"), 53)],
            },
            // TCP: a reset does it.
            Case {
                before: (vec![tcp.clone()], vec![host_port("10.1.0.5", "tcp")]),
                after: (vec![], vec![]),
                stale: vec![],
            },
            // A new host port; one that moved to another pod; one that went away.
            Case {
                before: (vec![], vec![]),
                after: (vec![], vec![host_port("10.1.0.5", "udp")]),
                stale: vec![unserved(None, 5353)],
            },
            Case {
                before: (vec![], vec![host_port("10.1.0.5", "udp")]),
                after: (vec![], vec![host_port("10.1.0.7", "udp")]),
                stale: vec![pod(None, 5353, "10.1.0.5")],
            },
            Case {
                before: (
                    vec![],
                    vec![HostPortRule {
                        host_ip: Some(ip("192.0.2.1")),
                        ..host_port("10.1.0.5", "udp")
                    }],
                ),
                after: (vec![], vec![]),
                stale: vec![pod(Some("192.0.2.1"), 5353, "10.1.0.5")],
            },
        ];
        for (i, c) in cases.iter().enumerate() {
            assert_eq!(
                stale((&c.before.0, &c.before.1), (&c.after.0, &c.after.1)),
                c.stale,
                "case {i}"
            );
        }
    }

    fn entry_of(orig: (&str, u16, &str, u16), reply: (&str, u16, &str, u16)) -> Entry {
        let t = |(src, sport, dst, dport): (&str, u16, &str, u16)| Tuple {
            src: ip(src),
            dst: ip(dst),
            protocol: UDP,
            sport,
            dport,
        };
        Entry {
            orig: t(orig),
            reply: t(reply),
            zone: None,
        }
    }

    #[test]
    fn a_flow_matches_by_destination_port_and_the_target_its_replies_come_from() {
        let stale = StaleFlows {
            dst: None,
            port: 5353,
            target: Target::Pod(ip("10.1.0.5"), 53),
        };
        // A client's flow to the node's address, DNATed to the old pod.
        let nated = entry_of(
            ("192.0.2.9", 40000, "192.0.2.1", 5353),
            ("10.1.0.5", 53, "192.0.2.9", 40000),
        );
        assert!(stale.matches(&nated));
        // The same flow already leading to the new pod; another port; TCP.
        let moved = entry_of(
            ("192.0.2.9", 40000, "192.0.2.1", 5353),
            ("10.1.0.7", 53, "192.0.2.9", 40000),
        );
        assert!(!stale.matches(&moved));
        let other_port = entry_of(
            ("192.0.2.9", 40000, "192.0.2.1", 5354),
            ("10.1.0.5", 53, "192.0.2.9", 40000),
        );
        assert!(!stale.matches(&other_port));
        let mut tcp = nated;
        tcp.orig.protocol = 6;
        assert!(!stale.matches(&tcp));
        let on_one_address = StaleFlows {
            dst: Some(ip("192.0.2.2")),
            ..stale
        };
        assert!(!on_one_address.matches(&nated));
        // Untranslated: a flow the node answered itself matches; a DNATed one, and a pod's
        // flow out that was masqueraded, do not.
        let unserved = StaleFlows {
            target: Target::Unserved,
            ..stale
        };
        let answered = entry_of(
            ("192.0.2.9", 40000, "192.0.2.1", 5353),
            ("192.0.2.1", 5353, "192.0.2.9", 40000),
        );
        assert!(unserved.matches(&answered) && !stale.matches(&answered));
        assert!(!unserved.matches(&nated));
        let masqueraded = entry_of(
            ("10.1.0.5", 40000, "198.51.100.1", 5353),
            ("198.51.100.1", 5353, "192.0.2.1", 40000),
        );
        assert!(!unserved.matches(&masqueraded));
    }

    /// A kernel message listing `e`, as a dump brings it (attributes nested with the flag set).
    fn dumped(e: &Entry) -> Vec<u8> {
        let mut m = Message::new(0, 2, 1);
        for (kind, t) in [(CTA_TUPLE_ORIG, e.orig), (CTA_TUPLE_REPLY, e.reply)] {
            let at = m.begin(kind);
            let ip = m.begin(CTA_TUPLE_IP);
            m.attr(CTA_IP_V4_SRC, &t.src.octets());
            m.attr(CTA_IP_V4_DST, &t.dst.octets());
            m.end(ip);
            let proto = m.begin(CTA_TUPLE_PROTO);
            m.attr(CTA_PROTO_NUM, &[t.protocol]);
            m.attr(CTA_PROTO_SRC_PORT, &t.sport.to_be_bytes());
            m.attr(CTA_PROTO_DST_PORT, &t.dport.to_be_bytes());
            m.end(proto);
            m.end(at);
        }
        m.attr(CTA_ZONE, &7u16.to_be_bytes());
        m.finish()
    }

    #[test]
    fn dumps_parse_back_and_malformed_bytes_end_the_parse_without_a_panic() {
        let e = entry_of(
            ("192.0.2.9", 40000, "192.0.2.1", 5353),
            ("10.1.0.5", 53, "192.0.2.9", 40000),
        );
        let mut two = dumped(&e);
        two.extend(dumped(&e));
        let mut done = Message::new(0, 2, 1).finish();
        done[4..6].copy_from_slice(&NLMSG_DONE.to_ne_bytes());
        two.extend(&done);
        let batch = parse(&two);
        let want = Entry { zone: Some(7), ..e };
        assert_eq!(batch.entries, vec![want, want]);
        assert_eq!(batch.done, Some(0));
        // The delete request carries what the dump said: the original tuple and the zone.
        let request = delete_request(&want, 9);
        let body = &request[NLMSG_HDRLEN + 4..];
        let find = |kind| attrs(body).find(|(k, _)| *k == kind).map(|(_, p)| p);
        assert_eq!(find(CTA_TUPLE_ORIG).and_then(tuple), Some(want.orig));
        assert_eq!(find(CTA_ZONE), Some(&7u16.to_be_bytes()[..]));
        // Every truncation and every corrupted byte: no panic, and never an invented entry.
        let one = dumped(&e);
        for cut in 0..one.len() {
            let b = parse(&one[..cut]);
            assert!(b.entries.is_empty() || cut == one.len(), "cut {cut}");
        }
        for i in 0..one.len() {
            for v in [0u8, 0xff, 3] {
                let mut bad = one.clone();
                bad[i] = v;
                let _ = parse(&bad);
            }
        }
        // An error message ends the request with its code.
        let mut error = Vec::new();
        error.extend(20u32.to_ne_bytes());
        error.extend(NLMSG_ERROR.to_ne_bytes());
        error.extend([0; 10]);
        error.extend((-2i32).to_ne_bytes());
        assert_eq!(parse(&error).done, Some(-2));
    }
}
