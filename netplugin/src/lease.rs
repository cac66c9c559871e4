//! Which block of the cluster CIDR a node holds.
//!
//! The cluster CIDR (`--cluster-cidr`) is cut into blocks of `--node-cidr-size`; a node holds
//! one, leased through desired state as a `PodCIDRBlock` object named after the block (like
//! Calico's IPAM blocks). One object per block means the store itself can never say that two
//! nodes hold one block: two nodes that claimed the same block on the two sides of a partition
//! wrote two incarnations of one key, and the CRDT keeps the later-created one whole
//! (`crdt-state/src/crdt.rs`). The other node then no longer holds it: [`Pool::decide`] tells it
//! to claim another, and the agent renumbers its pods.
//!
//! Pure: the agent passes the leases it reads and the holders it may take blocks from.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use sha2::{Digest, Sha256};

/// One stored lease: `block` is held by node `holder` (its node id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub block: Ipv4Net,
    pub holder: String,
}

/// The name of a block's lease object: `10.88.3.0/24` → `10-88-3-0-24` (a DNS label).
pub fn block_name(block: Ipv4Net) -> String {
    let [a, b, c, d] = block.network().octets();
    format!("{a}-{b}-{c}-{d}-{}", block.prefix_len())
}

/// The block a lease object's name stands for.
pub fn parse_block_name(name: &str) -> Option<Ipv4Net> {
    let parts: Vec<&str> = name.split('-').collect();
    let [a, b, c, d, len] = parts.as_slice() else {
        return None;
    };
    let octet = |s: &str| s.parse::<u8>().ok().filter(|o| o.to_string() == s);
    let ip = Ipv4Addr::new(octet(a)?, octet(b)?, octet(c)?, octet(d)?);
    let net = Ipv4Net::new(ip, octet(len)?).ok()?;
    (net.network() == ip && block_name(net) == name).then_some(net)
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error(
        "--node-cidr-size /{node} must be at least as long as --cluster-cidr {cluster}'s /{} and at most /30",
        .cluster.prefix_len()
    )]
    BadNodeSize { cluster: Ipv4Net, node: u8 },
    #[error("--cluster-cidr {cluster} with /{node} blocks makes {count} blocks; at most 65536")]
    TooManyBlocks {
        cluster: Ipv4Net,
        node: u8,
        count: u64,
    },
    #[error("--cluster-cidr {given} is not a network address (did you mean {}?)", .given.trunc())]
    NotNetwork { given: Ipv4Net },
}

/// What a node should do about its block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// It holds `block`; `surplus` are other blocks it also holds and should release.
    Hold {
        block: Ipv4Net,
        surplus: Vec<Ipv4Net>,
    },
    /// It holds none: claim `block`, which is free or (with `replacing`) held by a node that
    /// may be replaced.
    Claim {
        block: Ipv4Net,
        replacing: Option<String>,
    },
    /// Every block is held by a node that may not be replaced.
    Exhausted { blocks: u64 },
}

/// The cluster CIDR and its block size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool {
    cluster: Ipv4Net,
    node_prefix: u8,
}

impl Pool {
    pub fn new(cluster: Ipv4Net, node_prefix: u8) -> Result<Self, PoolError> {
        if cluster.trunc() != cluster {
            return Err(PoolError::NotNetwork { given: cluster });
        }
        if node_prefix < cluster.prefix_len() || node_prefix > 30 {
            return Err(PoolError::BadNodeSize {
                cluster,
                node: node_prefix,
            });
        }
        let count = 1u64 << (node_prefix - cluster.prefix_len());
        if count > 65_536 {
            return Err(PoolError::TooManyBlocks {
                cluster,
                node: node_prefix,
                count,
            });
        }
        Ok(Self {
            cluster,
            node_prefix,
        })
    }

    pub fn cluster(&self) -> Ipv4Net {
        self.cluster
    }

    pub fn node_prefix(&self) -> u8 {
        self.node_prefix
    }

    /// Whether `block` is one of this pool's blocks.
    pub fn has_block(&self, block: Ipv4Net) -> bool {
        block.prefix_len() == self.node_prefix
            && block.trunc() == block
            && self.cluster.contains(&block)
    }

    fn block_count(&self) -> u64 {
        1u64 << (self.node_prefix - self.cluster.prefix_len())
    }

    fn blocks(&self) -> impl Iterator<Item = Ipv4Net> + '_ {
        self.cluster
            .subnets(self.node_prefix)
            .expect("checked in Pool::new")
    }

    /// Rendezvous score of `block` for `node`: nodes start their search at different blocks,
    /// so nodes joining at once (or on two sides of a partition) rarely pick the same one.
    fn score(node: &str, block: Ipv4Net) -> [u8; 8] {
        let mut hash = Sha256::new();
        hash.update(node.as_bytes());
        hash.update([0]);
        hash.update(block.network().octets());
        hash.update([block.prefix_len()]);
        hash.finalize()[..8].try_into().expect("8 bytes")
    }

    /// Decides, from the stored leases, which block node `me` holds or should claim.
    /// `replaceable(holder)` says whether a block held by `holder` may be taken (the agent
    /// answers from membership: a node gone for longer than the lease grace). Leases of blocks
    /// outside the pool are ignored.
    pub fn decide(
        &self,
        me: &str,
        leases: &[Lease],
        replaceable: &dyn Fn(&str) -> bool,
    ) -> Decision {
        let mut mine: Vec<Ipv4Net> = leases
            .iter()
            .filter(|l| l.holder == me && self.has_block(l.block))
            .map(|l| l.block)
            .collect();
        mine.sort();
        mine.dedup();
        if let Some((&block, surplus)) = mine.split_first() {
            return Decision::Hold {
                block,
                surplus: surplus.to_vec(),
            };
        }
        let held: std::collections::BTreeMap<Ipv4Net, &str> = leases
            .iter()
            .filter(|l| self.has_block(l.block))
            .map(|l| (l.block, l.holder.as_str()))
            .collect();
        let best_free = self
            .blocks()
            .filter(|b| !held.contains_key(b))
            .max_by_key(|b| Self::score(me, *b));
        if let Some(block) = best_free {
            return Decision::Claim {
                block,
                replacing: None,
            };
        }
        match held
            .iter()
            .filter(|(_, holder)| replaceable(holder))
            .max_by_key(|(b, _)| Self::score(me, **b))
        {
            Some((block, holder)) => Decision::Claim {
                block: *block,
                replacing: Some((*holder).to_owned()),
            },
            None => Decision::Exhausted {
                blocks: self.block_count(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    fn lease(block: &str, holder: &str) -> Lease {
        Lease {
            block: net(block),
            holder: holder.into(),
        }
    }

    #[test]
    fn names_round_trip_and_odd_names_are_refused() {
        assert_eq!(block_name(net("10.88.3.0/24")), "10-88-3-0-24");
        assert_eq!(parse_block_name("10-88-3-0-24"), Some(net("10.88.3.0/24")));
        for bad in [
            "10-88-3-1-24",
            "10-88-3-0",
            "010-88-3-0-24",
            "10-88-3-0-33",
            "a-b-c-d-e",
            "10-88-3-0-24-1",
            "",
        ] {
            assert_eq!(parse_block_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn pool_flags_are_checked() {
        assert!(Pool::new(net("10.88.0.0/16"), 24).is_ok());
        assert!(matches!(
            Pool::new(net("10.88.0.1/16"), 24),
            Err(PoolError::NotNetwork { .. })
        ));
        assert!(matches!(
            Pool::new(net("10.88.0.0/16"), 15),
            Err(PoolError::BadNodeSize { .. })
        ));
        assert!(matches!(
            Pool::new(net("10.88.0.0/16"), 31),
            Err(PoolError::BadNodeSize { .. })
        ));
        assert!(matches!(
            Pool::new(net("10.0.0.0/8"), 30),
            Err(PoolError::TooManyBlocks { .. })
        ));
    }

    #[test]
    fn a_node_keeps_its_block_and_releases_extra_ones() {
        let pool = Pool::new(net("10.88.0.0/16"), 24).unwrap();
        let leases = [
            lease("10.88.9.0/24", "a"),
            lease("10.88.2.0/24", "a"),
            lease("10.88.3.0/24", "b"),
            lease("10.99.0.0/24", "a"),
        ];
        assert_eq!(
            pool.decide("a", &leases, &|_| false),
            Decision::Hold {
                block: net("10.88.2.0/24"),
                surplus: vec![net("10.88.9.0/24")]
            }
        );
    }

    #[test]
    fn a_new_node_claims_a_free_block_and_nodes_start_apart() {
        let pool = Pool::new(net("10.88.0.0/16"), 24).unwrap();
        let leases = [lease("10.88.3.0/24", "b")];
        let Decision::Claim {
            block,
            replacing: None,
        } = pool.decide("a", &leases, &|_| false)
        else {
            panic!("claims a free block")
        };
        assert!(pool.has_block(block) && block != net("10.88.3.0/24"));
        let picks: std::collections::BTreeSet<Ipv4Net> = (0..20)
            .map(
                |i| match pool.decide(&format!("node{i}"), &[], &|_| false) {
                    Decision::Claim { block, .. } => block,
                    other => panic!("{other:?}"),
                },
            )
            .collect();
        assert!(
            picks.len() >= 18,
            "rendezvous spreads first picks: {picks:?}"
        );
    }

    #[test]
    fn a_full_pool_takes_only_replaceable_blocks() {
        let pool = Pool::new(net("10.88.0.0/23"), 24).unwrap();
        let leases = [lease("10.88.0.0/24", "b"), lease("10.88.1.0/24", "c")];
        assert_eq!(
            pool.decide("a", &leases, &|_| false),
            Decision::Exhausted { blocks: 2 }
        );
        assert_eq!(
            pool.decide("a", &leases, &|h| h == "c"),
            Decision::Claim {
                block: net("10.88.1.0/24"),
                replacing: Some("c".into())
            }
        );
    }
}
