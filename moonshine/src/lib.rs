//! The client: chains stations and generates text.
