//! Service ClusterIPs from `--service-cidr`.
//!
//! Any agent may create a Service, so the address is chosen where it is created, from what
//! that agent's store holds: the first free address at or after a hash of the Service's
//! namespace and name (linear probing). Two agents creating different Services at once only
//! pick the same address if their hashes collide within the propagation window; after such a
//! race (or a partition) every agent agrees on one owner ([`owners`]: the Service created
//! first keeps it) and the agent that owns the other repairs it with [`allocate`].
//!
//! Pure: the caller passes the addresses in use.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use sha2::{Digest, Sha256};

pub const DEFAULT_SERVICE_CIDR: &str = "10.96.0.0/16";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServiceIpError {
    #[error("the service CIDR {cidr} is full: all {capacity} addresses are allocated")]
    Exhausted { cidr: Ipv4Net, capacity: u64 },
    #[error("{ip} is not in the service CIDR {cidr}")]
    OutsideRange { ip: Ipv4Addr, cidr: Ipv4Net },
    #[error("{ip} is the service CIDR's network, broadcast or reserved first address")]
    Reserved { ip: Ipv4Addr },
    #[error("the service CIDR {cidr} is too small (at most /28)")]
    TooSmall { cidr: Ipv4Net },
}

/// The usable addresses of `cidr`: all but the network address, the first host (reserved, as
/// Kubernetes keeps it for the `kubernetes` Service) and the broadcast address.
fn usable(cidr: Ipv4Net) -> Result<(u64, u64), ServiceIpError> {
    if cidr.prefix_len() > 28 {
        return Err(ServiceIpError::TooSmall { cidr });
    }
    let base = u64::from(u32::from(cidr.network()));
    let size = 1u64 << (32 - u32::from(cidr.prefix_len()));
    Ok((base + 2, size - 3))
}

fn addr(n: u64) -> Ipv4Addr {
    Ipv4Addr::from(u32::try_from(n).unwrap_or(u32::MAX))
}

/// Checks an address a user asked for.
pub fn check(cidr: Ipv4Net, ip: Ipv4Addr) -> Result<(), ServiceIpError> {
    if !cidr.contains(&ip) {
        return Err(ServiceIpError::OutsideRange { ip, cidr });
    }
    let (first, count) = usable(cidr)?;
    let n = u64::from(u32::from(ip));
    if n < first || n >= first + count {
        return Err(ServiceIpError::Reserved { ip });
    }
    Ok(())
}

/// The address for Service `namespace/name`: the first of `cidr`'s usable addresses, from the
/// name's hash on, that is not in `used`.
pub fn allocate(
    cidr: Ipv4Net,
    namespace: &str,
    name: &str,
    used: &BTreeSet<Ipv4Addr>,
) -> Result<Ipv4Addr, ServiceIpError> {
    let (first, count) = usable(cidr)?;
    let mut hash = Sha256::new();
    hash.update(namespace.as_bytes());
    hash.update([b'/']);
    hash.update(name.as_bytes());
    let start = u64::from(u32::from_be_bytes(
        hash.finalize()[..4].try_into().expect("4 bytes"),
    )) % count;
    (0..count)
        .map(|i| addr(first + (start + i) % count))
        .find(|ip| !used.contains(ip))
        .ok_or(ServiceIpError::Exhausted {
            cidr,
            capacity: count,
        })
}

/// The NodePort range (Kubernetes' default `--service-node-port-range`).
pub const NODE_PORTS: std::ops::RangeInclusive<u16> = 30000..=32767;

/// A node port for port `port_name` of Service `namespace/name`: the first free one of
/// [`NODE_PORTS`] from the names' hash on.
pub fn allocate_node_port(
    namespace: &str,
    name: &str,
    port_name: &str,
    used: &BTreeSet<u16>,
) -> Option<u16> {
    let (first, count) = (*NODE_PORTS.start(), NODE_PORTS.len() as u32);
    let mut hash = Sha256::new();
    for part in [namespace, name, port_name] {
        hash.update(part.as_bytes());
        hash.update([0]);
    }
    let start = u32::from_be_bytes(hash.finalize()[..4].try_into().expect("4 bytes")) % count;
    (0..count)
        .map(|i| first + ((start + i) % count) as u16)
        .find(|p| !used.contains(p))
}

/// One Service's claim to an address: who created it when (creation time, then uid, orders
/// claims the same way on every agent).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Claim {
    pub created: String,
    pub uid: String,
    pub key: String,
}

/// For each address claimed by several Services, the one that keeps it (created first); the
/// others are returned as `losers` and must be given another address.
pub fn owners(
    claims: impl IntoIterator<Item = (Ipv4Addr, Claim)>,
) -> (BTreeMap<Ipv4Addr, Claim>, Vec<Claim>) {
    let mut owners: BTreeMap<Ipv4Addr, Claim> = BTreeMap::new();
    let mut losers = Vec::new();
    for (ip, claim) in claims {
        match owners.get(&ip) {
            Some(current) if *current <= claim => losers.push(claim),
            Some(_) => {
                let old = owners.insert(ip, claim).expect("present");
                losers.push(old);
            }
            None => {
                owners.insert(ip, claim);
            }
        }
    }
    losers.sort();
    (owners, losers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr() -> Ipv4Net {
        "10.96.0.0/24".parse().unwrap()
    }

    #[test]
    fn allocation_is_deterministic_and_skips_used_and_reserved_addresses() {
        let a = allocate(cidr(), "default", "web", &BTreeSet::new()).unwrap();
        assert_eq!(
            a,
            allocate(cidr(), "default", "web", &BTreeSet::new()).unwrap()
        );
        assert!(check(cidr(), a).is_ok());
        let used: BTreeSet<_> = [a].into();
        let b = allocate(cidr(), "default", "web", &used).unwrap();
        assert_ne!(a, b);
        let all: BTreeSet<Ipv4Addr> = (2..255).map(|i| Ipv4Addr::new(10, 96, 0, i)).collect();
        assert_eq!(
            allocate(cidr(), "default", "x", &all),
            Err(ServiceIpError::Exhausted {
                cidr: cidr(),
                capacity: 253
            })
        );
        for reserved in ["10.96.0.0", "10.96.0.1", "10.96.0.255"] {
            assert!(matches!(
                check(cidr(), reserved.parse().unwrap()),
                Err(ServiceIpError::Reserved { .. })
            ));
        }
        assert!(matches!(
            check(cidr(), "10.97.0.5".parse().unwrap()),
            Err(ServiceIpError::OutsideRange { .. })
        ));
    }

    #[test]
    fn node_ports_stay_in_range_and_skip_used_ones() {
        let a = allocate_node_port("default", "web", "http", &BTreeSet::new()).unwrap();
        assert!(NODE_PORTS.contains(&a));
        let b = allocate_node_port("default", "web", "http", &[a].into()).unwrap();
        assert_ne!(a, b);
        let all: BTreeSet<u16> = NODE_PORTS.collect();
        assert_eq!(allocate_node_port("default", "web", "http", &all), None);
    }

    #[test]
    fn the_widest_ranges_do_not_overflow() {
        for cidr in ["0.0.0.0/0", "128.0.0.0/1"] {
            let cidr: Ipv4Net = cidr.parse().unwrap();
            let ip = allocate(cidr, "default", "web", &BTreeSet::new()).unwrap();
            assert!(check(cidr, ip).is_ok());
        }
    }

    #[test]
    fn a_fuller_range_still_finds_the_free_addresses() {
        let mut used = BTreeSet::new();
        for i in 0..253 {
            let ip = allocate(cidr(), "ns", &format!("svc{i}"), &used).unwrap();
            assert!(used.insert(ip), "unique");
        }
        assert_eq!(used.len(), 253);
    }

    #[test]
    fn the_first_created_keeps_a_shared_address() {
        let ip: Ipv4Addr = "10.96.0.9".parse().unwrap();
        let claim = |t: &str, uid: &str| Claim {
            created: t.into(),
            uid: uid.into(),
            key: format!("default/{uid}"),
        };
        let (owners, losers) = owners([
            (ip, claim("2026-01-02T00:00:00Z", "b")),
            (ip, claim("2026-01-01T00:00:00Z", "c")),
            (ip, claim("2026-01-02T00:00:00Z", "a")),
            (
                "10.96.0.10".parse().unwrap(),
                claim("2026-01-03T00:00:00Z", "d"),
            ),
        ]);
        assert_eq!(owners[&ip].uid, "c");
        assert_eq!(
            losers.iter().map(|c| c.uid.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(owners.len(), 2);
    }
}
