//! Which block of the cluster CIDR a node holds.
//!
//! The cluster CIDR (`--cluster-cidr`) is cut into blocks of `--node-cidr-size`; a node holds
//! one, leased through desired state as a `PodCIDRBlock` object named after the block *and* the
//! node (`10-88-3-0-24.<node id>`, like Calico's block affinities). Two nodes that claimed one
//! block (on the two sides of a partition, or a newcomer before its store caught up) wrote two
//! objects, and both survive the merge; every agent then agrees on the winner — the lease
//! created first (creation time, then node id) — so the node that has held a block longest
//! keeps it. The other one releases its claim, leases another block and renumbers its pods.
//!
//! Pure: the agent passes the leases it reads and the holders it may take blocks from.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;
use sha2::{Digest, Sha256};

/// One stored lease: node `holder` (its node id) claimed `block` at `created` (the object's
/// creationTimestamp, RFC 3339 — ordered as text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub block: Ipv4Net,
    pub holder: String,
    pub created: String,
}

/// `10.88.3.0/24` → `10-88-3-0-24` (a DNS label).
pub fn block_name(block: Ipv4Net) -> String {
    let [a, b, c, d] = block.network().octets();
    format!("{a}-{b}-{c}-{d}-{}", block.prefix_len())
}

/// The block a name's first label stands for.
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

/// The name of `holder`'s lease of `block`: `10-88-3-0-24.<holder>`.
pub fn lease_name(block: Ipv4Net, holder: &str) -> String {
    format!("{}.{holder}", block_name(block))
}

/// The block and holder a lease object's name stands for (the holder: a lowercase hex node id).
pub fn parse_lease_name(name: &str) -> Option<(Ipv4Net, &str)> {
    let (block, holder) = name.split_once('.')?;
    let valid_holder = !holder.is_empty()
        && holder.len() <= 64
        && holder
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    valid_holder.then_some(())?;
    Some((parse_block_name(block)?, holder))
}

/// For each leased block, the lease that holds it: the one created first (then the lowest
/// node id), the same on every agent.
pub fn winners(leases: &[Lease]) -> BTreeMap<Ipv4Net, &Lease> {
    let mut out: BTreeMap<Ipv4Net, &Lease> = BTreeMap::new();
    for lease in leases {
        let entry = out.entry(lease.block).or_insert(lease);
        if (&lease.created, &lease.holder) < (&entry.created, &entry.holder) {
            *entry = lease;
        }
    }
    out
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error(
        "--node-cidr-size /{node} must be at least as long as --cluster-cidr {cluster}'s /{}, and between /8 and /30",
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

/// What a node should do about its block. `release` names this node's other leases (extra
/// ones, or claims another node won): their objects should be deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// It holds `block`.
    Hold {
        block: Ipv4Net,
        release: Vec<Ipv4Net>,
    },
    /// It holds none: claim `block`, which is free or (with `replacing`) held by a node that
    /// may be replaced (whose lease must be deleted first).
    Claim {
        block: Ipv4Net,
        replacing: Option<String>,
        release: Vec<Ipv4Net>,
    },
    /// Every block is held by a node that may not be replaced.
    Exhausted { blocks: u64, release: Vec<Ipv4Net> },
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
        if node_prefix < cluster.prefix_len() || !(8..=30).contains(&node_prefix) {
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
        let leases: Vec<Lease> = leases
            .iter()
            .filter(|l| self.has_block(l.block))
            .cloned()
            .collect();
        let winners = winners(&leases);
        let mut mine: Vec<Ipv4Net> = leases
            .iter()
            .filter(|l| l.holder == me)
            .map(|l| l.block)
            .collect();
        mine.sort();
        mine.dedup();
        let won = mine
            .iter()
            .copied()
            .find(|b| winners.get(b).is_some_and(|w| w.holder == me));
        if let Some(block) = won {
            return Decision::Hold {
                block,
                release: mine.into_iter().filter(|b| *b != block).collect(),
            };
        }
        let release = mine;
        let best_free = self
            .blocks()
            .filter(|b| !winners.contains_key(b))
            .max_by_key(|b| Self::score(me, *b));
        if let Some(block) = best_free {
            return Decision::Claim {
                block,
                replacing: None,
                release,
            };
        }
        match winners
            .iter()
            .filter(|(_, w)| w.holder != me && replaceable(&w.holder))
            .max_by_key(|(b, _)| Self::score(me, **b))
        {
            Some((block, w)) => Decision::Claim {
                block: *block,
                replacing: Some(w.holder.clone()),
                release,
            },
            None => Decision::Exhausted {
                blocks: self.block_count(),
                release,
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

    fn lease(block: &str, holder: &str, created: &str) -> Lease {
        Lease {
            block: net(block),
            holder: holder.into(),
            created: created.into(),
        }
    }

    const T1: &str = "2026-01-01T00:00:01Z";
    const T2: &str = "2026-01-01T00:00:02Z";

    #[test]
    fn names_round_trip_and_odd_names_are_refused() {
        assert_eq!(block_name(net("10.88.3.0/24")), "10-88-3-0-24");
        assert_eq!(parse_block_name("10-88-3-0-24"), Some(net("10.88.3.0/24")));
        assert_eq!(lease_name(net("10.88.3.0/24"), "ab12"), "10-88-3-0-24.ab12");
        assert_eq!(
            parse_lease_name("10-88-3-0-24.ab12"),
            Some((net("10.88.3.0/24"), "ab12"))
        );
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
        for bad in [
            "10-88-3-0-24",
            "10-88-3-0-24.",
            "10-88-3-0-24.AB",
            "10-88-3-0-24.a.b",
            "x.ab",
        ] {
            assert_eq!(parse_lease_name(bad), None, "{bad}");
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
            Pool::new(net("0.0.0.0/0"), 0),
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
            lease("10.88.9.0/24", "a", T1),
            lease("10.88.2.0/24", "a", T1),
            lease("10.88.3.0/24", "b", T1),
            lease("10.99.0.0/24", "a", T1),
        ];
        assert_eq!(
            pool.decide("a", &leases, &|_| false),
            Decision::Hold {
                block: net("10.88.2.0/24"),
                release: vec![net("10.88.9.0/24")]
            }
        );
    }

    #[test]
    fn the_first_claim_of_a_block_wins_and_the_other_claims_anew() {
        let pool = Pool::new(net("10.88.0.0/16"), 24).unwrap();
        let leases = [
            lease("10.88.3.0/24", "b", T2),
            lease("10.88.3.0/24", "a", T1),
        ];
        assert_eq!(
            pool.decide("a", &leases, &|_| false),
            Decision::Hold {
                block: net("10.88.3.0/24"),
                release: vec![]
            },
            "the holder since T1 keeps it"
        );
        let Decision::Claim {
            block,
            replacing: None,
            release,
        } = pool.decide("b", &leases, &|_| false)
        else {
            panic!("b claims another block")
        };
        assert_ne!(block, net("10.88.3.0/24"));
        assert_eq!(
            release,
            vec![net("10.88.3.0/24")],
            "and deletes its losing claim"
        );
        let tie = [
            lease("10.88.3.0/24", "b", T1),
            lease("10.88.3.0/24", "a", T1),
        ];
        assert_eq!(
            winners(&tie)[&net("10.88.3.0/24")].holder,
            "a",
            "ties: lowest node id"
        );
    }

    #[test]
    fn a_new_node_claims_a_free_block_and_nodes_start_apart() {
        let pool = Pool::new(net("10.88.0.0/16"), 24).unwrap();
        let leases = [lease("10.88.3.0/24", "b", T1)];
        let Decision::Claim {
            block,
            replacing: None,
            ..
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
        let leases = [
            lease("10.88.0.0/24", "b", T1),
            lease("10.88.1.0/24", "c", T1),
        ];
        assert_eq!(
            pool.decide("a", &leases, &|_| false),
            Decision::Exhausted {
                blocks: 2,
                release: vec![]
            }
        );
        assert_eq!(
            pool.decide("a", &leases, &|h| h == "c"),
            Decision::Claim {
                block: net("10.88.1.0/24"),
                replacing: Some("c".into()),
                release: vec![]
            }
        );
    }
}
