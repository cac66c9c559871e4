//! Chaos tests: real agents in network namespaces (root), networks broken and healed for real.

mod fencing;
mod network;
mod partition;
