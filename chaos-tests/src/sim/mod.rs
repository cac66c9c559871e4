//! Simulators: many nodes in one deterministic process, driving the product's own decision
//! cores (`shoal_core`) with a simulated transport and clock. A property a simulation checks is
//! a property of the code that ships.
//!
//! - [`scheduler`]: the distributed auction over a simulated network (tests, and the
//!   1,000-node `scheduling-bench`).
//! - [`partition`]: the workload controllers on both sides of a partition, over real stores,
//!   then the heal (tests only).
//! - [`runtime`]: a simulated container runtime behind the product's `ContainerRuntime` trait,
//!   on which the kubelet's start path is tested.

#[cfg(test)]
mod partition;
pub mod runtime;
pub mod scheduler;

#[cfg(test)]
mod scheduler_tests;
