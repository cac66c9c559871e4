//! `shoal-chaos`: benchmarks and (later) the network-namespace chaos lab, driving real `shoal`
//! agent processes through `shoal_agent::testkit`.
