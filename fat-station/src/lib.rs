//! fat-station: the inference engine and the HTTP station that serves it.

pub mod engine;
