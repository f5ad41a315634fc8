//! `paris-probe-rknot`: the seed report's name for `paris-probe` (the probe of a .knot file).
//! The same program, not a copy: this target compiles `src/main.rs` as a module and runs it.

#[path = "../main.rs"]
mod paris_probe_main;

fn main() -> std::process::ExitCode {
    paris_probe_main::main()
}
