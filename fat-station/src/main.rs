fn main() -> std::process::ExitCode {
    eprintln!("fat-station: not built yet");
    std::process::ExitCode::from(2)
}
