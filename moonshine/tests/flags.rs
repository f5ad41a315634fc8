//! llama-server's flag spellings on `moonshine serve` (`--host`/`--port`, `-np/--parallel`,
//! `--alias`), read as the gateway's own flags; the top-level `-c` stays the prompt.

use moonshine::cli::{Args, Cmd};

fn serve(argv: &[&str]) -> Box<moonshine::serve::ServeArgs> {
    let all = [&["moonshine", "serve"], argv].concat();
    match Args::try_parse_checked_from(all) {
        Ok(Args {
            cmd: Some(Cmd::Serve(s)),
            ..
        }) => s,
        Ok(other) => panic!("not serve: {other:?}"),
        Err(e) => panic!("{argv:?}: {e}"),
    }
}

#[test]
fn llama_server_names_mean_the_gateways_flags() {
    let s = serve(&[
        "--host", "0.0.0.0", "--port", "9001", "-np", "3", "--alias", "mine",
    ]);
    assert_eq!(s.listen_addr().to_string(), "0.0.0.0:9001");
    assert_eq!(s.max_concurrent, 3);
    assert_eq!(s.served_model_name.as_deref(), Some("mine"));
    let s = serve(&["--parallel", "5", "--port", "7000"]);
    assert_eq!(
        (s.max_concurrent, s.listen_addr().to_string()),
        (5, "127.0.0.1:7000".into())
    );
    // The gateway's own spellings are unchanged.
    let s = serve(&["--listen", "127.0.0.1:0", "--max-concurrent", "2"]);
    assert_eq!((s.max_concurrent, s.listen_addr().port()), (2, 0));
}

#[test]
fn listen_and_host_port_together_are_refused() {
    let e = Args::try_parse_checked_from([
        "moonshine",
        "serve",
        "--listen",
        "1.2.3.4:1",
        "--port",
        "2",
    ])
    .expect_err("both");
    assert!(e.to_string().contains("--port"), "{e}");
}

#[test]
fn the_top_level_c_is_still_the_prompt() {
    let a = Args::try_parse_checked_from(["moonshine", "-c", "the prompt"]).expect("parse");
    assert!(a.cmd.is_none());
    assert!(format!("{:?}", a.gen).contains("\"the prompt\""), "{a:?}");
}
