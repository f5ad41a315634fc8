fn main() -> std::process::ExitCode {
    eprintln!("foil-control: not built yet");
    std::process::ExitCode::from(2)
}
