//! moonshine: the client. Drives tokens through a chain of stations (one full station or a
//! mesh of shards), samples and streams text, renders chat templates, and serves an
//! OpenAI-compatible API (`moonshine serve`).
//!
//! Modules, bottom up: [`sampling`] (pure functions and a seeded RNG), [`textstream`]
//! (UTF-8-safe streaming with stop strings), [`chat`] (Jinja chat templates), [`lookup`] (prompt-lookup drafts), [`structured`] (token masks from a JSON schema), [`api`]
//! (the OpenAI API's requests, the field rule and the answers' shapes), [`generate`]
//! (the generation loop over [`station_wire::client::Chain`] with a station-side KV session),
//! [`target`] (which stations to drive), [`repl`] (the chat REPL), [`cli`] (the command line),
//! [`serve`] (the gateway), [`web`] (its web page).

pub mod api;
pub mod chat;
pub mod cli;
pub mod generate;
pub mod lookup;
pub mod mesh_cmd;
pub mod repl;
pub mod sampling;
pub mod serve;
pub mod structured;
pub mod target;
pub mod textstream;
pub mod tools;
pub mod up;
pub mod web;
