//! One pod on one node: its spec as the kubelet needs it ([`plan`], parsed once and checked
//! again at the node), what the runtime observes of its containers ([`observed`]), and the pod
//! worker ([`worker`]), the pure state machine that decides from both and the time what to
//! start, probe, signal and remove, and what status to publish; [`overuse`] decides when the
//! node evicts a pod whose volumes hold more than their limits. The kubelet's shell
//! (`agent/src/kubelet`) carries the actions out through the container runtime.

pub mod observed;
pub mod overuse;
pub mod plan;
pub mod worker;
