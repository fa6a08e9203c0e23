//! The `lingtab` command-line tool (native only).

#[cfg(not(target_arch = "wasm32"))]
fn main() {
    lingtab::cli::main();
}

#[cfg(target_arch = "wasm32")]
fn main() {}
