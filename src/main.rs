//! The `rill` binary: errors become one readable line on stderr and a non-zero exit code.

fn main() {
    if let Err(e) = rill::cli::main() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
