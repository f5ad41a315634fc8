//! `gnosis-foil-control`: the seed report's name for `foil-control` (the residue collector).
//! The same program, not a copy: this target compiles `src/main.rs` as a module and runs it.

#[path = "../main.rs"]
mod foil_control_main;

fn main() -> std::process::ExitCode {
    foil_control_main::main()
}
