//! The `rill` binary: errors become one readable line on stderr and a non-zero exit code.

#[cfg(not(target_arch = "wasm32"))]
fn main() {
    if let Err(e) = rill::cli::main() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// The browser build is a library (web/build.sh); there is no command line to run.
#[cfg(target_arch = "wasm32")]
fn main() {}
