//! Pod addresses within one node's block.
//!
//! Pure: no files. On restart the agent rebuilds the allocator from the network records of the
//! pods it still has ([`Ipam::restore`]), so the allocator and the pods can never disagree, and
//! a record that does not fit (another block, a duplicate) is refused by name — its pod is then
//! given a fresh address.
//!
//! The block's first host address is the gateway (the bridge); the network and broadcast
//! addresses are never handed out. Allocation continues after the last address handed out
//! (like CNI's host-local), so an address just released is the last to be reused: a peer that
//! still routes to a deleted pod does not reach its successor at once.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IpamError {
    #[error("pod CIDR {block}: a /{prefix} block is too small for pods (at most /30)", prefix = .block.prefix_len())]
    BlockTooSmall { block: Ipv4Net },
    #[error("pod CIDR {block}: a /{prefix} block is larger than a node can use (at least /8)", prefix = .block.prefix_len())]
    BlockTooLarge { block: Ipv4Net },
    #[error("pod CIDR {block} is exhausted: all {capacity} addresses are in use")]
    Exhausted { block: Ipv4Net, capacity: u32 },
    #[error("pod {uid}: recorded address {ip} is not a pod address of this node's block {block}")]
    OutsideBlock {
        uid: String,
        ip: Ipv4Addr,
        block: Ipv4Net,
    },
    #[error("pod {uid}: recorded address {ip} is already held by pod {holder}")]
    Duplicate {
        uid: String,
        ip: Ipv4Addr,
        holder: String,
    },
}

/// The allocator of one block.
#[derive(Debug, Clone)]
pub struct Ipam {
    block: Ipv4Net,
    by_ip: BTreeMap<u32, String>,
    by_uid: BTreeMap<String, Ipv4Addr>,
    /// The offset (from the network address) handed out last.
    last: Option<u32>,
}

impl Ipam {
    pub fn new(block: Ipv4Net) -> Result<Self, IpamError> {
        let block = block.trunc();
        if block.prefix_len() > 30 {
            return Err(IpamError::BlockTooSmall { block });
        }
        if block.prefix_len() < 8 {
            return Err(IpamError::BlockTooLarge { block });
        }
        Ok(Self {
            block,
            by_ip: BTreeMap::new(),
            by_uid: BTreeMap::new(),
            last: None,
        })
    }

    pub fn block(&self) -> Ipv4Net {
        self.block
    }

    /// The bridge's address: the block's first host address.
    pub fn gateway(&self) -> Ipv4Addr {
        self.at(1)
    }

    /// How many pods the block holds (all hosts but the gateway).
    pub fn capacity(&self) -> u32 {
        self.size() - 3
    }

    /// Pods holding an address.
    pub fn len(&self) -> usize {
        self.by_uid.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_uid.is_empty()
    }

    fn size(&self) -> u32 {
        1u32 << (32 - u32::from(self.block.prefix_len()))
    }

    fn at(&self, offset: u32) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.block.network()).wrapping_add(offset))
    }

    /// The offset of `ip` if it is a pod address of the block.
    fn pod_offset(&self, ip: Ipv4Addr) -> Option<u32> {
        if !self.block.contains(&ip) {
            return None;
        }
        let offset = u32::from(ip) - u32::from(self.block.network());
        (2..self.size() - 1).contains(&offset).then_some(offset)
    }

    /// The pod's address, if it has one.
    pub fn get(&self, uid: &str) -> Option<Ipv4Addr> {
        self.by_uid.get(uid).copied()
    }

    /// Re-registers an address a pod already has (read back from its record on restart).
    pub fn restore(&mut self, uid: &str, ip: Ipv4Addr) -> Result<(), IpamError> {
        let offset = self.pod_offset(ip).ok_or_else(|| IpamError::OutsideBlock {
            uid: uid.to_owned(),
            ip,
            block: self.block,
        })?;
        match self.by_ip.get(&offset) {
            Some(holder) if holder == uid => return Ok(()),
            Some(holder) => {
                return Err(IpamError::Duplicate {
                    uid: uid.to_owned(),
                    ip,
                    holder: holder.clone(),
                });
            }
            None => {}
        }
        if let Some(old) = self.by_uid.insert(uid.to_owned(), ip) {
            self.by_ip
                .remove(&(u32::from(old) - u32::from(self.block.network())));
        }
        self.by_ip.insert(offset, uid.to_owned());
        self.last = self.last.max(Some(offset));
        Ok(())
    }

    /// The pod's address: the one it holds, or the next free one after the last handed out.
    pub fn allocate(&mut self, uid: &str) -> Result<Ipv4Addr, IpamError> {
        if let Some(ip) = self.get(uid) {
            return Ok(ip);
        }
        let first = 2;
        let end = self.size() - 1; // broadcast
        let span = end - first;
        let last = self.last.map_or(span - 1, |o| o - first);
        for step in 1..=span {
            let offset = first + (last + step) % span;
            if let std::collections::btree_map::Entry::Vacant(slot) = self.by_ip.entry(offset) {
                slot.insert(uid.to_owned());
                let ip = self.at(offset);
                self.by_uid.insert(uid.to_owned(), ip);
                self.last = Some(offset);
                return Ok(ip);
            }
        }
        Err(IpamError::Exhausted {
            block: self.block,
            capacity: self.capacity(),
        })
    }

    /// Frees the pod's address; returns it.
    pub fn release(&mut self, uid: &str) -> Option<Ipv4Addr> {
        let ip = self.by_uid.remove(uid)?;
        self.by_ip
            .remove(&(u32::from(ip) - u32::from(self.block.network())));
        Some(ip)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    #[test]
    fn hands_out_hosts_after_the_gateway_and_never_network_or_broadcast() {
        let mut ipam = Ipam::new(net("10.88.3.0/29")).unwrap();
        assert_eq!(ipam.gateway(), "10.88.3.1".parse::<Ipv4Addr>().unwrap());
        assert_eq!(ipam.capacity(), 5);
        let ips: Vec<String> = (0..5)
            .map(|i| ipam.allocate(&format!("p{i}")).unwrap().to_string())
            .collect();
        assert_eq!(
            ips,
            [
                "10.88.3.2",
                "10.88.3.3",
                "10.88.3.4",
                "10.88.3.5",
                "10.88.3.6"
            ]
        );
        assert_eq!(
            ipam.allocate("p9"),
            Err(IpamError::Exhausted {
                block: net("10.88.3.0/29"),
                capacity: 5
            })
        );
        assert_eq!(
            ipam.allocate("p2").unwrap().to_string(),
            "10.88.3.4",
            "idempotent per pod"
        );
    }

    #[test]
    fn a_released_address_is_reused_last() {
        let mut ipam = Ipam::new(net("10.88.3.0/29")).unwrap();
        let a = ipam.allocate("a").unwrap();
        ipam.allocate("b").unwrap();
        assert_eq!(ipam.release("a"), Some(a));
        assert_eq!(ipam.release("a"), None);
        let c = ipam.allocate("c").unwrap();
        assert_ne!(c, a, "the next address, not the one just freed");
        for p in ["d", "e"] {
            ipam.allocate(p).unwrap();
        }
        assert_eq!(
            ipam.allocate("f").unwrap(),
            a,
            "reused once the rest are taken"
        );
    }

    #[test]
    fn restart_restores_records_and_refuses_ones_that_do_not_fit() {
        let mut ipam = Ipam::new(net("10.88.3.0/24")).unwrap();
        ipam.restore("a", "10.88.3.7".parse().unwrap()).unwrap();
        ipam.restore("a", "10.88.3.7".parse().unwrap()).unwrap();
        assert!(matches!(
            ipam.restore("b", "10.88.3.7".parse().unwrap()),
            Err(IpamError::Duplicate { holder, .. }) if holder == "a"
        ));
        for bad in ["10.88.4.2", "10.88.3.1", "10.88.3.0", "10.88.3.255"] {
            assert!(
                matches!(
                    ipam.restore("c", bad.parse().unwrap()),
                    Err(IpamError::OutsideBlock { .. })
                ),
                "{bad}"
            );
        }
        assert_eq!(ipam.allocate("d").unwrap().to_string(), "10.88.3.8");
        assert_eq!(ipam.get("a").unwrap().to_string(), "10.88.3.7");
    }

    #[test]
    fn tiny_blocks_are_refused() {
        assert!(Ipam::new(net("10.0.0.0/31")).is_err());
        assert!(matches!(
            Ipam::new(net("0.0.0.0/0")),
            Err(IpamError::BlockTooLarge { .. })
        ));
        assert_eq!(Ipam::new(net("10.0.0.0/30")).unwrap().capacity(), 1);
    }

    proptest! {
        /// Any sequence of allocations and releases: no address is held twice, every held
        /// address is a pod address of the block, and a pod's address is stable.
        #[test]
        fn addresses_are_unique_and_in_block(ops in proptest::collection::vec((any::<bool>(), 0u8..40), 0..300)) {
            let block = net("10.88.7.0/27");
            let mut ipam = Ipam::new(block).unwrap();
            let mut held: BTreeMap<String, Ipv4Addr> = BTreeMap::new();
            for (alloc, pod) in ops {
                let uid = format!("pod{pod}");
                if alloc {
                    match ipam.allocate(&uid) {
                        Ok(ip) => {
                            if let Some(prev) = held.get(&uid) { prop_assert_eq!(*prev, ip); }
                            prop_assert!(block.contains(&ip) && ip != ipam.gateway());
                            prop_assert!(ip != block.network() && ip != block.broadcast());
                            prop_assert!(!held.iter().any(|(u, i)| *i == ip && *u != uid));
                            held.insert(uid, ip);
                        }
                        Err(IpamError::Exhausted { .. }) => prop_assert_eq!(held.len() as u32, ipam.capacity()),
                        Err(e) => prop_assert!(false, "{e}"),
                    }
                } else {
                    prop_assert_eq!(ipam.release(&uid), held.remove(&uid));
                }
            }
        }
    }
}
