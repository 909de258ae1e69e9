//! Faults and chaos: a fault-injecting proxy in front of DynamoDB, SQS and each
//! `serve` process ([`proxy`]), a DynamoDB Local on disk and a LocalStack that can be killed and
//! restarted ([`dynamodb`], [`localstack`]), a randomized workload over several `tollgate serve` processes
//! ([`workload`]) and the checker of its history ([`checker`]). `make chaos` runs them
//! (`src/bin/chaos.rs`).

pub mod checker;
pub mod dynamodb;
pub mod localstack;
pub mod proxy;
pub mod workload;

#[cfg(test)]
mod planted;
