//! Compiles the small C glue that configures mimalloc through its own header (option names
//! are an enum whose numbering changes between mimalloc versions, so they are not repeated
//! in Rust).

fn main() {
    let include = std::env::var("DEP_MIMALLOC_INCLUDE_DIR")
        .expect("libmimalloc-sys exports its include directory");
    println!("cargo:rerun-if-changed=src/preload/mi_setup.c");
    cc::Build::new()
        .file("src/preload/mi_setup.c")
        .include(include)
        .flag_if_supported("-fvisibility=hidden")
        .compile("farmem_mi_setup");
}
