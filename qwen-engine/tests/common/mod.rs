//! Shared by the integration tests (CPU and GPU): the oracle fixtures and a minimal runner driver.
#![allow(dead_code)]

pub mod driver;
pub mod fixtures;
