//! The node's pod network on Linux: a bridge carrying the block's gateway address, a veth pair
//! per pod (`eth0` inside the pod), and routes to other nodes' blocks via their addresses
//! (host-gw). All through netlink.
//!
//! Names are derived from the runtime's scope (a hash of the data dir), so several agents on
//! one host each have their own bridge (`shoal<scope>`) and veths (`sv<hash of scope+uid>`),
//! and `shoal reset` finds them again.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Mutex;
use std::sync::PoisonError;

use futures_util::TryStreamExt;
use ipnet::Ipv4Net;
use rtnetlink::packet_route::address::AddressAttribute;
use rtnetlink::packet_route::link::{InfoData, InfoVeth, LinkAttribute, LinkFlags};
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteType,
};
use rtnetlink::{LinkBridge, LinkMessageBuilder, LinkUnspec, LinkVeth, RouteMessageBuilder};
use sha2::{Digest, Sha256};
use tracing::{debug, info, warn};

use crate::ipam::Ipam;
use crate::{NetError, PodNetwork, PodNetworkPlugin, PodRef, netns};

/// The route protocol number Shoal's routes carry (`ip route show proto 83`), so the agent
/// only ever changes routes it made.
pub const ROUTE_PROTOCOL: u8 = 83;

const ENODEV: i32 = 19;
const EEXIST: i32 = 17;
const ESRCH: i32 = 3;
const EADDRNOTAVAIL: i32 = 99;

fn nl(op: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> NetError {
    let op = op.into();
    move |e| NetError::Netlink {
        op,
        message: e.to_string(),
    }
}

/// The errno of a netlink error reply.
fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => m.code.map(|c| -c.get()),
        _ => None,
    }
}

/// A link's index and MTU, if it exists.
pub(crate) async fn find_link(
    handle: &rtnetlink::Handle,
    name: &str,
) -> Result<Option<(u32, u32)>, NetError> {
    let mut links = handle.link().get().match_name(name.to_owned()).execute();
    match links.try_next().await {
        Ok(Some(link)) => {
            let mtu = link
                .attributes
                .iter()
                .find_map(|a| match a {
                    LinkAttribute::Mtu(m) => Some(*m),
                    _ => None,
                })
                .unwrap_or(1500);
            Ok(Some((link.header.index, mtu)))
        }
        Ok(None) => Ok(None),
        Err(e) if errno(&e) == Some(ENODEV) => Ok(None),
        Err(e) => Err(nl(format!("get link {name}"))(e)),
    }
}

/// Sets link `name` up.
pub(crate) async fn set_up(handle: &rtnetlink::Handle, name: &str) -> Result<(), NetError> {
    let (index, _) = find_link(handle, name)
        .await?
        .ok_or_else(|| NetError::Netlink {
            op: format!("set {name} up"),
            message: "no such link".into(),
        })?;
    handle
        .link()
        .set(LinkUnspec::new_with_index(index).up().build())
        .execute()
        .await
        .map_err(nl(format!("set {name} up")))
}

/// Makes `addr/prefix` the only IPv4 address of link `index`.
async fn set_only_address(
    handle: &rtnetlink::Handle,
    index: u32,
    addr: Ipv4Addr,
    prefix: u8,
) -> Result<(), NetError> {
    let mut have = false;
    let existing: Vec<_> = handle
        .address()
        .get()
        .set_link_index_filter(index)
        .execute()
        .try_collect()
        .await
        .map_err(nl("list addresses"))?;
    for message in existing {
        let ip = message.attributes.iter().find_map(|a| match a {
            AddressAttribute::Address(IpAddr::V4(ip)) => Some(*ip),
            _ => None,
        });
        let Some(ip) = ip else { continue };
        if ip == addr && message.header.prefix_len == prefix {
            have = true;
        } else {
            match handle.address().del(message).execute().await {
                Err(e) if errno(&e) == Some(EADDRNOTAVAIL) => {}
                other => other.map_err(nl(format!("remove address {ip}")))?,
            }
        }
    }
    if !have {
        handle
            .address()
            .add(index, IpAddr::V4(addr), prefix)
            .execute()
            .await
            .map_err(nl(format!("add address {addr}/{prefix}")))?;
    }
    Ok(())
}

/// The MTU pods get: the uplink's (the link holding the node's address), 1500 when there is
/// none or it is loopback.
async fn uplink_mtu(handle: &rtnetlink::Handle, uplink: Option<Ipv4Addr>) -> u32 {
    let Some(uplink) = uplink.filter(|ip| !ip.is_loopback() && !ip.is_unspecified()) else {
        return 1500;
    };
    let addresses: Vec<_> = match handle.address().get().execute().try_collect().await {
        Ok(a) => a,
        Err(_) => return 1500,
    };
    let index = addresses.iter().find_map(|m| {
        m.attributes
            .iter()
            .any(|a| matches!(a, AddressAttribute::Address(IpAddr::V4(ip)) if *ip == uplink))
            .then_some(m.header.index)
    });
    let Some(index) = index else { return 1500 };
    let mut links = handle.link().get().match_index(index).execute();
    match links.try_next().await {
        Ok(Some(link)) => link
            .attributes
            .iter()
            .find_map(|a| match a {
                LinkAttribute::Mtu(m) => Some(*m),
                _ => None,
            })
            .filter(|m| *m >= 576 && *m <= 9000)
            .unwrap_or(1500),
        _ => 1500,
    }
}

/// Every IPv4 route of the namespace (Shoal's are picked out with [`route_of`]).
async fn ipv4_routes(h: &rtnetlink::Handle) -> Result<Vec<RouteMessage>, NetError> {
    h.route()
        .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
        .execute()
        .try_collect()
        .await
        .map_err(nl("list routes"))
}

/// Removes link `name` if it exists.
async fn delete_link(h: &rtnetlink::Handle, name: &str) -> Result<(), NetError> {
    if let Some((index, _)) = find_link(h, name).await? {
        match h.link().del(index).execute().await {
            Err(e) if errno(&e) == Some(ENODEV) => {}
            other => other.map_err(nl(format!("remove {name}")))?,
        }
    }
    Ok(())
}

/// One route Shoal keeps: `block` via `gateway`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Route {
    pub block: Ipv4Net,
    pub via: Ipv4Addr,
}

fn route_of(message: &RouteMessage) -> Option<Route> {
    if message.header.protocol != RouteProtocol::Other(ROUTE_PROTOCOL) {
        return None;
    }
    let dst = message.attributes.iter().find_map(|a| match a {
        RouteAttribute::Destination(RouteAddress::Inet(ip)) => Some(*ip),
        _ => None,
    })?;
    let via = message.attributes.iter().find_map(|a| match a {
        RouteAttribute::Gateway(RouteAddress::Inet(ip)) => Some(*ip),
        _ => None,
    })?;
    Some(Route {
        block: Ipv4Net::new(dst, message.header.destination_prefix_length).ok()?,
        via,
    })
}

/// The bridge-and-veth pod network of one agent.
#[derive(Debug)]
pub struct BridgeNetwork {
    scope: String,
    bridge: String,
    /// The node's own address (its uplink's MTU is the pods').
    uplink: Option<Ipv4Addr>,
    /// The allocator of the block this node holds; `None` until it holds one.
    ipam: Mutex<Option<Ipam>>,
    mtu: Mutex<u32>,
}

impl BridgeNetwork {
    pub fn new(scope: &str, uplink: Option<Ipv4Addr>) -> Self {
        Self {
            scope: scope.to_owned(),
            bridge: format!("shoal{scope}"),
            uplink,
            ipam: Mutex::new(None),
            mtu: Mutex::new(1500),
        }
    }

    pub fn bridge_name(&self) -> &str {
        &self.bridge
    }

    /// The host-side name of a pod's veth: 15 bytes at most (IFNAMSIZ).
    pub fn host_veth(&self, uid: &str) -> String {
        let mut hash = Sha256::new();
        hash.update(self.scope.as_bytes());
        hash.update([0]);
        hash.update(uid.as_bytes());
        format!("sv{}", &hex::encode(hash.finalize())[..12])
    }

    /// The bridge's address (where the node's DNS server listens for its pods), once the node
    /// holds a block.
    pub fn gateway(&self) -> Option<Ipv4Addr> {
        self.ipam
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(Ipam::gateway)
    }

    /// The block this node's pods are numbered from, if it holds one.
    pub fn block(&self) -> Option<Ipv4Net> {
        self.ipam
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(Ipam::block)
    }

    /// Installs `block`: the bridge (made if missing) carries its gateway as its only address,
    /// IPv4 forwarding is on, and the allocator is rebuilt from the pods that already have an
    /// address (`existing`, read back from their records). Returns the pods whose address does
    /// not fit (another block, a duplicate): they must be renumbered.
    pub fn set_block(
        &self,
        block: Ipv4Net,
        existing: &[(String, Ipv4Addr)],
    ) -> Result<Vec<String>, NetError> {
        let mut ipam = Ipam::new(block)?;
        let mut misfits = Vec::new();
        for (uid, ip) in existing {
            if let Err(e) = ipam.restore(uid, *ip) {
                warn!(pod = %uid, error = %e, "pod address does not fit this node's block; the pod is renumbered");
                misfits.push(uid.clone());
            }
        }
        let gateway = ipam.gateway();
        let bridge = self.bridge.clone();
        let uplink = self.uplink;
        let mtu = netns::run_here(|h| async move {
            let mtu = uplink_mtu(&h, uplink).await;
            let index = match find_link(&h, &bridge).await? {
                Some((index, _)) => index,
                None => {
                    match h
                        .link()
                        .add(LinkBridge::new(&bridge).mtu(mtu).build())
                        .execute()
                        .await
                    {
                        Err(e) if errno(&e) == Some(EEXIST) => {}
                        other => other.map_err(nl(format!("create bridge {bridge}")))?,
                    }
                    find_link(&h, &bridge)
                        .await?
                        .ok_or_else(|| NetError::Netlink {
                            op: format!("create bridge {bridge}"),
                            message: "not found after creation".into(),
                        })?
                        .0
                }
            };
            set_only_address(&h, index, gateway, block.prefix_len()).await?;
            set_up(&h, &bridge).await?;
            Ok(mtu)
        })?;
        std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").map_err(|source| NetError::Io {
            op: "enable forwarding",
            path: "/proc/sys/net/ipv4/ip_forward".into(),
            source,
        })?;
        *self.mtu.lock().unwrap_or_else(PoisonError::into_inner) = mtu;
        *self.ipam.lock().unwrap_or_else(PoisonError::into_inner) = Some(ipam);
        info!(%block, bridge = %self.bridge, %gateway, mtu, "pod network ready");
        Ok(misfits)
    }

    /// Makes Shoal's routes (those with [`ROUTE_PROTOCOL`]) exactly `routes`: missing ones are
    /// added, changed ones replaced, others removed. A route whose gateway is unreachable is
    /// reported and skipped; the rest still apply.
    pub fn sync_routes(&self, routes: &[Route]) -> Result<(), NetError> {
        let want: BTreeSet<Route> = routes.iter().copied().collect();
        netns::run_here(|h| async move {
            let dump = ipv4_routes(&h).await?;
            let mut have = BTreeSet::new();
            for message in dump {
                let Some(route) = route_of(&message) else {
                    continue;
                };
                if want.contains(&route) {
                    have.insert(route);
                    continue;
                }
                match h.route().del(message).execute().await {
                    Err(e) if errno(&e) == Some(ESRCH) => {}
                    other => other.map_err(nl(format!("remove route {}", route.block)))?,
                }
                debug!(block = %route.block, via = %route.via, "route removed");
            }
            for route in want.difference(&have) {
                let message = RouteMessageBuilder::<Ipv4Addr>::new()
                    .destination_prefix(route.block.network(), route.block.prefix_len())
                    .gateway(route.via)
                    .protocol(RouteProtocol::Other(ROUTE_PROTOCOL))
                    .kind(RouteType::Unicast)
                    .build();
                match h.route().add(message).replace().execute().await {
                    Ok(()) => {
                        debug!(block = %route.block, via = %route.via, "route added");
                    }
                    Err(e) => {
                        warn!(block = %route.block, via = %route.via, error = %e, "cannot route to the node's pods");
                    }
                }
            }
            Ok(())
        })
    }

    /// Removes everything this agent made on the host: its bridge and Shoal's routes to blocks
    /// of `cluster` (to any block when `None`). Pods' veths go with their pods.
    pub fn cleanup(&self, cluster: Option<Ipv4Net>) -> Result<(), NetError> {
        let bridge = self.bridge.clone();
        netns::run_here(|h| async move {
            delete_link(&h, &bridge).await?;
            let dump = ipv4_routes(&h).await?;
            for message in dump {
                if route_of(&message).is_some_and(|r| cluster.is_none_or(|c| c.contains(&r.block)))
                {
                    let _ = h.route().del(message).execute().await;
                }
            }
            Ok(())
        })?;
        *self.ipam.lock().unwrap_or_else(PoisonError::into_inner) = None;
        Ok(())
    }

    /// Removes a pod's host-side veth if it is there.
    fn delete_veth(&self, uid: &str) -> Result<(), NetError> {
        let name = self.host_veth(uid);
        netns::run_here(|h| async move { delete_link(&h, &name).await })
    }
}

impl PodNetworkPlugin for BridgeNetwork {
    fn setup(&self, pod: &PodRef) -> Result<Option<PodNetwork>, NetError> {
        let (ip, prefix_len, gateway) = {
            let mut guard = self.ipam.lock().unwrap_or_else(PoisonError::into_inner);
            let ipam = guard.as_mut().ok_or(NetError::NoBlock)?;
            let ip = ipam.allocate(&pod.uid)?;
            (ip, ipam.block().prefix_len(), ipam.gateway())
        };
        let mtu = *self.mtu.lock().unwrap_or_else(PoisonError::into_inner);
        let network = PodNetwork {
            ip,
            prefix_len,
            gateway,
            mtu,
        };
        let result = self.wire(pod, &network);
        if let Err(err) = result {
            if let Some(ipam) = self
                .ipam
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .as_mut()
            {
                ipam.release(&pod.uid);
            }
            let _ = self.delete_veth(&pod.uid);
            return Err(err);
        }
        Ok(Some(network))
    }

    fn node_dns(&self) -> Option<std::net::Ipv4Addr> {
        self.ipam
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|ipam| ipam.gateway())
    }

    fn is_current(&self, network: &PodNetwork) -> bool {
        self.block()
            .is_none_or(|b| b.contains(&network.ip) && b.prefix_len() == network.prefix_len)
    }

    fn teardown(&self, pod: &PodRef) -> Result<(), NetError> {
        self.delete_veth(&pod.uid)?;
        if let Some(ipam) = self
            .ipam
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_mut()
        {
            ipam.release(&pod.uid);
        }
        Ok(())
    }
}

impl BridgeNetwork {
    /// The veth pair (host end on the bridge, `eth0` in the pod) and the pod's address and
    /// default route. A half-made pair from an earlier attempt is replaced.
    fn wire(&self, pod: &PodRef, network: &PodNetwork) -> Result<(), NetError> {
        let host = self.host_veth(&pod.uid);
        let bridge = self.bridge.clone();
        let netns_file = std::fs::File::open(&pod.netns).map_err(|source| NetError::Io {
            op: "open",
            path: pod.netns.clone(),
            source,
        })?;
        let mtu = network.mtu;
        netns::run_here(|h| async move {
            if let Some((index, _)) = find_link(&h, &host).await? {
                let _ = h.link().del(index).execute().await;
            }
            let (bridge_index, _) =
                find_link(&h, &bridge)
                    .await?
                    .ok_or_else(|| NetError::Netlink {
                        op: format!("attach {host}"),
                        message: format!("bridge {bridge} is missing"),
                    })?;
            use std::os::fd::AsRawFd;
            let peer = LinkMessageBuilder::<LinkUnspec>::new()
                .name("eth0".to_owned())
                .mtu(mtu)
                .setns_by_fd(netns_file.as_raw_fd())
                .build();
            let veth = LinkVeth::new(&host, "eth0")
                .set_info_data(InfoData::Veth(InfoVeth::Peer(peer)))
                .mtu(mtu)
                .build();
            h.link()
                .add(veth)
                .execute()
                .await
                .map_err(nl(format!("create veth {host}")))?;
            let (index, _) = find_link(&h, &host)
                .await?
                .ok_or_else(|| NetError::Netlink {
                    op: format!("create veth {host}"),
                    message: "not found after creation".into(),
                })?;
            h.link()
                .set(
                    LinkUnspec::new_with_index(index)
                        .controller(bridge_index)
                        .up()
                        .build(),
                )
                .execute()
                .await
                .map_err(nl(format!("attach {host} to {bridge}")))?;
            // Hairpin: a pod reaching itself through a ClusterIP gets its packet back out of
            // the port it came in on.
            h.link()
                .set_port(rtnetlink::LinkBridgePort::new(index).hairpin(true).build())
                .execute()
                .await
                .map_err(nl(format!("hairpin mode on {host}")))?;
            Ok(())
        })?;
        let PodNetwork {
            ip,
            prefix_len,
            gateway,
            ..
        } = *network;
        netns::run_in(&pod.netns, |h| async move {
            let (index, _) = find_link(&h, "eth0")
                .await?
                .ok_or_else(|| NetError::Netlink {
                    op: "configure eth0".into(),
                    message: "eth0 did not arrive in the pod".into(),
                })?;
            set_only_address(&h, index, ip, prefix_len).await?;
            h.link()
                .set(LinkUnspec::new_with_index(index).up().build())
                .execute()
                .await
                .map_err(nl("set eth0 up"))?;
            set_up(&h, "lo").await?;
            let default = RouteMessageBuilder::<Ipv4Addr>::new()
                .gateway(gateway)
                .output_interface(index)
                .build();
            match h.route().add(default).replace().execute().await {
                Err(e) if errno(&e) == Some(EEXIST) => {}
                other => other.map_err(nl(format!("default route via {gateway}")))?,
            }
            Ok(())
        })
    }
}

/// Whether a link flag set says the link is up (used by tests and `shoal reset`).
pub fn is_up(flags: LinkFlags) -> bool {
    flags.contains(LinkFlags::Up)
}

/// Sets `route_localnet` on `bridge` (its sysctl in this network namespace): whether packets
/// to or from 127.0.0.0/8 may be routed through it — what a loopback host port needs (the
/// table's guard chain keeps pods from using it, [`crate::nft::ruleset`]). A bridge not made
/// yet needs nothing.
pub fn set_route_localnet(bridge: &str, on: bool) -> Result<(), NetError> {
    if bridge.is_empty() || bridge.contains('/') || bridge.starts_with('.') {
        return Err(NetError::Netlink {
            op: "route_localnet".into(),
            message: format!("not an interface name: {bridge:?}"),
        });
    }
    let path = std::path::Path::new("/proc/sys/net/ipv4/conf")
        .join(bridge)
        .join("route_localnet");
    match std::fs::write(&path, if on { "1" } else { "0" }) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        r => r.map_err(|source| NetError::Io {
            op: "write",
            path,
            source,
        }),
    }
}
